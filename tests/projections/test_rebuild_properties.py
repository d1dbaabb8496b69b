"""Rebuilds give the digest of incremental application (properties): a rebuild in one pass of large pages
equals the fold applied in any split of small ones, on both backends."""

from __future__ import annotations

import itertools
from datetime import timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert, select

from tests.projections.helpers import append, at, failed, finished, spec_metrics, started
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import (
    CallFailed,
    CallFinished,
    CallImported,
    CallRetagged,
    CallStarted,
    NewEvent,
    RunAnnotated,
    Timings,
    Usage,
    new_event,
    utc_now,
)
from usage_ledger.ledger.read import head_position
from usage_ledger.ledger.schema import checkpoints
from usage_ledger.projections.engine import PROJECTIONS, catch_up

_serial = itertools.count()


def _request_metrics(n: int) -> dict[str, Any] | None:
    """A call's `request_metrics` by `n`: none, a block the calls read model keeps, or one it must not."""
    kept = spec_metrics(n, n // 2, n // 3)
    odd: list[Any] = [True, 3.0, -1, 10**15, "5", None]
    if n % 4 == 0:
        return None
    if n % 4 == 1:
        return kept
    if n % 4 == 2:
        return {"speculative_decoding": None} if n % 3 == 0 else {"mean_itl_ms": 1.5}
    block = dict(kept["speculative_decoding"])
    block[("num_draft_tokens", "num_accepted_draft_tokens", "num_spec_steps")[n % 3]] = odd[n % len(odd)]
    return {"speculative_decoding": block if n % 7 else [1, 2]}


def _event(kind: str, call: int, t: float, n: int, salt: int) -> NewEvent:
    cid = f"c{salt}-{call}"
    if kind == "started":
        return started(cid, t, run=("r1", "r2", None)[n % 3], ticker=f"T{n % 4}")
    if kind == "finished":
        return finished(cid, t, t + 1 + n % 7, completion=n, prompt=n * 3, request_metrics=_request_metrics(n))
    if kind == "failed":
        return failed(cid, t, t + 2)
    if kind == "started_odd":  # offsets, whole seconds, several tags, escapes, no model
        received = at(t).astimezone(timezone(timedelta(hours=2))) if n % 3 == 0 else at(float(int(t)))
        tags = {"ticker": f"T{n % 4}", 'b"q': "\u00fc\n", "a": "x"} if n % 2 else {"z": "1", "a": "2\u00e9"}
        body3 = CallStarted(
            call_id=cid,
            received_at=received,
            method="POST",
            path="/v1/chat/completions",
            tags=tags,
            model=None if n % 5 == 0 else "m",
            request_blob=f"b{n}",
        )
        return new_event(body3, stream=f"call-{cid}")
    if kind == "finished_odd":  # error statuses, no or cached usage, missing or equal moments
        t0 = at(float(int(t))) if n % 2 else at(t)
        moments = Timings(
            received=t0,
            first_token=t0 if n % 4 == 0 else None if n % 4 == 1 else t0 + timedelta(microseconds=n),
            last_token=None if n % 4 == 1 else t0 + timedelta(microseconds=n * (n % 3)),
            finished=None if n % 3 == 0 else t0 + timedelta(seconds=n / 7),
        )
        usage = (
            None if n % 3 == 0 else Usage(prompt_tokens=n % 2, completion_tokens=n % 4, total_tokens=0, cached_tokens=n)
        )
        if n % 5 == 0:
            return new_event(
                CallFailed(call_id=cid, phase="body", reason="client_disconnected", usage=usage, timings=moments),
                stream=f"call-{cid}",
            )
        status = (500, 302, 200, 404)[n % 4]
        body4 = CallFinished(
            call_id=cid,
            status=status,
            usage=usage,
            usage_source="reported" if usage else "absent",
            response_blob=f"r{n}",
            timings=moments,
            request_metrics=_request_metrics(n + 1),
        )
        return new_event(body4, stream=f"call-{cid}")
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
_times = st.floats(0, 5000, allow_nan=False)
_events = st.lists(st.tuples(_kinds, st.integers(0, 5), _times, st.integers(0, 100)), min_size=1, max_size=40)
# for the bulk load: plain calls (a start, then at most one end, `lag` events later) with every
# kind of exception mixed in at random places (repeats, retags, imports, ends before starts)
_plain_calls = st.lists(
    st.tuples(
        st.sampled_from(["started", "started", "started_odd"]),
        st.sampled_from([None, "finished", "finished_odd", "finished_odd", "failed"]),
        st.one_of(_times, st.integers(0, 5000).map(float)),
        st.integers(0, 100),
        st.integers(0, 4),
    ),
    min_size=1,
    max_size=30,
)
_extras = st.lists(
    st.tuples(_kinds | st.just("finished_odd"), st.integers(0, 35), _times, st.integers(0, 100)), max_size=10
)


def _varied_batch(
    plain: list[tuple[str, str | None, float, int, int]], extras: list[tuple[str, int, float, int]], salt: int
) -> list[NewEvent]:
    batch: list[NewEvent] = []
    ends: list[tuple[int, NewEvent]] = []
    for call, (start, end, t, n, lag) in enumerate(plain):
        batch.append(_event(start, call, t, n, salt))
        if end is not None:
            ends.append((len(batch) + lag, _event(end, call, t, n, salt)))
    for at_, ev in reversed(ends):
        batch.insert(min(at_, len(batch)), ev)
    for kind, call, t, n in extras:
        batch.insert((call * 7 + n) % (len(batch) + 1), _event(kind, call, t, n, salt))
    return batch


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
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


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plain=_plain_calls, extras=_extras, splits=st.lists(st.integers(1, 60), max_size=3), page=st.integers(1, 9))
async def test_varied_calls_rebuilt_to_a_head_digest_equal_incremental(
    database: Database,
    plain: list[tuple[str, str | None, float, int, int]],
    extras: list[tuple[str, int, float, int]],
    splits: list[int],
    page: int,
) -> None:
    """Plain calls among unusual ones, folded in one pass up to a head: the incremental rows, checkpoint = head."""
    salt = next(_serial)
    batch = _varied_batch(plain, extras, salt)
    version = 1000 + 2 * salt  # from position 0: earlier examples' events are in both versions
    async with database.engine.connect() as conn:
        base = await head_position(conn)
    for name in PROJECTIONS:  # earlier examples' events in big pages: only this example's are paged finely
        await catch_up(database, name, version, until=base)
    start = 0
    for cut in sorted({min(s, len(batch)) for s in splits} | {len(batch)}):
        await append(database, *batch[start:cut])
        start = cut
        for name in PROJECTIONS:
            await catch_up(database, name, version, page_size=page)
    async with database.engine.connect() as conn:
        head = await head_position(conn)
    for name, projection in PROJECTIONS.items():
        await catch_up(database, name, version + 1, until=head)
        async with database.engine.connect() as conn:
            assert await projection.digest(conn, version) == await projection.digest(conn, version + 1), name
            checkpoint = await conn.execute(
                select(checkpoints.c.position).where(
                    checkpoints.c.projection == name, checkpoints.c.version == version + 1
                )
            )
            assert checkpoint.scalar_one() == head
