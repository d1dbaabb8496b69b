"""Rebuilds: same digest as incremental application (property), promotion, status, formulas."""

from __future__ import annotations

import itertools
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert, select

from ledger.db import Database
from ledger.events import CallImported, CallRetagged, NewEvent, ProjectionPromoted, RunAnnotated, new_event, utc_now
from ledger.read import head_position, iter_events
from ledger.schema import checkpoints
from projections.engine import PROJECTIONS, catch_up, projection_status, rebuild_projection, set_formula
from projections.reports import recompute_report, runs_report
from tests.projections.helpers import append, at, failed, finished, started

_serial = itertools.count()


def _event(kind: str, call: int, t: float, n: int, salt: int) -> NewEvent:
    cid = f"c{salt}-{call}"
    if kind == "started":
        return started(cid, t, run=("r1", "r2", None)[n % 3], ticker=f"T{n % 4}")
    if kind == "finished":
        return finished(cid, t, t + 1 + n % 7, completion=n, prompt=n * 3)
    if kind == "failed":
        return failed(cid, t, t + 2)
    if kind == "imported":
        body = CallImported(
            call_id=cid,
            source="s",
            line=n,
            started_at=at(t),
            finished_at=at(t) + timedelta(seconds=n % 5),
            input_tokens=n,
            output_tokens=n // 2,
            run="imp" if n % 2 else None,
            tags={"ticker": f"T{n % 3}"},
        )
        return new_event(body, stream=f"call-{cid}")
    if kind == "retagged":
        body2 = CallRetagged(
            call_id=cid, reason="fix", run=f"x{n % 2}", tags={"k": str(n)}, removed_tags=["ticker"] if n % 2 else []
        )
        return new_event(body2, stream=f"call-{cid}")
    return new_event(
        RunAnnotated(labels={"hw": f"h{n}"}, run="r1" if n % 2 else None, start=at(t) if n % 2 == 0 else None),
        stream="run-x",
    )


_kinds = st.sampled_from(["started", "started", "finished", "finished", "failed", "imported", "retagged", "annotated"])
_events = st.lists(
    st.tuples(_kinds, st.integers(0, 5), st.floats(0, 5000, allow_nan=False), st.integers(0, 100)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=_events, splits=st.lists(st.integers(1, 40), max_size=4), page=st.integers(1, 7))
async def test_rebuild_digest_equals_incremental(
    database: Database, spec: list[tuple[str, int, float, int]], splits: list[int], page: int
) -> None:
    salt = next(_serial)
    batch = [_event(kind, call, t, n, salt) for kind, call, t, n in spec]
    version = 100 + 2 * salt
    async with database.engine.begin() as conn:  # both versions start where this example's events begin
        base = await head_position(conn)
        for name in PROJECTIONS:
            for v in (version, version + 1):
                await conn.execute(
                    insert(checkpoints).values(projection=name, version=v, position=base, updated_at=utc_now())
                )
    cuts = sorted({min(s, len(batch)) for s in splits} | {len(batch)})
    start = 0
    for cut in cuts:
        await append(database, *batch[start:cut])
        start = cut
        for name in PROJECTIONS:
            await catch_up(database, name, version, page_size=page)
    for name, projection in PROJECTIONS.items():
        await catch_up(database, name, version + 1)  # one pass, big pages
        async with database.engine.connect() as conn:
            assert await projection.digest(conn, version) == await projection.digest(conn, version + 1), name


async def test_rebuild_promotes_and_records(database: Database) -> None:
    await append(database, started("a", 0, run="r"), finished("a", 0, 10, completion=100))
    before = await runs_report(database)
    promoted = await rebuild_projection(database, "calls")
    assert promoted.version == 2 and promoted.formula == "batch_aggregate" and len(promoted.digest) == 64
    stored = [e.body() async for e in iter_events(database)]
    assert stored[-1] == promoted and isinstance(stored[-1], ProjectionPromoted)
    assert await runs_report(database) == before
    async with database.engine.connect() as conn:
        versions = (
            await conn.execute(select(checkpoints.c.version).where(checkpoints.c.projection == "calls"))
        ).scalars()
        assert list(versions) == [2]  # the old version was dropped after promotion
    status = {s.name: s for s in await projection_status(database)}
    assert status["calls"].live and status["calls"].version == 2 and status["calls"].digest == promoted.digest
    again = await rebuild_projection(database, "calls")
    assert again.digest == promoted.digest and again.version == 3


async def test_formula_promotion_and_recompute(database: Database) -> None:
    await append(
        database,
        started("a", 0, run="r"),
        finished("a", 0, 10, completion=100),
        started("b", 0, run="r"),
        finished("b", 0, 20, completion=100),
    )
    rows = await recompute_report(database, "per_call_mean")
    assert rows[0].old_tps == 200 / 20 and rows[0].new_tps == (10 + 5) / 2
    await set_formula(database, "per_call_mean")
    (row,) = await runs_report(database)
    assert row.formula == "per_call_mean" and row.throughput_tps == 7.5
