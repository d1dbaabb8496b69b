"""The appenders' fast row builder computes exactly what the documented chain and column forms say."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from usage_ledger.ledger._rows import build_rows
from usage_ledger.ledger.chain import GENESIS_HASH, chain_hash
from usage_ledger.ledger.events import CallRetagged, NewEvent, RunAnnotated, encode_event, event_type
from usage_ledger.ledger.schema import sqlite_time

zones = st.sampled_from([UTC, timezone(timedelta(hours=9)), timezone(timedelta(hours=-3, minutes=-30))])
moments = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=zones)
bodies = st.one_of(
    st.builds(CallRetagged, call_id=st.text(max_size=8), reason=st.text(max_size=30)),
    st.builds(RunAnnotated, labels=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)),
)
events = st.builds(
    NewEvent,
    event_id=st.uuids(),
    stream=st.text(max_size=20),
    occurred_at=moments,
    body=bodies,
)


def reference_rows(batch: list[NewEvent], *, sqlite: bool) -> list[tuple[object, ...]]:
    """The row forms spelled out with `chain_hash` and `sqlite_time`, one event at a time."""
    rows: list[tuple[object, ...]] = []
    previous, seen = GENESIS_HASH, set()
    recorded = datetime(2026, 11, 30, 5, 0, 0, 1, tzinfo=UTC)
    for new in batch:
        if new.event_id in seen:
            continue
        seen.add(new.event_id)
        position = len(rows) + 1
        payload = encode_event(new.body).decode()
        type_ = event_type(new.body)
        occurred = new.occurred_at.astimezone(UTC)
        previous = chain_hash(previous, position, new.event_id, occurred, type_, new.stream, payload)
        if sqlite:
            row: tuple[object, ...] = (
                position,
                new.event_id.hex,
                type_,
                new.stream,
                sqlite_time(occurred),
                sqlite_time(recorded),
                payload,
                previous,
            )
        else:
            row = (position, new.event_id, type_, new.stream, occurred, recorded, payload, previous)
        rows.append(row)
    return rows


@settings(max_examples=200)
@given(batch=st.lists(events, max_size=12), sqlite=st.booleans(), repeat=st.booleans())
def test_rows_match_the_documented_chain_and_column_forms(batch: list[NewEvent], sqlite: bool, repeat: bool) -> None:
    if repeat and batch:
        batch = [*batch, batch[0]]  # a duplicate inside the batch is skipped
    recorded = datetime(2026, 11, 30, 5, 0, 0, 1, tzinfo=UTC)
    rows, last = build_rows(batch, set(), 0, bytes(32), recorded, as_text=sqlite)
    expected = reference_rows(batch, sqlite=sqlite)
    assert rows == expected
    assert last == len(expected)


def test_existing_ids_are_skipped_and_the_chain_continues_from_the_tail() -> None:
    moment = datetime(2026, 11, 30, 23, 59, 59, 999999, tzinfo=UTC)
    batch = [
        NewEvent(event_id=uuid.UUID(int=i), stream="s", occurred_at=moment, body=CallRetagged(call_id="c", reason="r"))
        for i in range(1, 4)
    ]
    previous = bytes(range(32))
    rows, last = build_rows(batch, {uuid.UUID(int=2)}, 41, previous, moment, as_text=True)
    assert [row[0] for row in rows] == [42, 43] and last == 43
    assert [row[1] for row in rows] == [uuid.UUID(int=1).hex, uuid.UUID(int=3).hex]
    assert rows[0][4] == "2026-11-30 23:59:59.999999"
    payload = encode_event(batch[0].body).decode()
    assert rows[0][7] == chain_hash(previous.hex(), 42, uuid.UUID(int=1), moment, "call.retagged", "s", payload)
