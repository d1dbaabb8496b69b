"""Daily totals in IANA zones across DST, half-hour offsets, weekday means."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.projections.helpers import append
from usage_ledger.answers.reports import daily_report, weekday_mean
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallImported, new_event
from usage_ledger.projections.errors import ProjectionError


def _call(cid: str, start: datetime) -> object:
    body = CallImported(
        call_id=cid,
        source="t",
        line=1,
        started_at=start,
        finished_at=start + timedelta(seconds=5),
        input_tokens=10,
        output_tokens=1,
        run="r",
    )
    return new_event(body, stream=f"call-{cid}")


async def test_dst_and_half_hour_zones(database: Database) -> None:
    times = [
        datetime(2026, 3, 8, 4, 30, tzinfo=UTC),  # 23:30 EST on Mar 7
        datetime(2026, 3, 8, 7, 30, tzinfo=UTC),  # 03:30 EDT on Mar 8 (after the spring-forward gap)
        datetime(2026, 3, 9, 3, 59, tzinfo=UTC),  # 23:59 EDT on Mar 8
        datetime(2026, 3, 9, 4, 0, tzinfo=UTC),  # 00:00 EDT on Mar 9
        datetime(2026, 3, 8, 18, 20, tzinfo=UTC),  # 23:50 in Kolkata (+05:30), 18:20 UTC
        datetime(2026, 3, 8, 18, 40, tzinfo=UTC),  # 00:10 next day in Kolkata
    ]
    await append(database, *[_call(f"c{i}", t) for i, t in enumerate(times)])  # type: ignore[arg-type]
    ny = await daily_report(database, tz="America/New_York")
    assert [(d.day, d.calls) for d in ny] == [("2026-03-07", 1), ("2026-03-08", 4), ("2026-03-09", 1)]
    india = await daily_report(database, tz="Asia/Kolkata")
    assert [(d.day, d.calls) for d in india] == [("2026-03-08", 3), ("2026-03-09", 3)]
    utc = await daily_report(database, tz="UTC")
    assert [(d.day, d.calls) for d in utc] == [("2026-03-08", 4), ("2026-03-09", 2)]
    means = {w.weekday: w for w in weekday_mean(utc)}
    assert means["Sun"].calls == 4 and means["Mon"].calls == 2 and means["Mon-Fri"].days == 1


async def test_unknown_zone_is_a_clear_error(database: Database) -> None:
    with pytest.raises(ProjectionError, match="IANA"):
        await daily_report(database, tz="Mars/Olympus")
