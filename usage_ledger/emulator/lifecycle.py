"""What every inference endpoint shares: faults, body decoding, checks, the engine sequence, disconnects."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from typing import TypeVar

import msgspec

from usage_ledger.emulator.asgi import JSON, Receive, Scope, Send, header, read_body, respond
from usage_ledger.emulator.config import EmulatorConfig
from usage_ledger.emulator.engine import Engine
from usage_ledger.emulator.faults import FaultError, Faults, parse_faults
from usage_ledger.emulator.scheduler import Sequence
from usage_ledger.emulator.wire import error_body

__all__ = (
    "SSE_HEADERS",
    "STREAM_FAULT",
    "BadRequest",
    "answer",
    "base_request_id",
    "check_context",
    "check_model",
    "cut_stream",
    "decode_request",
    "header_faults",
    "invalid_body",
    "reject",
    "running",
    "until_done",
    "until_output",
)

T = TypeVar("T")

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
STREAM_FAULT = "Injected fault: error in the middle of the stream (X-Emulator-Fault)."


class BadRequest(Exception):
    """A request vLLM would refuse: answered with `error_body(status, message, param, kind)`."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind


def invalid_body(message: str, param: str | None) -> BadRequest:
    """What FastAPI's validation handler in vLLM answers for a body that does not parse or validate."""
    return BadRequest(400, f"1 validation error:\n  {message}", param, kind="Bad Request")


async def reject(send: Send, exc: BadRequest) -> None:
    await respond(send, exc.status, error_body(exc.status, exc.message, exc.param, exc.kind))


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")
_BYTE = re.compile(r"\(byte (?P<byte>\d+)\)")


def _undecodable(body: bytes, exc: msgspec.DecodeError | msgspec.ValidationError) -> BadRequest:
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        at, missing = _AT.search(text), _MISSING.search(text)
        path = at.group("path") if at else ""
        if missing:
            path += "." + missing.group("field")
        param = "body" + re.sub(r"\[(\d+)\]", r".\1", path)
        return invalid_body(f"{{'type': 'value_error', 'loc': {param!r}, 'msg': {text!r}}}", param)
    byte = _BYTE.search(text)
    param = f"body.{byte.group('byte') if byte else len(body)}"
    return invalid_body(f"{{'type': 'json_invalid', 'loc': {param!r}, 'msg': 'JSON decode error: {text}'}}", param)


async def decode_request(
    config: EmulatorConfig, scope: Scope, receive: Receive, send: Send, decoder: msgspec.json.Decoder[T]
) -> tuple[Faults, T] | None:
    """(faults, decoded body), or None once an error has been answered (or the client left)."""
    try:
        faults = parse_faults([*config.faults, (header(scope, b"x-emulator-fault") or b"").decode()])
    except FaultError as exc:
        await respond(send, 400, error_body(400, f"X-Emulator-Fault: {exc}", None))
        return None
    content_type = header(scope, b"content-type") or b""
    body = await read_body(receive)
    if body is None:
        return None
    if content_type.split(b";")[0].strip().lower() != JSON:
        await reject(send, invalid_body("Unsupported Media Type: Only 'application/json' is allowed", None))
        return None
    try:
        return faults, decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        await reject(send, _undecodable(body, exc))
        return None


def check_model(config: EmulatorConfig, model: str | None, *, pooling: bool = False) -> None:
    if model is not None and model != config.model:
        if pooling:  # the pooling endpoints word it (and leave `param` out) differently
            raise BadRequest(404, f"The model `{model}` does not exist.", None)
        raise BadRequest(404, f"The model `{model}` does not exist. Valid aliases: {config.model}.", "model")


def check_context(config: EmulatorConfig, prompt_tokens: int, *, pooling: bool = False) -> None:
    """vLLM 0.32 refuses a prompt longer than the context; `max_tokens` is clamped to the room left.

    A generating request needs one token of room; a pooling one (embeddings) may fill the context.
    """
    limit = config.max_model_len
    if prompt_tokens > limit:
        raise BadRequest(
            400,
            f"This model's maximum context length is {limit} tokens. However, your prompt contains "
            f"{prompt_tokens} input tokens, which exceeds this limit even without any output tokens. "
            f"Please reduce the length of the input prompt. (parameter=input_tokens, value={prompt_tokens})",
            "input_tokens",
        )
    if prompt_tokens == limit and not pooling:
        raise BadRequest(400, "max_tokens must be at least 1, got 0.", "max_tokens")


async def header_faults(faults: Faults, send: Send) -> bool:
    """Apply `slow-headers` and `status`; True when the request has been answered."""
    if faults.slow_headers_s > 0:
        await asyncio.sleep(faults.slow_headers_s)
    if faults.status is not None:
        await respond(send, faults.status, error_body(faults.status, "Injected fault (X-Emulator-Fault).", None))
        return True
    return False


def base_request_id(scope: Scope, request_id: str | None) -> str:
    """`X-Request-Id` if the client sent one, else the body's `request_id`, else a fresh hex id."""
    given = header(scope, b"x-request-id")
    return given.decode(errors="replace") if given else (request_id or uuid.uuid4().hex)


@contextlib.asynccontextmanager
async def running(engine: Engine, receive: Receive, *seqs: Sequence) -> AsyncIterator[asyncio.Event]:
    """Submit `seqs`; yields an event set when the client disconnects (which aborts them)."""
    disconnected = asyncio.Event()

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected.set()
                for seq in seqs:
                    engine.abort(seq)
                    waiter = seq.waiter
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
                return

    watcher = asyncio.get_running_loop().create_task(watch())
    for seq in seqs:
        engine.submit(seq)
    try:
        yield disconnected
    finally:
        watcher.cancel()
        for seq in seqs:
            if not seq.done:
                engine.abort(seq)


async def _next_step(*seqs: Sequence) -> None:
    """Sleep until the engine has applied a step that touched one of `seqs` (or they were aborted)."""
    fut = asyncio.get_running_loop().create_future()
    for seq in seqs:
        seq.waiter = fut
    await fut


async def until_done(disconnected: asyncio.Event, *seqs: Sequence) -> bool:
    """Wait for all `seqs` to finish; False when one was aborted or the client went away."""
    while await until_output(disconnected, *seqs):
        for seq in seqs:
            seq.pending.clear()
    return not disconnected.is_set() and not any(seq.aborted for seq in seqs)


async def until_output(disconnected: asyncio.Event, *seqs: Sequence) -> bool:
    """Wait until one of `seqs` has tokens to deliver; False once all are done and delivered, or the client left."""
    while not any(seq.pending for seq in seqs):
        if all(seq.done for seq in seqs):
            return False
        await _next_step(*(seq for seq in seqs if not seq.done))
        if disconnected.is_set():
            return False
    return True


async def cut_stream(
    engine: Engine, send: Send, faults: Faults, out: list[bytes], error: bytes, *seqs: Sequence
) -> None:
    """End a stream at its mid-stream fault, `seqs` aborted: `out`, then `error` (error-mid-stream) or
    nothing more (drop-mid-stream: the response stays incomplete; the server closes the connection)."""
    for seq in seqs:
        engine.abort(seq)
    if faults.error_after == faults.cut_after:
        await send({"type": "http.response.body", "body": b"".join([*out, error]), "more_body": False})
    elif out:
        await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})


async def answer(send: Send, body: bytes, faults: Faults, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """Send a whole (non-streamed) body; a mid-stream fault answers 500 (error) or half the body (drop)."""
    if faults.error_after is not None:
        await respond(send, 500, error_body(500, "Injected fault (X-Emulator-Fault).", None), extra=extra)
        return
    if faults.drop_after is not None:
        headers = [(b"content-type", JSON), (b"content-length", str(len(body)).encode()), *(extra or ())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
        return
    await respond(send, 200, body, extra=extra)
