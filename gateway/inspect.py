"""What the gateway reads from request and response bodies: model, sampling, usage, finish reasons.

Decoding is lenient (a body the gateway does not understand is still forwarded, just described
less); the only rewrite is `with_usage_requested`, for streams that did not ask for usage.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ledger.events import Sampling, Usage

__all__ = (
    "TOKEN_CHUNK",
    "ChunkInfo",
    "RequestInfo",
    "ResponseInfo",
    "inspect_chunk",
    "inspect_request",
    "inspect_response",
    "with_usage_requested",
)


class _StreamOptions(msgspec.Struct):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class _TemplateKwargs(msgspec.Struct):
    enable_thinking: bool | None = None


class _Request(msgspec.Struct):
    model: str | None = None
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    seed: int | None = None
    n: int | None = None
    chat_template_kwargs: _TemplateKwargs | None = None


class _Details(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int | None = 0
    total_tokens: int = 0
    prompt_tokens_details: _Details | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Any] | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None
    metrics: dict[str, float] | None = None


class _MessageChoice(msgspec.Struct):
    finish_reason: str | None = None


class _Response(msgspec.Struct):
    id: str | None = None
    choices: list[_MessageChoice] | None = None
    usage: _Usage | None = None
    metrics: dict[str, float] | None = None


_request_decoder = msgspec.json.Decoder(_Request)
_chunk_decoder = msgspec.json.Decoder(_Chunk)
_response_decoder = msgspec.json.Decoder(_Response)
_any_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


class RequestInfo(msgspec.Struct, frozen=True):
    model: str | None = None
    stream: bool = False
    sampling: Sampling = Sampling()
    wants_usage: bool = False
    """The client asked for a usage chunk itself (stream_options.include_usage)."""
    continuous_usage: bool = False


def inspect_request(body: bytes) -> RequestInfo:
    if not body or body[:1] not in b"{ \t\r\n":
        return RequestInfo()
    try:
        req = _request_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return RequestInfo()
    opts = req.stream_options
    thinking = req.chat_template_kwargs.enable_thinking if req.chat_template_kwargs else None
    return RequestInfo(
        model=req.model,
        stream=bool(req.stream),
        sampling=Sampling(
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            max_tokens=req.max_tokens if req.max_tokens is not None else req.max_completion_tokens,
            seed=req.seed,
            n=req.n,
            enable_thinking=thinking,
        ),
        wants_usage=bool(opts and opts.include_usage),
        continuous_usage=bool(opts and opts.continuous_usage_stats),
    )


def with_usage_requested(body: bytes) -> bytes | None:
    """The body with `"stream_options": {"include_usage": true}` added, or None if it cannot be done.

    When `stream_options` is absent the member is inserted after the opening brace, so every other
    byte stays as the client sent it; otherwise the object is re-encoded with the option set.
    """
    stripped = body.lstrip()
    if not stripped.startswith(b"{"):
        return None
    try:
        obj = _any_decoder.decode(body)
    except msgspec.DecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    if "stream_options" not in obj:
        lead = len(body) - len(stripped)
        rest = stripped[1:]
        sep = b"," if rest.strip() != b"}" else b""
        return body[: lead + 1] + b'"stream_options":{"include_usage":true}' + sep + rest
    options = obj["stream_options"]
    if options is None:
        options = {}
    if not isinstance(options, dict) or options.get("continuous_usage_stats"):
        return None  # usage would then appear in every chunk: the client's stream would change
    obj["stream_options"] = {**options, "include_usage": True}
    return _encoder.encode(obj)


def _usage(raw: _Usage | None) -> Usage | None:
    if raw is None:
        return None
    cached = raw.prompt_tokens_details.cached_tokens if raw.prompt_tokens_details else None
    return Usage(
        prompt_tokens=raw.prompt_tokens,
        completion_tokens=raw.completion_tokens or 0,
        total_tokens=raw.total_tokens,
        cached_tokens=cached,
    )


class ChunkInfo(msgspec.Struct, frozen=True):
    usage: Usage | None = None
    usage_only: bool = False
    """`choices` is empty and usage is present: the chunk `include_usage` adds."""
    has_token: bool = False
    finish_reasons: tuple[str, ...] = ()
    error: bool = False
    metrics: dict[str, float] | None = None


_EMPTY_CHUNK = ChunkInfo()
TOKEN_CHUNK = ChunkInfo(has_token=True)
"""What `inspect_chunk` returns (this very object) for a chunk with a token and nothing else."""


def inspect_chunk(data: bytes) -> ChunkInfo:
    """Describe one SSE `data:` payload of a chat or completion stream."""
    try:
        chunk = _chunk_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _EMPTY_CHUNK
    choices = chunk.choices
    has_token = False
    reasons: tuple[str, ...] = ()
    if choices:
        for choice in choices:
            delta = choice.delta
            if choice.text or (
                delta is not None and (delta.content or delta.reasoning_content or delta.reasoning or delta.tool_calls)
            ):
                has_token = True
            if choice.finish_reason is not None:
                reasons = (*reasons, choice.finish_reason)
    if chunk.usage is None and chunk.error is None and chunk.metrics is None and not reasons:
        return TOKEN_CHUNK if has_token else _EMPTY_CHUNK  # nearly every chunk: no new struct
    return ChunkInfo(
        usage=_usage(chunk.usage),
        usage_only=choices is not None and not choices and chunk.usage is not None,
        has_token=has_token,
        finish_reasons=reasons,
        error=chunk.error is not None,
        metrics=chunk.metrics,
    )


class ResponseInfo(msgspec.Struct, frozen=True):
    request_id: str | None = None
    usage: Usage | None = None
    finish_reasons: tuple[str, ...] = ()
    metrics: dict[str, float] | None = None


def inspect_response(body: bytes) -> ResponseInfo:
    """Describe a non-streamed JSON response (chat, completion, embeddings...)."""
    if not body.startswith(b"{"):
        return ResponseInfo()
    try:
        resp = _response_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ResponseInfo()
    reasons = tuple(c.finish_reason for c in resp.choices or () if c.finish_reason is not None)
    return ResponseInfo(request_id=resp.id, usage=_usage(resp.usage), finish_reasons=reasons, metrics=resp.metrics)
