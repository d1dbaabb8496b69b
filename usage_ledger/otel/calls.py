"""A call's span, from its row of the calls read model: the fold's row is the call, here as in every report.

Pure (no SDK): what a span says is decided here, how it is sent is `export`'s business. The row holds
every value a span reports but two identifiers, which come from the call's events: the endpoint called
(`call.started.path`, named as the gateway routes it) and the upstream's response id.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

import msgspec

from usage_ledger.gateway import GatewayError, call_path
from usage_ledger.projections import FAILED_STATUSES, NO_USAGE, CallRow

__all__ = ("ExportedCall", "call_from_row", "response_model", "trace_ids")

AttributeValue = str | int | float | bool | list[str]

_tags_decoder = msgspec.json.Decoder(dict[str, str])


class ExportedCall(msgspec.Struct, frozen=True, kw_only=True):
    call_id: str
    name: str
    start: datetime
    end: datetime
    error: str | None
    """The ERROR status' description; None for a call that did not fail."""
    attributes: dict[str, AttributeValue]
    operation: str
    model: str
    tokens: tuple[int, int] | None
    """(input, output) as the row counts them; None for a call without usage."""
    ttft_s: float | None


def _operation_of(path: str) -> str:
    """`gen_ai.operation.name` from the endpoint called, read as the upstream routes it (`/v1/chat/%63ompletions`
    is a chat, `gateway.call_path`); a path recorded before the gateway refused ambiguous spellings, as it is."""
    try:
        routed = call_path("POST", path) or path
    except GatewayError:
        routed = path
    if routed.endswith("/chat/completions"):
        return "chat"
    if routed.endswith("/completions"):
        return "text_completion"
    if routed.endswith("/embeddings"):
        return "embeddings"
    return routed.rsplit("/", 1)[-1] or "unknown"


class _Model(msgspec.Struct):
    model: str | None = None


class _ResponsesEvent(msgspec.Struct):
    response: _Model | None = None  # the Responses API's events carry the model inside `response`


_model_decoder = msgspec.json.Decoder(_Model)
_responses_event_decoder = msgspec.json.Decoder(_ResponsesEvent)


def response_model(body: bytes) -> str | None:
    """The `model` the server answered with: a JSON body's, or the first SSE chunk's that names one.

    Read from the stored response by the exporter, off the proxy path; None for a body that names
    none (an error, an odd shape)."""
    try:
        if body.lstrip()[:1] == b"{":
            return _model_decoder.decode(body).model
        for line in body.split(b"\n"):
            if line.startswith(b"data: {"):
                data = line[6:].rstrip(b"\r")
                model = _model_decoder.decode(data).model
                if model is None and (event := _responses_event_decoder.decode(data).response) is not None:
                    model = event.model
                if model is not None:
                    return model
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return None


def trace_ids(call_id: str) -> tuple[int, int]:
    """(trace id, span id) derived from the call id: a re-export sends the same ids, so receivers can dedupe."""
    digest = hashlib.sha256(f"usage-ledger:{call_id}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def _error(row: CallRow) -> str | None:
    if row.status not in FAILED_STATUSES:
        return None
    if row.failure_reason is not None:
        return row.failure_reason
    return f"HTTP {row.http_status}" if row.http_status is not None else f"status {row.status}"


def call_from_row(
    row: CallRow, path: str | None, response_id: str | None = None, answered_model: str | None = None
) -> ExportedCall:
    """The span of an ended call's row. `path`: its `call.started.path` (None for an import, a chat call in
    practice); `response_id`: the upstream's request id of its end; `answered_model`: `response_model` of its
    stored response (None: no body, redacted, or none named)."""
    operation = "chat" if path is None else _operation_of(path)
    tokens = None if row.usage_source == NO_USAGE else (row.input_tokens, row.output_tokens)
    attributes: dict[str, AttributeValue] = {"gen_ai.operation.name": operation}
    if row.model:
        attributes["gen_ai.request.model"] = row.model
    if answered_model:
        attributes["gen_ai.response.model"] = answered_model
    if tokens is not None:
        attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"] = tokens
    attributes["usage_ledger.usage_source"] = row.usage_source
    if row.finish_reason is not None:
        attributes["gen_ai.response.finish_reasons"] = [row.finish_reason]
    if response_id:
        attributes["gen_ai.response.id"] = response_id
    if row.http_status is not None:
        attributes["http.response.status_code"] = row.http_status
    if row.failure_reason is not None:
        attributes["error.type"] = row.failure_reason
    if row.source is not None:
        attributes["usage_ledger.import_source"] = row.source
    attributes["usage_ledger.call_id"] = row.call_id
    if row.run is not None:
        attributes["usage_ledger.run"] = row.run
    for name, value in sorted(_tags_decoder.decode(row.tags).items()):
        attributes[f"usage_ledger.tag.{name}"] = value
    assert row.ended_at is not None, "an ended call's row has its end"
    return ExportedCall(
        call_id=row.call_id,
        name=f"{operation} {row.model or ''}".strip(),
        start=row.started_at,
        end=max(row.ended_at, row.started_at),  # a span never ends before it starts (a clock stepped back)
        error=_error(row),
        attributes=attributes,
        operation=operation,
        model=row.model or "",
        tokens=tokens,
        ttft_s=row.ttft_s,
    )
