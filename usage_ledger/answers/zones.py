"""Time zones of the readers: a zone named by a user (`--tz`, `tz=`), and a stored moment shown in one.

A moment whose local time falls outside years 1 to 9999 is shown at its UTC time (docs/auditing.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from usage_ledger.projections import ProjectionError

__all__ = ("in_zone", "parse_zone")


def parse_zone(tz: str) -> ZoneInfo:
    """The IANA zone `tz`; ProjectionError (a 400 in the API, exit 2 in the CLI) for anything else."""
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:  # OSError: a name too long for a file name
        shown = tz if len(tz) <= 64 else tz[:64] + "…"
        raise ProjectionError(f"unknown time zone {shown!r}: use an IANA name such as UTC or Asia/Seoul") from exc


def in_zone(moment: datetime, zone: ZoneInfo) -> datetime:
    """`moment` in `zone`; at its UTC time when the local time falls outside years 1 to 9999."""
    try:
        return moment.astimezone(zone)
    except OverflowError:
        return moment.astimezone(UTC)
