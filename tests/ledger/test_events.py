"""Events round-trip through their canonical bytes, and the chain hash is what the docs say."""

from __future__ import annotations

import hashlib
import struct
import uuid
from datetime import UTC, date, datetime

from hypothesis import given
from hypothesis import strategies as st

from usage_ledger.ledger.chain import GENESIS_HASH, chain_hash
from usage_ledger.ledger.events import (
    CallImported,
    CallRetagged,
    LabelsRecorded,
    RecordedLabel,
    RecordedReturn,
    ReturnsRecorded,
    RunAnnotated,
    decode_event,
    encode_event,
    event_type,
)

texts = st.text(max_size=20)
moments = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))


@given(
    call_id=texts,
    tags=st.dictionaries(texts, texts, max_size=4),
    started=moments,
    tokens=st.integers(min_value=0, max_value=10**9),
    ttft=st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False),
)
def test_imported_call_round_trips(
    call_id: str, tags: dict[str, str], started: datetime, tokens: int, ttft: float | None
) -> None:
    event = CallImported(
        call_id=call_id,
        source="s",
        line=1,
        started_at=started,
        finished_at=started,
        input_tokens=tokens,
        output_tokens=tokens,
        tags=tags,
        ttft_s=ttft,
    )
    payload = encode_event(event)
    assert decode_event(payload) == event
    assert encode_event(decode_event(payload)) == payload  # canonical: stable bytes


def test_tags_are_explicit_dotted_names() -> None:
    assert event_type(CallRetagged(call_id="c", reason="r")) == "call.retagged"
    assert event_type(RunAnnotated(labels={"gpu": "5090"})) == "run.annotated"
    assert encode_event(RunAnnotated(labels={"b": "2", "a": "1"})).startswith(b'{"type":"run.annotated"')


def test_chain_hash_matches_the_documented_layout() -> None:
    event_id = uuid.UUID(int=7)
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    expected = hashlib.sha256(
        bytes(32)
        + struct.pack(">Q16sq", 1, event_id.bytes, int(moment.timestamp()) * 1_000_000)
        + struct.pack(">I", 11)
        + b"call.failed"
        + struct.pack(">I", 6)
        + b"call-x"
        + b"{}"
    ).hexdigest()
    assert chain_hash(GENESIS_HASH, 1, event_id, moment, "call.failed", "call-x", "{}") == expected


def test_labels_and_returns_are_events_with_dotted_tags() -> None:
    labels = LabelsRecorded(source="grades.csv", labels=[RecordedLabel(run="moe-1", key="AAPL", label="Hold", line=2)])
    returns = ReturnsRecorded(
        source="r.csv", returns=[RecordedReturn(key="AAPL", value=-0.012, as_of=date(2026, 6, 30))]
    )
    assert (event_type(labels), event_type(returns)) == ("labels.recorded", "returns.recorded")
    for body in (labels, returns):
        payload = encode_event(body)
        assert decode_event(payload) == body and encode_event(decode_event(payload)) == payload
    # the fields added later have defaults: an event written without them still decodes
    assert decode_event(b'{"type":"labels.recorded","source":"s","labels":[{"run":"r","key":"k","label":"x"}]}') == (
        LabelsRecorded(source="s", labels=[RecordedLabel(run="r", key="k", label="x")])
    )
