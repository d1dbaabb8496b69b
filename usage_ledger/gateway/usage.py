"""What a response says, per inference API, read in one place: usage, finish reasons, vLLM's metrics.

    chat, completions   body / chunk `usage`: prompt_tokens, completion_tokens, total_tokens,
                        prompt_tokens_details.cached_tokens; the final chunk has `choices: []`;
                        with continuous usage stats (asked for, or forced by the server) every chunk has it
    responses           body `usage` / the `response.completed` event's `response.usage`:
                        input_tokens, output_tokens, total_tokens, input_tokens_details.cached_tokens
    embeddings, score…  body `usage`: prompt_tokens, total_tokens (no completion tokens)

Usage is read on its own. A body is decoded once for everything the gateway describes; if any
field has a shape the gateway did not expect (vLLM's `metrics` block grew an object, a new
member, a null), the body is decoded again with every member kept as raw JSON and each read
separately, so no other field can cost a token count. A `usage` member that is there but not
understood is reported as a problem (`usage_problem`), never as "no usage".
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import msgspec

from usage_ledger.ledger import Usage

__all__ = (
    "TOKEN_CHUNK",
    "ChunkInfo",
    "ResponseInfo",
    "inspect_chunk",
    "inspect_response",
    "read_usage",
)

_NO_RAW = msgspec.Raw()
_any_decoder = msgspec.json.Decoder()
_members_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
# Responses API stream events that end a response; `response.completed` carries the usage
_RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def _count(value: Any) -> int | None:
    """A token count as JSON gives it: a non-negative integer (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _is_null(raw: msgspec.Raw) -> bool:
    return not raw or (len(raw) == 4 and bytes(raw) == b"null")


def read_usage(raw: msgspec.Raw) -> tuple[Usage | None, str]:
    """A `usage` member (raw JSON; empty when absent) as `(usage, problem)`.

    `(None, "")`: absent or null. `(None, why)`: present but not understood. Completion tokens
    absent or null count 0 (embeddings have none); a missing total is prompt + completion.
    """
    if _is_null(raw):
        return None, ""
    try:
        value = _any_decoder.decode(raw)
    except msgspec.DecodeError as exc:  # pragma: no cover - the raw slice came from a valid document
        return None, f"usage is not valid JSON: {exc}"
    if not isinstance(value, dict):
        return None, f"usage is a JSON {type(value).__name__}, not an object"
    prompt_value = value.get("prompt_tokens", value.get("input_tokens"))
    prompt = _count(prompt_value)
    if prompt is None:
        return None, f"usage has no readable prompt_tokens / input_tokens (got {prompt_value!r:.40})"
    completion_value = value.get("completion_tokens", value.get("output_tokens"))
    completion = 0 if completion_value is None else _count(completion_value)
    if completion is None:
        return None, f"usage has no readable completion_tokens / output_tokens (got {completion_value!r:.40})"
    total = _count(value.get("total_tokens"))
    details = value.get("prompt_tokens_details") or value.get("input_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    usage = Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion if total is None else total,
        cached_tokens=cached,
    )
    return usage, ""


def _as_standard_json(data: bytes) -> bytes | None:
    """Python's JSON dialect (`NaN`, `Infinity`, as `json.dumps` writes them) as standard JSON; None if not JSON."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return msgspec.json.encode(value)  # non-finite floats become null


def _read_metrics(raw: msgspec.Raw) -> dict[str, Any] | None:
    """vLLM's per-request `metrics` block, whatever its members (stored as sent)."""
    if _is_null(raw):
        return None
    try:
        value = _any_decoder.decode(raw)
    except msgspec.DecodeError:  # e.g. a number out of range
        return None
    return value if isinstance(value, dict) else {"value": value}


# -- stream chunks ---------------------------------------------------------------------------------


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Any] | None = None


class _Choice(msgspec.Struct):
    index: int | None = None
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None


class _ResponseBody(msgspec.Struct):
    """The `response` of a Responses API event (and a Responses API body's own members)."""

    status: str | None = None
    usage: msgspec.Raw = _NO_RAW
    metrics: msgspec.Raw = _NO_RAW
    incomplete_details: Any = None


class _Chunk(msgspec.Struct):
    type: str | None = None  # Responses API events
    choices: list[_Choice] | None = None
    usage: msgspec.Raw = _NO_RAW
    error: msgspec.Raw = _NO_RAW
    metrics: msgspec.Raw = _NO_RAW
    response: _ResponseBody | None = None
    system_fingerprint: str | None = None


_chunk_decoder = msgspec.json.Decoder(_Chunk)
_choices_decoder = msgspec.json.Decoder(list[_Choice] | None)
_str_decoder = msgspec.json.Decoder(str | None)
_response_decoder = msgspec.json.Decoder(_ResponseBody | None)


class ChunkInfo(msgspec.Struct, frozen=True):
    usage: Usage | None = None
    usage_problem: str = ""
    usage_final: bool = False
    """The usage is the call's total: the chat/completions usage-only chunk, or `response.completed`."""
    usage_only: bool = False
    """`choices` is empty and usage is present: the chunk `include_usage` adds."""
    per_choice_usage: bool = False
    """Usage on a chunk that also has choices: continuous usage stats (asked for, or forced)."""
    tokens: int = 0
    """Choices (or Responses API deltas) in this chunk that carry generated text."""
    finish_reasons: tuple[str, ...] = ()
    finish_choices: tuple[int | None, ...] = ()
    """The index of the choice each of `finish_reasons` came from (a Responses API answer: 0)."""
    error: bool = False
    terminal: bool = False
    """A Responses API event that ends the response (the stream has no `[DONE]`)."""
    metrics: dict[str, Any] | None = None
    system_fingerprint: str | None = None


_EMPTY_CHUNK = ChunkInfo()
TOKEN_CHUNK = ChunkInfo(tokens=1)
"""What `inspect_chunk` returns (this very object) for a chunk with one token and nothing else."""


def _choice_tokens(choices: list[_Choice]) -> tuple[int, tuple[str, ...]]:
    tokens = 0
    reasons: tuple[str, ...] = ()
    for choice in choices:
        delta = choice.delta
        if choice.text or (
            delta is not None and (delta.content or delta.reasoning_content or delta.reasoning or delta.tool_calls)
        ):
            tokens += 1
        if choice.finish_reason is not None:
            reasons = (*reasons, choice.finish_reason)
    return tokens, reasons


def _finish_choices(
    choices: Sequence[_Choice | _MessageChoice] | None, reasons: tuple[str, ...]
) -> tuple[int | None, ...]:
    """The choice index of each finish reason: from the choices, else (the Responses API: one answer) 0."""
    if choices:
        return tuple(c.index for c in choices if c.finish_reason is not None)
    return (0,) * len(reasons)


def _response_reason(response: _ResponseBody) -> tuple[str, ...]:
    details = response.incomplete_details
    if isinstance(details, dict) and isinstance(details.get("reason"), str):
        return (details["reason"],)
    return (response.status,) if response.status else ()


def inspect_chunk(data: bytes) -> ChunkInfo:
    """Describe one SSE `data:` payload of a chat, completions or Responses API stream."""
    try:
        chunk = _chunk_decoder.decode(data)
    except msgspec.ValidationError:  # (a subclass of DecodeError: caught first)
        odd = _odd_chunk(data)
        return _EMPTY_CHUNK if odd is None else _chunk_info(odd, *_choice_tokens(odd.choices or []))
    except msgspec.DecodeError:
        standard = _as_standard_json(data)
        return _EMPTY_CHUNK if standard is None else inspect_chunk(standard)
    choices = chunk.choices
    tokens, reasons = _choice_tokens(choices) if choices else (0, ())
    kind = chunk.type
    if _is_null(chunk.usage) and _is_null(chunk.error) and _is_null(chunk.metrics) and not reasons and kind is None:
        return TOKEN_CHUNK if tokens == 1 else ChunkInfo(tokens=tokens) if tokens else _EMPTY_CHUNK
    return _chunk_info(chunk, tokens, reasons)


def _chunk_info(chunk: _Chunk, tokens: int, reasons: tuple[str, ...]) -> ChunkInfo:
    kind, choices, response = chunk.type, chunk.choices, chunk.response
    usage_raw, metrics_raw = chunk.usage, chunk.metrics
    terminal = kind in _RESPONSE_ENDS
    if kind is not None and kind.endswith(".delta"):
        tokens += 1
    if terminal and response is not None:
        usage_raw = response.usage
        metrics_raw = response.metrics
        reasons = _response_reason(response)
    usage, problem = read_usage(usage_raw)
    present = usage is not None or bool(problem)
    return ChunkInfo(
        usage=usage,
        usage_problem=problem,
        usage_final=present and (terminal or (choices is not None and not choices)),
        usage_only=present and choices is not None and not choices,
        per_choice_usage=present and bool(choices),
        tokens=tokens,
        finish_reasons=reasons,
        finish_choices=_finish_choices(choices, reasons),
        error=not _is_null(chunk.error) or kind in ("error", "response.failed"),
        terminal=terminal,
        metrics=_read_metrics(metrics_raw),
        system_fingerprint=chunk.system_fingerprint,
    )


def _odd_chunk(data: bytes) -> _Chunk | None:
    """A chunk with a member of an unexpected shape: each member read on its own (None: not an object)."""
    raw = _members(data)
    if raw is None:
        return None
    response = _lenient(_response_decoder, raw["response"])
    if response is None and raw["response"]:
        parts = _members(raw["response"])  # the response's members one by one
        if parts is not None:
            response = _ResponseBody(
                status=_lenient(_str_decoder, parts["status"]),
                usage=parts["usage"],
                metrics=parts["metrics"],
                incomplete_details=_lenient(_any_decoder, parts["incomplete_details"]),
            )
    return _Chunk(
        type=_lenient(_str_decoder, raw["type"]),
        choices=_lenient(_choices_decoder, raw["choices"]),
        usage=raw["usage"],
        error=raw["error"],
        metrics=raw["metrics"],
        response=response,
        system_fingerprint=_lenient(_str_decoder, raw["system_fingerprint"]),
    )


def _members(data: bytes | msgspec.Raw) -> defaultdict[str, msgspec.Raw] | None:
    """A JSON object's members kept as raw JSON, to be read one by one (an absent one is empty); None if
    `data` is not an object."""
    try:
        return defaultdict(msgspec.Raw, _members_decoder.decode(data))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _lenient(decoder: msgspec.json.Decoder[Any], raw: msgspec.Raw) -> Any:
    if not raw:
        return None
    try:
        return decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


# -- whole bodies -----------------------------------------------------------------------------------


class _MessageChoice(msgspec.Struct):
    index: int | None = None
    finish_reason: str | None = None


class _Response(msgspec.Struct):
    id: str | None = None
    choices: list[_MessageChoice] | None = None
    usage: msgspec.Raw = _NO_RAW
    metrics: msgspec.Raw = _NO_RAW
    status: str | None = None  # Responses API
    incomplete_details: Any = None
    system_fingerprint: msgspec.Raw = _NO_RAW  # read leniently: a server's odd value must not cost the usage


_body_decoder = msgspec.json.Decoder(_Response)
_message_choices_decoder = msgspec.json.Decoder(list[_MessageChoice] | None)


class ResponseInfo(msgspec.Struct, frozen=True):
    request_id: str | None = None
    usage: Usage | None = None
    usage_problem: str = ""
    finish_reasons: tuple[str, ...] = ()
    finish_choices: tuple[int | None, ...] = ()
    """As `ChunkInfo.finish_choices`."""
    metrics: dict[str, Any] | None = None
    system_fingerprint: str | None = None


def inspect_response(body: bytes) -> ResponseInfo:
    """Describe a non-streamed JSON response (chat, completions, responses, embeddings, …)."""
    if body.lstrip()[:1] != b"{":
        return ResponseInfo()
    try:
        resp = _body_decoder.decode(body)
    except msgspec.ValidationError:  # (a subclass of DecodeError: caught first)
        resp = _odd_response(body)
    except msgspec.DecodeError:
        standard = _as_standard_json(body)
        return ResponseInfo() if standard is None else inspect_response(standard)
    reasons = tuple(c.finish_reason for c in resp.choices or () if c.finish_reason is not None)
    if not reasons and resp.status is not None:
        reasons = _response_reason(_ResponseBody(status=resp.status, incomplete_details=resp.incomplete_details))
    usage, problem = read_usage(resp.usage)
    return ResponseInfo(
        request_id=resp.id,
        usage=usage,
        usage_problem=problem,
        finish_reasons=reasons,
        finish_choices=_finish_choices(resp.choices, reasons),
        metrics=_read_metrics(resp.metrics),
        system_fingerprint=_lenient(_str_decoder, resp.system_fingerprint),
    )


def _odd_response(body: bytes) -> _Response:
    """A body with a member of an unexpected shape: each member read on its own."""
    raw = _members(body) or defaultdict(msgspec.Raw)  # an object: the typed decoding parsed it
    return _Response(
        id=_lenient(_str_decoder, raw["id"]),
        choices=_lenient(_message_choices_decoder, raw["choices"]),
        usage=raw["usage"],
        metrics=raw["metrics"],
        status=_lenient(_str_decoder, raw["status"]),
        incomplete_details=_lenient(_any_decoder, raw["incomplete_details"]),
        system_fingerprint=raw["system_fingerprint"],
    )
