"""Request and response headers: X-Ledger-* tags, secret fingerprints, hop-by-hop filtering.

Headers are ASGI pairs of lower-cased `bytes`. Nothing here logs or stores a secret: a recorded
header whose name is secret (`gateway.secrets.is_secret_name`: `authorization`, `api-key`,
`x-api-key`, cookies, …) carries `hmac-sha256:<key id>:<16 hex>` (`gateway.fingerprint_key`)
in place of its value, enough to tell two keys apart, useless without the installation's key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import msgspec

from usage_ledger.gateway.errors import InvalidLedgerHeader
from usage_ledger.gateway.fingerprint_key import FingerprintKey
from usage_ledger.gateway.secrets import is_secret_name

__all__ = (
    "Header",
    "LedgerTags",
    "parse_ledger_headers",
    "recorded_headers",
    "response_headers",
)

Header = tuple[bytes, bytes]

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)

PREFIX = b"x-ledger-"
_TAG_PREFIX = b"x-ledger-tag-"
_RUN = b"x-ledger-run"
_TICKER = b"x-ledger-ticker"
MAX_HEADER_VALUE = 256
MAX_TAGS = 32
_NAME = re.compile(rb"[a-z0-9][a-z0-9_.\-]{0,63}")


class LedgerTags(msgspec.Struct, frozen=True):
    run: str | None = None
    tags: dict[str, str] = {}


_SECRET_NAMES: dict[bytes, bool] = {}
_SECRET_NAMES_MAX = 4096


def is_secret(name: bytes) -> bool:
    known = _SECRET_NAMES.get(name)
    if known is None:
        known = is_secret_name(name.decode("latin-1"))
        if len(_SECRET_NAMES) < _SECRET_NAMES_MAX:  # header names repeat; a flood of new ones is not cached
            _SECRET_NAMES[name] = known
    return known


def _value(name: bytes, raw: bytes) -> str:
    header = name.decode("latin-1")
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InvalidLedgerHeader(f"header {header} is not valid UTF-8", param=header) from None
    if not text:
        raise InvalidLedgerHeader(f"header {header} is empty; omit it or give a value", param=header)
    if len(text) > MAX_HEADER_VALUE:
        raise InvalidLedgerHeader(
            f"header {header} is {len(text)} characters long; the limit is {MAX_HEADER_VALUE}", param=header
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise InvalidLedgerHeader(f"header {header} contains control characters", param=header)
    return text


def parse_ledger_headers(headers: Iterable[Header]) -> tuple[LedgerTags, list[Header]]:
    """The call's run and tags, and the headers to forward (X-Ledger-* stripped).

    Raises `InvalidLedgerHeader` (→ 400) for a malformed value or tag name, or an unknown X-Ledger-* name.
    """
    forward: list[Header] = []
    run: str | None = None
    tags: dict[str, str] = {}
    for name, value in headers:
        if not name.startswith(PREFIX):
            forward.append((name, value))
            continue
        if name == _RUN:
            run = _value(name, value)
        elif name == _TICKER:
            tags["ticker"] = _value(name, value)
        elif name.startswith(_TAG_PREFIX):
            tag = name[len(_TAG_PREFIX) :]
            if not _NAME.fullmatch(tag):
                shown = name.decode("latin-1")
                raise InvalidLedgerHeader(
                    f"header {shown}: tag names are 1-64 characters of a-z, 0-9, '_', '.', '-'", param=shown
                )
            tags[tag.decode("ascii")] = _value(name, value)
        else:
            shown = name.decode("latin-1")
            raise InvalidLedgerHeader(
                f"unknown header {shown}: use X-Ledger-Run, X-Ledger-Ticker or X-Ledger-Tag-<name>", param=shown
            )
    if len(tags) > MAX_TAGS:
        raise InvalidLedgerHeader(f"{len(tags)} X-Ledger tags given; the limit is {MAX_TAGS}")
    return LedgerTags(run=run, tags=tags), forward


def recorded_headers(headers: Iterable[Header], key: FingerprintKey) -> list[tuple[str, str]]:
    """Headers as stored in an event: secret values replaced by their fingerprint under `key`."""
    return [
        (name.decode("latin-1"), key.fingerprint(value) if is_secret(name) else value.decode("latin-1"))
        for name, value in headers
    ]


def forward_headers(headers: Sequence[Header]) -> list[Header]:
    """Request headers for the upstream: hop-by-hop, `host`, `expect` and `content-length` removed.

    The upstream client sets host and length itself (the length changes when usage is requested).
    """
    return _end_to_end(headers, {b"host", b"expect", b"content-length"})


def response_headers(headers: Sequence[Header], *, drop: Iterable[bytes] = ()) -> list[Header]:
    """Upstream response headers for the client, minus hop-by-hop ones and `drop` (what the relay changes)."""
    return _end_to_end(headers, drop)


def _end_to_end(headers: Sequence[Header], drop: Iterable[bytes]) -> list[Header]:
    """`headers` without the hop-by-hop ones (those the `connection` header names too) and `drop`."""
    dropped = HOP_BY_HOP.union(drop)
    for name, value in headers:
        if name == b"connection":
            dropped |= {t.strip().lower() for t in value.split(b",")}
    return [(n, v) for n, v in headers if n not in dropped]
