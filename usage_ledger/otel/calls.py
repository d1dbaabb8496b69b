"""Committed calls as export records: a call's start paired with its end, and its GenAI attributes.

Pure (no SDK): what a span says is decided here, how it is sent is `export`'s business.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

import msgspec

from usage_ledger.ledger import CallFailed, CallFinished, CallImported, CallStarted
from usage_ledger.projections import IMPLAUSIBLE, ended_at, finished_status, plausible_tokens

__all__ = ("ExportedCall", "call_from_events", "call_from_import", "operation_of", "response_model", "trace_ids")

AttributeValue = str | int | float | bool | list[str]


class ExportedCall(msgspec.Struct, frozen=True, kw_only=True):
    call_id: str
    name: str
    start: datetime
    end: datetime
    failed: bool
    error: str
    attributes: dict[str, AttributeValue]
    operation: str
    model: str
    input_tokens: int | None
    output_tokens: int | None
    ttft_s: float | None


def operation_of(path: str) -> str:
    """`gen_ai.operation.name` from the endpoint called."""
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "text_completion"
    if path.endswith("/embeddings"):
        return "embeddings"
    return path.rsplit("/", 1)[-1] or "unknown"


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


def _common(call_id: str, run: str | None, tags: dict[str, str]) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {"usage_ledger.call_id": call_id}
    if run is not None:
        attributes["usage_ledger.run"] = run
    for name, value in sorted(tags.items()):
        attributes[f"usage_ledger.tag.{name}"] = value
    return attributes


def _usage_attributes(attributes: dict[str, AttributeValue], tokens_in: int | None, tokens_out: int | None) -> None:
    """The GenAI token attributes: plausible counts only (`ledger.counts`; an OTLP int is 64-bit)."""
    if tokens_in is not None:
        attributes["gen_ai.usage.input_tokens"] = tokens_in
    if tokens_out is not None:
        attributes["gen_ai.usage.output_tokens"] = tokens_out


def call_from_events(
    started: CallStarted, ended: CallFinished | CallFailed, answered_model: str | None = None
) -> ExportedCall:
    """`answered_model`: `response_model` of the stored response (None: no body, redacted, or none named)."""
    operation = operation_of(started.path)
    model = started.model or ""
    attributes: dict[str, AttributeValue] = {"gen_ai.operation.name": operation}
    if started.model:
        attributes["gen_ai.request.model"] = started.model
    if answered_model:
        attributes["gen_ai.response.model"] = answered_model
    usage = ended.usage
    tokens_in = plausible_tokens("prompt_tokens", usage.prompt_tokens) if usage else None
    tokens_out = plausible_tokens("completion_tokens", usage.completion_tokens) if usage else None
    _usage_attributes(attributes, tokens_in, tokens_out)
    implausible = usage is not None and (tokens_in is None or tokens_out is None)
    attributes["usage_ledger.usage_source"] = IMPLAUSIBLE if implausible else ended.usage_source
    attributes.update(_common(started.call_id, started.run, started.tags))
    timings = ended.timings
    end = ended_at(timings.finished, timings.last_token, timings.upstream_headers, timings.received)
    ttft = None
    if started.stream and timings.first_token is not None:
        ttft = (timings.first_token - started.received_at).total_seconds()
    if isinstance(ended, CallFinished):
        if ended.finish_reasons:
            attributes["gen_ai.response.finish_reasons"] = list(ended.finish_reasons)
        if ended.upstream_request_id:
            attributes["gen_ai.response.id"] = ended.upstream_request_id
        attributes["http.response.status_code"] = ended.status
        failed = finished_status(ended.status) != "ok"  # the calls read model's rule
        error = f"HTTP {ended.status}" if failed else ""
    else:
        failed = True
        error = f"{ended.phase}: {ended.reason}"
        attributes["error.type"] = ended.reason
    return ExportedCall(
        call_id=started.call_id,
        name=f"{operation} {model}".strip(),
        start=started.received_at,
        end=max(end, started.received_at),
        failed=failed,
        error=error,
        attributes=attributes,
        operation=operation,
        model=model,
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        ttft_s=ttft,
    )


def call_from_import(imported: CallImported) -> ExportedCall:
    """An imported call: the importer knows no endpoint; these are chat calls in practice."""
    tokens_in = plausible_tokens("input_tokens", imported.input_tokens)
    tokens_out = plausible_tokens("output_tokens", imported.output_tokens)
    attributes: dict[str, AttributeValue] = {"gen_ai.operation.name": "chat"}
    _usage_attributes(attributes, tokens_in, tokens_out)
    attributes["usage_ledger.import_source"] = imported.source
    if tokens_in is None or tokens_out is None:
        attributes["usage_ledger.usage_source"] = IMPLAUSIBLE
    if imported.model:
        attributes["gen_ai.request.model"] = imported.model
    attributes.update(_common(imported.call_id, imported.run, imported.tags))
    return ExportedCall(
        call_id=imported.call_id,
        name=f"chat {imported.model or ''}".strip(),
        start=imported.started_at,
        end=max(imported.finished_at, imported.started_at),
        failed=imported.status == "error",
        error="imported with status error" if imported.status == "error" else "",
        attributes=attributes,
        operation="chat",
        model=imported.model or "",
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        ttft_s=imported.ttft_s,
    )
