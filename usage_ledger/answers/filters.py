"""Which calls a report, an export or an API list covers: `--since`, `--until`, `--model`, `--status`.

One rule for the CLI and the API. Times select by call start: `since` inclusive, `until`
exclusive. A bare date is a whole local day in the zone of the command (`--tz`, else
LEDGER_TZ): `--since 2026-03-01` starts at its local midnight and `--until 2026-03-01` ends at
the next one (the day is included); a date-time without an offset is local too, one with an
offset means what it says. Runs keep the names they have without a filter (an `auto-…` run is
cut by idle gaps over all calls), and show only their selected calls.
"""

from __future__ import annotations

import zoneinfo
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import msgspec
from litestar.openapi.spec import OpenAPIFormat, OpenAPIType, Schema
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from usage_ledger.answers._aggregate import run_filter
from usage_ledger.projections import CALL_STATUSES, NotFound, ProjectionError, projection_text
from usage_ledger.projections.tables import calls

__all__ = (
    "CALL_STATUSES",
    "NO_FILTER",
    "STATUS_PATTERN",
    "WHEN_SCHEMA",
    "ZONE_NAMES",
    "CallFilter",
    "InvalidFilter",
    "calls_where",
    "filter_clauses",
    "parse_filter",
    "parse_time",
)

"""Every status the calls projection writes (`ok`, `error` = an upstream error status, `failed`, `incomplete`)."""


class InvalidFilter(ProjectionError):
    """A filter value that cannot be read (the CLI exits 2, the API answers 400 naming `parameter`)."""

    def __init__(self, parameter: str, message: str) -> None:
        self.parameter = parameter
        super().__init__(message)


class CallFilter(msgspec.Struct, frozen=True, kw_only=True):
    since: datetime | None = None
    until: datetime | None = None
    model: str | None = None
    statuses: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return bool(self.since or self.until or self.model is not None or self.statuses)


NO_FILTER = CallFilter()
_EARLIEST = datetime.min.replace(tzinfo=UTC)
_LATEST = datetime.max.replace(tzinfo=UTC)

WHEN_SCHEMA: dict[str, Any] = {
    "one_of": [
        *(Schema(type=OpenAPIType.STRING, format=f) for f in (OpenAPIFormat.DATE, OpenAPIFormat.DATE_TIME)),
        Schema(type=OpenAPIType.STRING, max_length=0),
    ]
}
"""What an API's `since` / `until` are, for its schema: an ISO date or date-time, or empty (no bound). The
schema describes the format; `parse_time` is the one rule that reads it, for the CLI and the API alike (it
also reads ISO 8601's other forms, such as `2026-03-01T09:00` without seconds or offset), and answers an
impossible value (`2026-02-30`) with a 400 naming the parameter."""
ZONE_NAMES = tuple(sorted(zoneinfo.available_timezones()))
"""Every IANA time zone this machine knows, for an API's `tz` schema (read once: it walks the tz database)."""
_ONE_STATUS = "|".join(CALL_STATUSES)
STATUS_PATTERN = f"^(({_ONE_STATUS})(,({_ONE_STATUS}))*)?$"
"""An API's `status`: empty (any), or statuses separated by commas."""


def parse_time(text: str, flag: str, zone: ZoneInfo, *, end: bool = False) -> datetime:
    """An ISO date or date-time as a UTC instant; a bare date is its local midnight (the next one if `end`)."""
    try:
        day = date.fromisoformat(text)
    except ValueError:
        day = None
    try:
        if day is not None:
            local = datetime.combine(day, time(), tzinfo=zone)
        else:
            value = datetime.fromisoformat(text)
            local = value if value.tzinfo is not None else value.replace(tzinfo=zone)
    except ValueError as exc:
        raise InvalidFilter(
            flag,
            f"{flag} {text!r} is not a date or time ({exc}): expected an ISO date or date-time, e.g. 2026-03-01, "
            f"2026-03-01T09:00 (local, {zone.key}) or 2026-03-01T09:00+09:00",
        ) from None
    try:
        return (local + timedelta(days=1) if day is not None and end else local).astimezone(UTC)
    except OverflowError:  # a real moment at the calendar's edge (0001-01-01T00:00+05:00, until 9999-12-31)
        return _EARLIEST if local.year == 1 else _LATEST


def parse_filter(
    *,
    zone: ZoneInfo,
    since: str | None = None,
    until: str | None = None,
    model: str | None = None,
    status: str | None = None,
) -> CallFilter:
    """The filter given as text (flags or query parameters); `status` may list several, comma-separated."""
    start = parse_time(since, "since", zone) if since is not None else None
    stop = parse_time(until, "until", zone, end=True) if until is not None else None
    statuses: tuple[str, ...] = ()
    if status is not None:
        statuses = tuple(dict.fromkeys(s.strip() for s in status.split(",") if s.strip()))
        unknown = [s for s in statuses if s not in CALL_STATUSES]
        if unknown or not statuses:
            raise InvalidFilter(
                "status", f"status {status!r}: use one or more of {', '.join(CALL_STATUSES)} (comma-separated)"
            )
    return CallFilter(
        since=start,
        until=stop,
        model=None if model is None else projection_text(model),  # as the rows were written
        statuses=statuses,
    )


def filter_clauses(selected: CallFilter) -> list[ColumnElement[bool]]:
    """WHERE clauses on the calls projection for `selected` (none when it selects everything)."""
    where: list[ColumnElement[bool]] = []
    if selected.since is not None:
        where.append(calls.c.started_at >= selected.since)
    if selected.until is not None:
        where.append(calls.c.started_at < selected.until)
    if selected.model is not None:
        where.append(calls.c.model == selected.model)
    if selected.statuses:
        where.append(calls.c.status.in_(selected.statuses))
    return where


async def calls_where(
    conn: AsyncConnection, version: int, run: str | None, run_gap_s: float, selected: CallFilter = NO_FILTER
) -> list[ColumnElement[bool]]:
    """WHERE clauses for the live calls `selected`, of `run` when given (NotFound when there is no such run)."""
    where = [calls.c.version == version, *filter_clauses(selected)]
    if run is not None:
        clause = await run_filter(conn, version, run, run_gap_s)
        if clause is None:
            raise NotFound(f"no run {run!r} in the ledger (see `ledger report runs`)")
        where.append(clause)
    return where
