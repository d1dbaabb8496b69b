"""`POST /v1/chat/completions` and `/v1/completions`: validate, schedule, stream or answer."""

from __future__ import annotations

import asyncio
import uuid

import msgspec

from emulator.asgi import JSON, Receive, Scope, Send, header, read_body, respond
from emulator.bodies import ChatChoice, ChatCompletion, ChatResponseMessage, Completion, CompletionChoice
from emulator.config import EmulatorConfig
from emulator.engine import Engine
from emulator.faults import FaultError, Faults, parse_faults
from emulator.lengths import natural_length, output_plan
from emulator.scheduler import Sequence
from emulator.sse import DONE, StreamChunks, error_event
from emulator.tokenizer import PIECES, count_tokens, generated_text, render_chat
from emulator.wire import ChatRequest, CompletionRequest, PromptTokensDetails, Usage, error_body

__all__ = ("handle_generate",)

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_encode = msgspec.json.Encoder().encode
_chat_decoder = msgspec.json.Decoder(ChatRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def _prompt(req: ChatRequest | CompletionRequest) -> tuple[str, int]:
    if isinstance(req, ChatRequest):
        text = render_chat([(m.role, m.text()) for m in req.messages])
        return text, count_tokens(text)
    prompt = req.prompt
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt)
    if prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return str(prompt), len(prompt)
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0], count_tokens(prompt[0])
    raise _BadRequest(400, "The emulator accepts one prompt per request (a string or a list of token ids).", "prompt")


def _validate(config: EmulatorConfig, req: ChatRequest | CompletionRequest, prompt_tokens: int) -> int | None:
    if req.model is not None and req.model != config.model:
        raise _BadRequest(404, f"The model `{req.model}` does not exist.", "model")
    if req.stream_options is not None and not req.stream:
        raise _BadRequest(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    if req.n != 1:
        raise _BadRequest(400, "The emulator only supports n=1.", "n")
    max_tokens = req.max_tokens
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        max_tokens = req.max_completion_tokens
    if max_tokens is not None and max_tokens < 1:
        raise _BadRequest(400, f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    if req.min_tokens < 0 or (max_tokens is not None and req.min_tokens > max_tokens):
        raise _BadRequest(400, "min_tokens must be >= 0 and <= max_tokens.", "min_tokens")
    limit = config.max_model_len
    if prompt_tokens + (max_tokens or 1) > limit:
        raise _BadRequest(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_tokens + (max_tokens or 0)} tokens ({prompt_tokens} in the messages, {max_tokens or 0} in "
            "the completion). Please reduce the length of the messages or completion.",
            "input_tokens",
        )
    return max_tokens


async def handle_generate(config: EmulatorConfig, engine: Engine, scope: Scope, receive: Receive, send: Send) -> None:
    chat = scope["path"] == "/v1/chat/completions"
    try:
        faults = parse_faults([*config.faults, (header(scope, b"x-emulator-fault") or b"").decode()])
    except FaultError as exc:
        await respond(send, 400, error_body(400, f"X-Emulator-Fault: {exc}", None))
        return
    content_type = header(scope, b"content-type") or b""
    body = await read_body(receive)
    if body is None:
        return
    try:
        if not content_type.split(b";")[0].strip().lower() == JSON:
            raise _BadRequest(400, "Unsupported Media Type: Only 'application/json' is allowed")
        try:
            req: ChatRequest | CompletionRequest = (_chat_decoder if chat else _completion_decoder).decode(body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise _BadRequest(400, f"Invalid request body: {exc}") from None
        prompt_text, prompt_tokens = _prompt(req)
        max_tokens = _validate(config, req, prompt_tokens)
    except _BadRequest as exc:
        await respond(send, exc.status, error_body(exc.status, exc.message, exc.param))
        return
    if faults.slow_headers_s > 0:
        await asyncio.sleep(faults.slow_headers_s)
    if faults.status is not None:
        await respond(send, faults.status, error_body(faults.status, "Injected fault (X-Emulator-Fault).", None))
        return

    given_id = header(scope, b"x-request-id")
    base_id = given_id.decode(errors="replace") if given_id else (req.request_id or uuid.uuid4().hex)
    request_id = ("chatcmpl-" if chat else "cmpl-") + base_id
    natural = natural_length(prompt_text.encode(), config.mean_output_tokens, config.output_spread)
    n_out, reason = output_plan(
        natural=natural,
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        ignore_eos=req.ignore_eos,
        room=config.max_model_len - prompt_tokens,
    )
    seq = Sequence(request_id, prompt_tokens, n_out, reason, engine.now())
    offset = natural % len(PIECES)
    created = int(engine.now())
    extra = [(b"x-request-id", base_id.encode())]
    disconnected = asyncio.Event()

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected.set()
                engine.abort(seq)
                waiter = seq.waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
                return

    watcher = asyncio.get_running_loop().create_task(watch())
    engine.submit(seq)
    try:
        if req.stream:
            opts = req.stream_options
            include_usage = bool(opts and opts.include_usage)
            chunks = StreamChunks(
                chat=chat,
                request_id=request_id,
                created=created,
                model=config.model,
                offset=offset,
                prompt_tokens=prompt_tokens,
                usage_each=include_usage and bool(opts and opts.continuous_usage_stats),
            )
            await _stream(engine, seq, chunks, send, faults, include_usage, extra, disconnected)
        else:
            await _answer(config, engine, seq, chat, created, offset, send, faults, extra, disconnected)
    finally:
        watcher.cancel()
        if not seq.done:
            engine.abort(seq)


async def _wait(seq: Sequence) -> None:
    fut = asyncio.get_running_loop().create_future()
    seq.waiter = fut
    await fut


async def _stream(
    engine: Engine,
    seq: Sequence,
    chunks: StreamChunks,
    send: Send,
    faults: Faults,
    include_usage: bool,
    extra: list[tuple[bytes, bytes]],
    disconnected: asyncio.Event,
) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + extra})
    sent = 0  # tokens sent
    n_chunks = 0  # content chunks sent
    first = chunks.chat
    fault_at = min(x for x in (faults.error_after, faults.drop_after, 1 << 62) if x is not None)
    while True:
        if not seq.pending:
            if seq.done:
                break
            await _wait(seq)
            if disconnected.is_set():
                return
            continue
        batch, seq.pending = seq.pending, []
        out: list[bytes] = []
        if first:
            out.append(chunks.role())
            first = False
        last = len(batch) - 1
        for i, n in enumerate(batch):
            if n_chunks == fault_at:
                break
            if i == last and seq.done and not seq.aborted:
                out.append(chunks.final(sent, n, sent + n, seq.finish_reason))
            else:
                out.append(chunks.content(sent, n, sent + n))
            sent += n
            n_chunks += 1
        if n_chunks == fault_at and not (seq.done and not seq.pending and sent == seq.output_tokens):
            engine.abort(seq)
            if faults.error_after == fault_at:
                out.append(error_event(500, "Injected fault: error in the middle of the stream (X-Emulator-Fault)."))
                out.append(DONE)
                await send({"type": "http.response.body", "body": b"".join(out), "more_body": False})
            elif out:
                await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
            return  # drop: return with the response incomplete; the server closes the connection
        await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
    if seq.aborted:
        return
    tail = chunks.usage(seq.generated) + DONE if include_usage else DONE
    await send({"type": "http.response.body", "body": tail, "more_body": False})


async def _answer(
    config: EmulatorConfig,
    engine: Engine,
    seq: Sequence,
    chat: bool,
    created: int,
    offset: int,
    send: Send,
    faults: Faults,
    extra: list[tuple[bytes, bytes]],
    disconnected: asyncio.Event,
) -> None:
    while not seq.done:
        await _wait(seq)
        if disconnected.is_set():
            return
    seq.pending.clear()
    if seq.aborted:
        return
    text = generated_text(offset, seq.generated)
    p, c = seq.prompt_tokens, seq.generated
    details = PromptTokensDetails(cached_tokens=0) if config.prompt_tokens_details else None
    usage = Usage(prompt_tokens=p, total_tokens=p + c, completion_tokens=c, prompt_tokens_details=details)
    body: bytes
    if chat:
        body = _encode(
            ChatCompletion(
                id=seq.request_id,
                created=created,
                model=config.model,
                choices=[ChatChoice(message=ChatResponseMessage(content=text), finish_reason=seq.finish_reason)],
                usage=usage,
            )
        )
    else:
        body = _encode(
            Completion(
                id=seq.request_id,
                created=created,
                model=config.model,
                choices=[CompletionChoice(text=text, finish_reason=seq.finish_reason)],
                usage=usage,
            )
        )
    if faults.error_after is not None:
        await respond(send, 500, error_body(500, "Injected fault (X-Emulator-Fault).", None), extra=extra)
        return
    if faults.drop_after is not None:
        headers = [(b"content-type", JSON), (b"content-length", str(len(body)).encode()), *extra]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
        return
    await respond(send, 200, body, extra=extra)
