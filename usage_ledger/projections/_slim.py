"""Slim views of the events projections fold: only the fields they read, decoded per type.

Decoding a stored payload into these (unknown fields ignored) is several times cheaper than the
full `ledger.events` union, which matters when a rebuild reads millions of events. They are `gc=False`
(decoded JSON holds no reference cycles): the collector no longer walks a page's 50,000 of them on every
pass (`bench/rebuild.py --calls 100000 --keep`: rebuild CPU 4.1-4.2 -> 4.0 s).
Each field is one of its event's (`ledger.events`), of a type that holds the event's values:
tests/projections/test_slim_shapes.py fails when they part.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from usage_ledger.ledger import CallRetagged, RunAnnotated
from usage_ledger.projections.call_rules import NO_USAGE

__all__ = ("DECODERS", "SFailed", "SFinished", "SImported", "SStarted", "decode_slim")


class STimings(msgspec.Struct, frozen=True, gc=False):
    received: datetime
    upstream_headers: datetime | None = None
    first_token: datetime | None = None
    last_token: datetime | None = None
    finished: datetime | None = None


class SUsage(msgspec.Struct, frozen=True, gc=False):
    """Counts as stored; a float is read too (the plausibility rule, `ledger.counts`, keeps it out of every sum)."""

    prompt_tokens: int | float
    completion_tokens: int | float
    cached_tokens: int | float | None = None


class SStarted(msgspec.Struct, frozen=True, gc=False, tag="call.started"):
    call_id: str
    received_at: datetime
    run: str | None = None
    tags: dict[str, str] = {}
    model: str | None = None
    request_blob: str | None = None


class SImported(msgspec.Struct, frozen=True, gc=False, tag="call.imported"):
    """`call.imported` as the fold reads it: its counts as stored, a float too (`SUsage`)."""

    call_id: str
    source: str
    line: int
    started_at: datetime
    finished_at: datetime
    input_tokens: int | float
    output_tokens: int | float
    run: str | None = None
    tags: dict[str, str] = {}
    model: str | None = None
    ttft_s: float | None = None
    status: str = "ok"
    finish_reason: str | None = None
    usage_source: str = "imported"


class SRequestMetrics(msgspec.Struct, frozen=True, gc=False):
    speculative_decoding: Any = None
    """As vLLM sent it (`call_rules.spec_decode_counts` reads it)."""


class SFinished(msgspec.Struct, frozen=True, gc=False, tag="call.finished"):
    call_id: str
    status: int
    timings: STimings
    response_blob: str | None = None
    usage: SUsage | None = None
    usage_source: str = NO_USAGE
    request_metrics: SRequestMetrics | None = None
    finish_reasons: list[str] = []
    finish_choices: list[int | None] = []


class SFailed(msgspec.Struct, frozen=True, gc=False, tag="call.failed"):
    call_id: str
    reason: str
    timings: STimings
    client_status: int | None = None
    response_blob: str | None = None
    usage: SUsage | None = None
    usage_source: str = NO_USAGE


DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    cls.__struct_config__.tag: msgspec.json.Decoder(cls)  # type: ignore[misc]
    # retags and annotations are read whole: their full event types are the cheapest view
    for cls in (SStarted, SFinished, SFailed, SImported, CallRetagged, RunAnnotated)
}


def decode_slim(type_: str, payload: str) -> Any:
    """The slim body of a stored event, or None for a type no projection reads."""
    decoder = DECODERS.get(type_)
    return None if decoder is None else decoder.decode(payload)
