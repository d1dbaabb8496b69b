"""The event vocabulary: a msgspec tagged union with explicit, stable dotted tags.

Schema evolution: new fields only, always with defaults; a field's type never changes. The stored
payload is the canonical JSON of the event body (`encode_event`); it is exactly what is hashed.
"""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from typing import Any, Literal

import msgspec

__all__ = (
    "BlobRedacted",
    "CallFailed",
    "CallFinished",
    "CallImported",
    "CallRetagged",
    "CallStarted",
    "Event",
    "FailureReason",
    "ImportedUsageSource",
    "LabelsRecorded",
    "NewEvent",
    "ProjectionPromoted",
    "RecordedLabel",
    "RecordedReturn",
    "ReturnsRecorded",
    "RunAnnotated",
    "Sampling",
    "ServedModel",
    "ServerSampled",
    "Timings",
    "Usage",
    "UsageSource",
    "call_stream",
    "decode_event",
    "encode_event",
    "event_type",
    "new_event",
    "utc_now",
)

UsageSource = Literal["reported", "injected", "absent", "unreadable", "partial", "counted", "implausible"]
"""Where a call's token counts came from:

- `reported`: the server's usage for the whole call, which the client asked for (or got unasked);
- `injected`: the server's usage, for a stream the gateway asked it of (the client sees no difference);
- `absent`: the server sent no usage;
- `unreadable`: the server sent usage (or a body) the gateway could not read; `usage_detail` says why;
- `partial`: a stream that ended early, counted by the last per-chunk usage the server sent;
- `counted`: a stream that ended early without usage: completion tokens are the content deltas the
  gateway saw (a lower bound: one delta may carry several tokens), prompt tokens unknown (0);
- `implausible`: the server's usage as it sent it, with a count outside the one plausibility rule
  (`ledger.counts`: e.g. 2⁶³ prompt tokens); `usage_detail` names it. Kept as received, summed nowhere.
"""
ImportedUsageSource = Literal["imported", "implausible"]
"""Where an imported call's token counts came from: the file (`imported`), or the file with a count outside
the plausibility rule (`implausible`: kept as given, summed nowhere; `usage_detail` names it)."""
FailureReason = Literal[
    "upstream_unreachable",
    "upstream_timeout",
    "upstream_reset",
    "upstream_error_in_stream",
    "client_disconnected",
    "gateway_error",
]


def utc_now() -> datetime:
    return datetime.now(UTC)


class Sampling(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Sampling parameters as the client sent them (None = not sent)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    n: int | None = None
    enable_thinking: bool | None = None


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int | None = None


class Timings(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Moments of a call (UTC). `None` when the moment did not happen (e.g. no token)."""

    received: datetime
    upstream_headers: datetime | None = None
    first_token: datetime | None = None
    last_token: datetime | None = None
    finished: datetime | None = None


class CallStarted(msgspec.Struct, frozen=True, kw_only=True, tag="call.started"):
    call_id: str
    received_at: datetime
    method: str
    path: str
    query: str = ""
    run: str | None = None
    tags: dict[str, str] = {}
    request_headers: list[tuple[str, str]] = []
    request_blob: str | None = None
    request_bytes: int = 0
    model: str | None = None
    stream: bool = False
    sampling: Sampling = Sampling()
    upstream: str = ""


class CallFinished(msgspec.Struct, frozen=True, kw_only=True, tag="call.finished"):
    call_id: str
    status: int
    upstream_request_id: str | None = None
    response_headers: list[tuple[str, str]] = []
    response_blob: str | None = None
    response_bytes: int = 0
    usage: Usage | None = None
    usage_source: UsageSource = "absent"
    finish_reasons: list[str] = []
    """Each choice's finish reason in arrival order (the Responses API: `incomplete_details.reason`, else its status)."""
    chunk_count: int = 0
    timings: Timings
    vllm_metrics: dict[str, float] | None = None
    """Written before vLLM's block held objects; new events use `request_metrics`."""
    request_metrics: dict[str, Any] | None = None
    """vLLM's per-request `metrics` block, as sent (`--enable-per-request-metrics`)."""
    usage_detail: str = ""
    """Why the usage is not `reported`/`injected`, when there is more to say than the source."""
    response_blob_omitted: str = ""
    """Why the body is not stored although `response_bytes` were sent: `too_large` (over
    LEDGER_MAX_STORED_BODY_BYTES) or `budget_full` (LEDGER_MAX_STORED_BYTES_IN_FLIGHT); empty: stored whole."""
    chunk_gaps_blob: str | None = None
    """The blob (sha256 hex, as `response_blob`) of the gaps in whole microseconds between the arrivals
    of successive content chunks (those carrying generated text) at the gateway: entry i is chunk i+1's
    arrival minus chunk i's, chunk 0 being `timings.first_token`. These are `vllm bench serve`'s
    inter-token latencies as the gateway saw them; their sum is `last_token - first_token` to the
    microsecond. Chunks that arrived in one read share a moment (0).

    The blob is a msgspec JSON array of ints (`ledger.chunk_gaps`), which the blob store compresses
    with zstd: a 1,470-chunk stream's 8.5 KB of gaps are stored in 3.5 KB, 2.4 bytes a chunk
    (docs/decide.md). In a blob, not in this payload, because a rebuild parses every payload and
    needs none of them. At most 65,536 gaps are kept (`gateway.observed.MAX_CHUNK_GAPS`): a longer
    stream keeps its first ones. None: not a stream, fewer than two content chunks, or recorded before
    this field existed; `ledger compare` counts a call whose gap blob is missing or redacted as one
    without gaps too. The blob holds timings only, no client data: `ledger redact` has no reason to erase it."""
    system_fingerprint: str | None = None
    """The response's `system_fingerprint`: vLLM (0.32) derives it from its whole engine config, once
    at start-up, and sends it on non-streamed responses only. None: not sent, or recorded before this field."""
    finish_choices: list[int | None] = []
    """The index of the choice each of `finish_reasons` came from, in the same order (the Responses API's
    one answer: 0); empty in events written before it was recorded."""


class CallFailed(msgspec.Struct, frozen=True, kw_only=True, tag="call.failed"):
    call_id: str
    phase: Literal["connect", "headers", "body", "stream", "gateway"]
    reason: FailureReason
    detail: str = ""
    client_status: int | None = None
    client_bytes: int = 0
    response_blob: str | None = None
    usage: Usage | None = None
    usage_source: UsageSource = "absent"
    chunk_count: int = 0
    timings: Timings
    usage_detail: str = ""
    response_blob_omitted: str = ""
    """As in `CallFinished`: why the bytes received are not stored (`response_blob` is None)."""
    chunk_gaps_blob: str | None = None
    """As in `CallFinished`: the gaps of the content chunks that arrived before the call failed."""


class CallImported(msgspec.Struct, frozen=True, kw_only=True, tag="call.imported"):
    call_id: str
    source: str
    line: int
    started_at: datetime
    finished_at: datetime
    input_tokens: int
    output_tokens: int
    run: str | None = None
    tags: dict[str, str] = {}
    model: str | None = None
    ttft_s: float | None = None
    status: Literal["ok", "error"] = "ok"
    finish_reason: str | None = None
    """The source's finish reason for the call (`stop`, `length`, …), when it has one."""
    usage_source: ImportedUsageSource = "imported"
    usage_detail: str = ""
    """Which count is implausible, and why, when `usage_source` is `implausible`."""


class CallRetagged(msgspec.Struct, frozen=True, kw_only=True, tag="call.retagged"):
    call_id: str
    reason: str
    run: str | None = None
    tags: dict[str, str] = {}
    removed_tags: list[str] = []


class RunAnnotated(msgspec.Struct, frozen=True, kw_only=True, tag="run.annotated"):
    labels: dict[str, str]
    run: str | None = None
    start: datetime | None = None
    end: datetime | None = None


class ProjectionPromoted(msgspec.Struct, frozen=True, kw_only=True, tag="projection.promoted"):
    name: str
    version: int
    formula: str
    head_position: int
    digest: str


class BlobRedacted(msgspec.Struct, frozen=True, kw_only=True, tag="blob.redacted"):
    blob_hash: str
    reason: str


class ServedModel(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One entry of the upstream's `/v1/models`."""

    id: str
    max_model_len: int | None = None
    root: str | None = None


SampleTrigger = Literal["start", "interval", "run_start", "run_end", "stop"]


class ServerSampled(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="server.sampled"):
    """What the upstream's `/metrics` said by `sampled_at` (its response's arrival), as picked by
    `gateway.sampler`: counters summed over label sets, gauges as named there. `config` and
    `models` are present when first seen after a start and whenever they change."""

    upstream: str
    sampled_at: datetime
    requested_at: datetime | None = None
    """When the request for it left: the text describes a moment between the two."""
    trigger: SampleTrigger = "interval"
    run: str | None = None
    """The run whose first call or end triggered the sample."""
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    accepted_per_pos: list[float] = []
    config: dict[str, str] | None = None
    models: list[ServedModel] | None = None


class RecordedLabel(msgspec.Struct, frozen=True, kw_only=True):
    """One key's label in one run; an empty label says the run has none for the key (it withdraws an earlier one)."""

    run: str
    key: str
    label: str
    line: int = 0
    """Where it was in the imported file (0: read from the run's stored answers)."""


class LabelsRecorded(msgspec.Struct, frozen=True, kw_only=True, tag="labels.recorded"):
    """Labels of runs' keys from one file (`ledger labels import FILE`) or one extraction over a run's stored
    answers (`--run R --extract RE`). The latest event's label per (run, key) counts; earlier ones stay."""

    source: str
    labels: list[RecordedLabel]
    extract: str = ""
    """The pattern the labels were read with, for an extraction."""


class RecordedReturn(msgspec.Struct, frozen=True, kw_only=True):
    """A key's realized return, as of a date when given."""

    key: str
    value: float
    as_of: date | None = None
    line: int = 0


class ReturnsRecorded(msgspec.Struct, frozen=True, kw_only=True, tag="returns.recorded"):
    """Realized returns per key from one file (`ledger returns import FILE`); per (key, as_of) the latest event counts."""

    source: str
    returns: list[RecordedReturn]


Event = (
    CallStarted
    | CallFinished
    | CallFailed
    | CallImported
    | CallRetagged
    | RunAnnotated
    | ProjectionPromoted
    | BlobRedacted
    | ServerSampled
    | LabelsRecorded
    | ReturnsRecorded
)


class NewEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event about to be appended: identity, stream, time and body."""

    event_id: uuid.UUID
    stream: str
    occurred_at: datetime
    body: Event


_encoder = msgspec.json.Encoder(order="deterministic")
_decoder: msgspec.json.Decoder[Event] = msgspec.json.Decoder(Event, strict=True)


def encode_event(body: Event) -> bytes:
    """The canonical payload bytes of an event body (sorted keys, tag first as `type`)."""
    return _encoder.encode(body)


def decode_event(payload: bytes | str) -> Event:
    return _decoder.decode(payload)


def event_type(body: Event) -> str:
    tag = body.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def call_stream(call_id: str) -> str:
    """The stream of one call's events (started, finished or failed, retagged, labelled): `call-<call_id>`.
    The rebuild's workers split the calls by it, and readers find a call's events by it."""
    return f"call-{call_id}"


def new_event(
    body: Event, *, stream: str, occurred_at: datetime | None = None, event_id: uuid.UUID | None = None
) -> NewEvent:
    """Wrap a body for appending; ids are random unless derived (imports derive theirs from content)."""
    return NewEvent(
        event_id=event_id or uuid.uuid4(),
        stream=stream,
        occurred_at=occurred_at or utc_now(),
        body=body,
    )
