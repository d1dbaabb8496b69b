"""`POST /v1/chat/completions` and `/v1/completions`: validate, schedule, stream or answer."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import msgspec

from usage_ledger.emulator.asgi import Receive, Scope, Send
from usage_ledger.emulator.bodies import ChatChoice, ChatCompletion, ChatResponseMessage, Completion, CompletionChoice
from usage_ledger.emulator.config import EmulatorConfig
from usage_ledger.emulator.engine import Engine
from usage_ledger.emulator.faults import Faults
from usage_ledger.emulator.grades import grade_of
from usage_ledger.emulator.lengths import natural_length, output_plan
from usage_ledger.emulator.lifecycle import (
    SSE_HEADERS,
    STREAM_FAULT,
    BadRequest,
    answer,
    base_request_id,
    cut_stream,
    decode_request,
    header_faults,
    reject,
    running,
    until_done,
    until_output,
)
from usage_ledger.emulator.logprobs import chat_logprobs, completion_logprobs, prompt_logprobs, prompt_pieces
from usage_ledger.emulator.per_request import PerRequestMetrics, per_request_metrics
from usage_ledger.emulator.scheduler import Sequence
from usage_ledger.emulator.sse import DONE, StreamChunks, error_event
from usage_ledger.emulator.tokenizer import PIECES, Answer, decode, lead_pieces
from usage_ledger.emulator.validate import prompt_of, sample_logprobs, validate
from usage_ledger.emulator.version import system_fingerprint
from usage_ledger.emulator.wire import ChatRequest, CompletionRequest, PromptTokensDetails, Usage

__all__ = ("handle_generate",)

_encode = msgspec.json.Encoder().encode
_chat_decoder = msgspec.json.Decoder(ChatRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


@dataclasses.dataclass(frozen=True, slots=True)
class _Choice:
    """One of the `n` choices: an engine sequence of its own (vLLM's parallel sampling)."""

    index: int
    seq: Sequence
    answer: Answer  # its text: a grade line (when on), then the passage rotation
    stop_reason: str | int | None  # the stop string / token id a natural stop reports


@dataclasses.dataclass(slots=True)
class _Call:
    """One chat/completions call: the request, its choices and what its answer shows."""

    config: EmulatorConfig
    req: ChatRequest | CompletionRequest
    request_id: str
    choices: list[_Choice]
    created: int
    prompt: tuple[str, list[int] | None]  # the text, and the token ids when the client sent ids

    @property
    def echo(self) -> bool:
        return isinstance(self.req, CompletionRequest) and bool(self.req.echo)  # chat `echo` is not emulated

    @property
    def prompt_text(self) -> str:
        text, ids = self.prompt
        return decode(ids) if ids is not None else text

    @property
    def pieces(self) -> list[str]:
        """The prompt's tokens as text (for echo and prompt logprobs only: a long prompt has many)."""
        return prompt_pieces(*self.prompt)

    @property
    def seqs(self) -> list[Sequence]:
        return [c.seq for c in self.choices]

    def metrics(self) -> PerRequestMetrics | None:
        """The per-request block: none for n > 1 (vLLM cannot attribute it to one stream)."""
        if len(self.choices) != 1:
            return None
        only = self.choices[0]
        # a stop string is caught by vLLM's detokenizer, not the engine, so the engine's
        # spec-decode counters never reach the response (`speculative_decoding: null`)
        return per_request_metrics(self.config, only.seq, spec_decoding=not isinstance(only.stop_reason, str))

    @property
    def chat(self) -> bool:
        return isinstance(self.req, ChatRequest)


def _prompt_top(req: ChatRequest | CompletionRequest) -> int | None:
    """vLLM's prompt_logprobs count: asked for, or (completions) `echo` with `logprobs`."""
    if req.prompt_logprobs is not None:
        return req.prompt_logprobs
    return req.logprobs if isinstance(req, CompletionRequest) and req.echo else None


def _grade_lead(config: EmulatorConfig, req: ChatRequest | CompletionRequest, key: bytes) -> tuple[str, ...]:
    """The grade line's tokens (none unless `grade_line`); `key` is the choice's (the prompt, `#i` for i > 0)."""
    if not config.grade_line:
        return ()
    seed = req.seed if req.seed is not None else config.seed
    return lead_pieces("Grade: " + grade_of(config.model, seed, key))


def _usage_flags(config: EmulatorConfig, req: ChatRequest | CompletionRequest) -> tuple[bool, bool]:
    """vLLM's `should_include_usage`: (usage chunk, usage on every chunk); forced = (True, True)."""
    if config.enable_force_include_usage:
        return True, True
    opts = req.stream_options
    include = bool(opts and opts.include_usage)
    return include, include and bool(opts and opts.continuous_usage_stats)


async def handle_generate(config: EmulatorConfig, engine: Engine, scope: Scope, receive: Receive, send: Send) -> None:
    chat = scope["path"] == "/v1/chat/completions"
    decoded: tuple[Faults, ChatRequest | CompletionRequest] | None
    if chat:
        decoded = await decode_request(config, scope, receive, send, _chat_decoder)
    else:
        decoded = await decode_request(config, scope, receive, send, _completion_decoder)
    if decoded is None:
        return
    faults, req = decoded
    try:
        prompt_text, prompt_tokens, prompt_ids = prompt_of(req)
        max_tokens = validate(config, req, prompt_tokens)
    except BadRequest as exc:
        await reject(send, exc)
        return
    if await header_faults(faults, send):
        return

    base_id = base_request_id(scope, req.request_id)
    request_id = ("chatcmpl-" if chat else "cmpl-") + base_id
    now = engine.now()
    choices: list[_Choice] = []
    skip_prefix_cache = _prompt_top(req) is not None  # vLLM must compute every prompt token's logits
    for i in range(req.n):
        key = prompt_text.encode() + (b"" if i == 0 else b"#%d" % i)  # each choice its own length
        natural = natural_length(key, config.mean_output_tokens, config.output_spread)
        n_out, reason = output_plan(
            natural=natural,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos,
            room=config.max_model_len - prompt_tokens,
        )
        seq_id = request_id if req.n == 1 else f"{i}_{request_id}"  # vLLM's child request ids
        seq = Sequence(seq_id, prompt_tokens, n_out, reason, now, skip_prefix_cache=skip_prefix_cache)
        text = Answer(natural % len(PIECES), _grade_lead(config, req, key))
        choices.append(_Choice(i, seq, text, req.stop_reason() if reason == "stop" else None))
    call = _Call(config, req, request_id, choices, int(now), (prompt_text, prompt_ids))
    extra = [(b"x-request-id", base_id.encode())]
    async with running(engine, receive, *call.seqs) as disconnected:
        if req.stream:
            include_usage, usage_each = _usage_flags(config, req)
            chunks = StreamChunks(
                chat=chat,
                request_id=request_id,
                created=call.created,
                model=config.model,
                answers=[c.answer for c in choices],
                prompt_tokens=prompt_tokens,
                include_usage=include_usage,
                usage_each=usage_each,
                fingerprint=system_fingerprint(config),
                logprobs=sample_logprobs(req),
                echo=(call.prompt_text, call.pieces) if call.echo else None,
            )
            await _stream(call, engine, chunks, send, faults, include_usage, extra, disconnected)
        elif await until_done(disconnected, *call.seqs):
            await answer(send, _body(call), faults, extra)


async def _stream(
    call: _Call,
    engine: Engine,
    chunks: StreamChunks,
    send: Send,
    faults: Faults,
    include_usage: bool,
    extra: list[tuple[bytes, bytes]],
    disconnected: asyncio.Event,
) -> None:
    seqs = call.seqs
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + extra})
    sent = [0] * len(seqs)  # tokens sent, per choice
    n_chunks = 0  # content chunks sent
    first = chunks.chat  # the role chunks (one per choice) go first
    fault_at = faults.cut_after
    while await until_output(disconnected, *seqs):
        out: list[bytes] = []
        if first:
            out.extend(chunks.role(c.index) for c in call.choices)
            first = False
        # one event per choice and engine step, the choices interleaved step by step as vLLM's are
        batches = []
        for c in call.choices:
            batches.append(c.seq.pending)
            c.seq.pending = []
        for j in range(max(map(len, batches))):
            for c, batch in zip(call.choices, batches, strict=True):
                if j >= len(batch) or n_chunks == fault_at:
                    continue
                seq, i, n = c.seq, c.index, batch[j]
                done = sent[i]
                if j == len(batch) - 1 and seq.done and not seq.aborted:
                    out.append(chunks.final(i, done, n, done + n, seq.finish_reason, c.stop_reason))
                else:
                    out.append(chunks.content(i, done, n, done + n))
                sent[i] += n
                n_chunks += 1
        finished = all(
            seq.done and not seq.pending and sent[c.index] == seq.output_tokens
            for c, seq in zip(call.choices, seqs, strict=True)
        )
        if n_chunks == fault_at and not finished:
            await cut_stream(engine, send, faults, out, error_event(500, STREAM_FAULT) + DONE, *seqs)
            return
        await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
    if disconnected.is_set() or any(seq.aborted for seq in seqs):
        return
    tail = DONE
    if include_usage:
        # metrics ride on the usage-only chunk, so a stream without usage carries none (as in vLLM)
        tail = chunks.usage(_usage(call), call.metrics()) + DONE
    await send({"type": "http.response.body", "body": tail, "more_body": False})


def _usage(call: _Call) -> Usage:
    p, c = call.choices[0].seq.prompt_tokens, sum(seq.generated for seq in call.seqs)  # the prompt counts once
    details = None
    if call.config.prompt_tokens_details:
        # chat reports the cache-creation count; completions set cached_tokens only (a stream drops the None)
        details = PromptTokensDetails(cached_tokens=0, created_cache_tokens=0 if call.chat else None)
    return Usage(prompt_tokens=p, total_tokens=p + c, completion_tokens=c, prompt_tokens_details=details)


def _body(call: _Call) -> bytes:
    config = call.config
    top, prompt_top = sample_logprobs(call.req), _prompt_top(call.req)
    prompt_lp = prompt_logprobs(call.pieces, prompt_top) if prompt_top is not None else None
    shared: dict[str, Any] = {
        "id": call.request_id,
        "created": call.created,
        "model": config.model,
        "usage": _usage(call),
        "metrics": call.metrics(),
        "system_fingerprint": system_fingerprint(config),
    }
    if call.chat:
        chat_choices = [
            ChatChoice(
                index=c.index,
                message=ChatResponseMessage(content=c.answer.text(0, c.seq.generated)),
                finish_reason=c.seq.finish_reason,
                stop_reason=c.stop_reason,
                logprobs=None if top is None else chat_logprobs(c.answer, 0, c.seq.generated, top),
            )
            for c in call.choices
        ]
        return _encode(ChatCompletion(choices=chat_choices, prompt_logprobs=prompt_lp, **shared))
    echo = call.pieces if call.echo else None
    completion_choices = [
        CompletionChoice(
            index=c.index,
            text=(call.prompt_text if call.echo else "") + c.answer.text(0, c.seq.generated),
            finish_reason=c.seq.finish_reason,
            stop_reason=c.stop_reason,
            logprobs=None if top is None else completion_logprobs(c.answer, 0, c.seq.generated, top, echo=echo),
            prompt_logprobs=prompt_lp,
        )
        for c in call.choices
    ]
    return _encode(Completion(choices=completion_choices, **shared))
