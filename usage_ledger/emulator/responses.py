"""`POST /v1/responses` (the Responses API), stream and not, as vLLM 0.32 serves a plain text model.

The prompt is `instructions` as a system message followed by the `input` messages (a string is
one user message); the answer is one assistant message. Usage, statuses and stream events: docs/emulator.md.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid

import msgspec

from usage_ledger.emulator.asgi import Receive, Scope, Send
from usage_ledger.emulator.config import EmulatorConfig
from usage_ledger.emulator.engine import Engine
from usage_ledger.emulator.faults import Faults
from usage_ledger.emulator.lengths import natural_length, output_plan
from usage_ledger.emulator.lifecycle import (
    SSE_HEADERS,
    STREAM_FAULT,
    BadRequest,
    answer,
    base_request_id,
    check_context,
    check_model,
    cut_stream,
    decode_request,
    header_faults,
    reject,
    running,
    until_done,
    until_output,
)
from usage_ledger.emulator.per_request import timing_metrics
from usage_ledger.emulator.responses_wire import (
    ContentPartEvent,
    ErrorEvent,
    IncompleteDetails,
    InputTokensDetails,
    OutputItemEvent,
    OutputMessage,
    OutputText,
    OutputTextDelta,
    OutputTextDone,
    OutputTokensDetails,
    ResponseEvent,
    ResponsesRequest,
    ResponsesResponse,
    ResponseUsage,
)
from usage_ledger.emulator.scheduler import Sequence
from usage_ledger.emulator.tokenizer import PIECES, count_tokens, generated_text, render_chat

__all__ = ("handle_responses",)

_encode = msgspec.json.Encoder().encode
_decoder = msgspec.json.Decoder(ResponsesRequest)


def _prompt(req: ResponsesRequest) -> str:
    messages: list[tuple[str, str]] = []
    if req.instructions:
        messages.append(("system", req.instructions))
    if isinstance(req.input, str):
        messages.append(("user", req.input))
    else:
        messages.extend((item.role or "user", item.text()) for item in req.input)
    return render_chat(messages)


_NONE = msgspec.Raw(b'"none"')


def _tool_choice(req: ResponsesRequest) -> msgspec.Raw:
    """vLLM's echo: without tools, `auto` (the default) becomes `none`."""
    no_tools = bytes(req.tools).strip() in (b"[]", b"null")
    if no_tools and bytes(req.tool_choice).replace(b" ", b"") in (b'"auto"', b'"none"'):
        return _NONE
    return req.tool_choice


class _Call:
    """One Responses API call: the request, its sequence, and what the body echoes back."""

    __slots__ = ("config", "created", "max_tokens", "message_id", "offset", "req", "response_id", "seq")

    def __init__(self, config: EmulatorConfig, req: ResponsesRequest, seq: Sequence, created: int, offset: int):
        self.config = config
        self.req = req
        self.seq = seq
        self.created = created
        self.offset = offset
        self.response_id = seq.request_id
        self.message_id = "msg_" + uuid.uuid4().hex
        room = config.max_model_len - seq.prompt_tokens
        self.max_tokens = room if req.max_output_tokens is None else min(req.max_output_tokens, room)

    def response(self, status: str, output: list[OutputMessage], usage: ResponseUsage | None) -> ResponsesResponse:
        req = self.req
        metrics = timing_metrics(self.seq) if usage is not None and self.config.enable_per_request_metrics else None
        return ResponsesResponse(
            id=self.response_id,
            created_at=self.created,
            incomplete_details=IncompleteDetails("max_output_tokens") if status == "incomplete" else None,
            instructions=req.instructions,
            metadata=req.metadata,
            model=self.config.model,
            output=output,
            parallel_tool_calls=True if req.parallel_tool_calls is None else req.parallel_tool_calls,
            temperature=1.0 if req.temperature is None else req.temperature,
            tool_choice=_tool_choice(req),
            tools=req.tools,
            top_p=1.0 if req.top_p is None else req.top_p,
            background=bool(req.background),
            max_output_tokens=self.max_tokens,
            max_tool_calls=req.max_tool_calls,
            previous_response_id=req.previous_response_id,
            prompt=req.prompt,
            reasoning=req.reasoning,
            service_tier=req.service_tier,
            status=status,
            text=req.text,
            top_logprobs=req.top_logprobs if req.include and "message.output_text.logprobs" in req.include else None,
            truncation=req.truncation or "disabled",
            usage=usage,
            user=req.user,
            metrics=msgspec.UNSET if metrics is None else metrics,
            presence_penalty=0.0 if req.presence_penalty is None else req.presence_penalty,
            frequency_penalty=0.0 if req.frequency_penalty is None else req.frequency_penalty,
        )

    def final(self, output: list[OutputMessage]) -> ResponsesResponse:
        seq = self.seq
        usage = ResponseUsage(
            input_tokens=seq.prompt_tokens,
            input_tokens_details=InputTokensDetails(),
            output_tokens=seq.generated,
            output_tokens_details=OutputTokensDetails(),
            total_tokens=seq.prompt_tokens + seq.generated,
        )
        return self.response("incomplete" if seq.finish_reason == "length" else "completed", output, usage)

    def message(self, text: str, status: str) -> OutputMessage:
        content = [OutputText(text=text)] if text else []
        return OutputMessage(id=self.message_id, content=content, status=status)


async def handle_responses(config: EmulatorConfig, engine: Engine, scope: Scope, receive: Receive, send: Send) -> None:
    decoded = await decode_request(config, scope, receive, send, _decoder)
    if decoded is None:
        return
    faults, req = decoded
    try:
        check_model(config, req.model)
        if req.max_output_tokens is not None and req.max_output_tokens < 1:
            raise BadRequest(
                400, f"max_output_tokens must be at least 1, got {req.max_output_tokens}.", "max_output_tokens"
            )
        prompt_text = _prompt(req)
        prompt_tokens = count_tokens(prompt_text)
        check_context(config, prompt_tokens)
    except BadRequest as exc:
        await reject(send, exc)
        return
    if await header_faults(faults, send):
        return
    response_id = req.request_id or "resp_" + base_request_id(scope, None)
    natural = natural_length(prompt_text.encode(), config.mean_output_tokens, config.output_spread)
    n_out, reason = output_plan(
        natural=natural,
        max_tokens=req.max_output_tokens,
        min_tokens=0,
        ignore_eos=req.ignore_eos,
        room=config.max_model_len - prompt_tokens,
    )
    seq = Sequence(response_id, prompt_tokens, n_out, reason, engine.now())
    call = _Call(config, req, seq, int(engine.now()), natural % len(PIECES))
    async with running(engine, receive, seq) as disconnected:
        if req.stream:
            await _stream(engine, call, send, faults, disconnected)
        elif await until_done(disconnected, seq):
            text = generated_text(call.offset, seq.generated)
            await answer(send, _encode(call.final([call.message(text, "completed")])), faults)


def _event(kind: str, event: msgspec.Struct) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _encode(event) + b"\n\n"


async def _stream(engine: Engine, call: _Call, send: Send, faults: Faults, disconnected: asyncio.Event) -> None:
    seq, item_id = call.seq, call.message_id
    number = itertools.count()  # sequence_number, across the whole stream

    def response(kind: str, body: ResponsesResponse) -> bytes:
        return _event(kind, ResponseEvent(response=body, sequence_number=next(number), type=kind))

    def item(kind: str, message: OutputMessage) -> bytes:
        return _event(kind, OutputItemEvent(item=message, output_index=0, sequence_number=next(number), type=kind))

    def part(kind: str, text: OutputText) -> bytes:
        return _event(
            kind,
            ContentPartEvent(
                content_index=0, item_id=item_id, output_index=0, part=text, sequence_number=next(number), type=kind
            ),
        )

    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    initial = call.response("in_progress", [], None)
    head = response("response.created", initial) + response("response.in_progress", initial)
    await send({"type": "http.response.body", "body": head, "more_body": True})
    sent = 0
    n_chunks = 0
    fault_at = faults.cut_after
    while await until_output(disconnected, seq):
        batch, seq.pending = seq.pending, []
        out: list[bytes] = []
        if sent == 0:
            out.append(item("response.output_item.added", call.message("", "in_progress")))
            out.append(part("response.content_part.added", OutputText(text="", logprobs=[])))
        for n in batch:
            if n_chunks == fault_at:
                break
            delta = OutputTextDelta(
                content_index=0,
                delta=generated_text(call.offset + sent, n),
                item_id=item_id,
                logprobs=[],
                output_index=0,
                sequence_number=next(number),
            )
            out.append(_event(delta.type, delta))
            sent += n
            n_chunks += 1
        if n_chunks == fault_at and not (seq.done and sent == seq.output_tokens):
            error = ErrorEvent(code="500", message=STREAM_FAULT, sequence_number=next(number))
            await cut_stream(engine, send, faults, out, _event(error.type, error), seq)
            return
        await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
    if disconnected.is_set() or seq.aborted:
        return
    text = generated_text(call.offset, seq.generated)
    done = call.message(text, "completed")
    text_done = OutputTextDone(
        content_index=0, item_id=item_id, logprobs=[], output_index=0, sequence_number=next(number), text=text
    )
    tail = [
        _event(text_done.type, text_done),
        part("response.content_part.done", OutputText(text=text)),
        item("response.output_item.done", done),
        response("response.completed", call.final([done])),
    ]
    await send({"type": "http.response.body", "body": b"".join(tail), "more_body": False})
