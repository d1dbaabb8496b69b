"""What the gateway reads from a call's request body: its model and sampling, its stream options.

Decoding is lenient (a body the gateway does not understand is still forwarded, just described
less); the only rewrite is `with_usage_requested`, for streams that did not ask for usage. Whether a
request is a call is `gateway.paths`'; what responses say is read in `gateway.usage`.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from usage_ledger.ledger import Sampling

__all__ = (
    "RequestInfo",
    "fingerprint_restorer",
    "inspect_request",
    "with_usage_requested",
)


class _StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


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
    max_output_tokens: int | None = None  # Responses API
    seed: int | None = None
    n: int | None = None
    chat_template_kwargs: _TemplateKwargs | None = None


_request_decoder = msgspec.json.Decoder(_Request)
_any_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


class RequestInfo(msgspec.Struct, frozen=True):
    model: str | None = None
    stream: bool = False
    sampling: Sampling = Sampling()
    wants_usage: bool = False
    """The client asked for a usage chunk itself (stream_options.include_usage)."""


def inspect_request(body: bytes) -> RequestInfo:
    if not body or body[:1] not in b"{ \t\r\n":
        return RequestInfo()
    try:
        req = _request_decoder.decode(body)
    except msgspec.ValidationError:  # (a subclass of DecodeError: caught first)
        req = _lenient_request(body)
    except msgspec.DecodeError:
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
            max_tokens=next(
                (m for m in (req.max_tokens, req.max_completion_tokens, req.max_output_tokens) if m is not None), None
            ),
            seed=req.seed,
            n=req.n,
            enable_thinking=thinking,
        ),
        wants_usage=bool(opts and opts.include_usage),
    )


def _lenient_request(body: bytes) -> _Request:
    """A request with a member of an unexpected type: every member that does fit is still read."""
    try:
        obj = _any_decoder.decode(body)
    except msgspec.DecodeError:  # e.g. a number out of range: nothing can be read generically either
        return _Request()
    if not isinstance(obj, dict):
        return _Request()
    kept = {}
    for name in _Request.__struct_fields__:
        if name in obj:
            try:
                msgspec.convert({name: obj[name]}, _Request)
            except msgspec.ValidationError:
                continue
            kept[name] = obj[name]
    return msgspec.convert(kept, _Request)


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


def fingerprint_restorer(fingerprint: str) -> Callable[[bytes], bytes]:
    """A rewrite of a terminal chunk (one with a finish reason) as it is when the client did not ask for usage.

    vLLM (0.32) stamps `system_fingerprint` on the terminal chunks of a stream, unless a usage chunk
    follows, which then carries it instead. So when the gateway asked for usage and cuts that chunk
    out, the fingerprint goes back where the client would have found it: last member of each
    terminal chunk, as vLLM writes it (compact JSON). Events that are not one compact `data:` line
    of a JSON object, or that have a fingerprint already, are left as they are.
    """
    member = b',"system_fingerprint":' + _encoder.encode(fingerprint)

    def restore(event: bytes) -> bytes:
        end = event.rfind(b"}")
        if not event.startswith(b"data: {") or end < 0 or b'"system_fingerprint"' in event:
            return event
        if event[end + 1 :].strip(b"\r\n") or event.count(b"\n") > 2:
            return event  # not a single-line event
        return event[:end] + member + event[end:]

    return restore
