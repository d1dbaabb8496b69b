"""Time zones of the readers: a zone named by a user (`--tz`, `tz=`), and a stored moment shown in one.

A reader never fails on a stored value: a call imported at `0001-01-01T00:00Z` or `9999-12-31T23:59Z` lies
on the edge of Python's calendar (years 1 to 9999), and its local time in a zone west or east of UTC falls
outside it (`OverflowError`). Such a moment is shown, and counted in `daily`, at its UTC time instead: only
moments within a day of the calendar's ends can be affected, and the UTC day is the nearest one that exists.
"""

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
