"""Per-request fault injection: the `X-Emulator-Fault` header and `--fault` flags (docs/emulator.md, "Faults")."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

__all__ = ("FaultError", "Faults", "parse_faults")

_DEFAULT_CHUNKS = 3


class FaultError(ValueError):
    """An unparseable fault spec."""


class Faults(msgspec.Struct, frozen=True, kw_only=True):
    error_after: int | None = None
    drop_after: int | None = None
    slow_headers_s: float = 0.0
    status: int | None = None

    @property
    def cut_after(self) -> int | None:
        """The content chunks a stream sends before its mid-stream fault (None: no such fault)."""
        return min((n for n in (self.error_after, self.drop_after) if n is not None), default=None)


def _count(name: str, value: str | None) -> int:
    if value is None or value == "":
        return _DEFAULT_CHUNKS
    try:
        n = int(value)
    except ValueError:
        raise FaultError(f"{name}={value!r}: expected a number of chunks") from None
    if n < 0:
        raise FaultError(f"{name}={value!r}: must be >= 0")
    return n


def parse_faults(specs: Iterable[str]) -> Faults:
    """Parse fault specs; later items win."""
    error_after: int | None = None
    drop_after: int | None = None
    slow = 0.0
    status: int | None = None
    for spec in specs:
        for raw in spec.split(","):
            item = raw.strip()
            if not item:
                continue
            name, _, value = item.partition("=")
            name = name.strip().lower()
            value = value.strip()
            if name == "error-mid-stream":
                error_after = _count(name, value)
            elif name == "drop-mid-stream":
                drop_after = _count(name, value)
            elif name == "slow-headers":
                try:
                    slow = float(value)
                except ValueError:
                    raise FaultError(f"slow-headers={value!r}: expected seconds") from None
            elif name == "status":
                if not value.isdigit() or not 400 <= int(value) <= 599:
                    raise FaultError(f"status={value!r}: expected an HTTP error status 400-599")
                status = int(value)
            else:
                raise FaultError(
                    f"unknown fault {name!r}; use error-mid-stream[=N], drop-mid-stream[=N], "
                    "slow-headers=SECONDS or status=CODE"
                )
    return Faults(error_after=error_after, drop_after=drop_after, slow_headers_s=slow, status=status)
