"""SSE bytes for streamed chat/completions, as vLLM 0.32 sends them, constant parts precomputed.

Each event is `data: {json}\\n\\n`; which keys each chunk carries is in docs/emulator.md ("Shapes worth knowing").
"""

from __future__ import annotations

import msgspec

from usage_ledger.emulator.logprobs import chat_logprobs, completion_logprobs
from usage_ledger.emulator.per_request import PerRequestMetrics, exclude_none
from usage_ledger.emulator.tokenizer import PIECES, Answer, generated_text
from usage_ledger.emulator.wire import Usage, error_body

__all__ = ("DONE", "StreamChunks", "error_event")

DONE = b"data: [DONE]\n\n"
_encode = msgspec.json.Encoder().encode
_content_cache: dict[tuple[int, int], bytes] = {}


def _content(answer: Answer, start: int, n: int) -> bytes:
    if start < len(answer.lead):  # the grade line: once per answer, not worth a cache entry
        return _encode(answer.text(start, n))
    offset = answer.offset + start
    key = (offset % len(PIECES), n)
    cached = _content_cache.get(key)
    if cached is None:
        cached = _encode(generated_text(offset, n))
        if n <= 16:
            _content_cache[key] = cached
    return cached


def error_event(status: int, message: str) -> bytes:
    """An in-stream error event (vLLM sends it, then `data: [DONE]`)."""
    return b"data: " + error_body(status, message) + b"\n\n"


class _UsageChunk(msgspec.Struct, kw_only=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[None]
    usage: Usage
    system_fingerprint: str | None = None
    metrics: PerRequestMetrics | None = None


class StreamChunks:
    """Builds the events of one streamed response (one choice per `answers` entry, `n` > 1 too).

    `logprobs` (the number of alternatives, None when not asked) puts vLLM's logprobs on each
    content chunk; `echo` (completions) starts each choice's first content chunk with the
    prompt; the finish chunk carries `system_fingerprint` unless a usage chunk follows (which
    then does).
    """

    __slots__ = (
        "_answers",
        "_created",
        "_echo",
        "_echoed",
        "_fingerprint",
        "_head",
        "_ids",
        "_include_usage",
        "_logprobs",
        "_model",
        "_object",
        "_open",
        "_prompt_tokens",
        "_request_id",
        "_text_at",
        "_usage_each",
        "chat",
    )

    def __init__(
        self,
        *,
        chat: bool,
        request_id: str,
        created: int,
        model: str,
        answers: list[Answer],
        prompt_tokens: int,
        include_usage: bool,
        usage_each: bool,
        fingerprint: str | None,
        logprobs: int | None = None,
        echo: tuple[str, list[str]] | None = None,
    ):
        self.chat = chat
        self._answers = answers  # per choice: its text
        self._request_id = request_id
        self._created = created
        self._model = model
        self._prompt_tokens = prompt_tokens
        self._include_usage = include_usage
        self._usage_each = usage_each
        self._fingerprint = fingerprint
        self._logprobs = logprobs
        self._echo = echo  # (prompt text, prompt tokens as text), sent with each choice's first chunk
        self._echoed = [echo is None] * len(answers)
        self._text_at = [0] * len(answers)  # completions logprobs: text offset of each choice's next token
        self._object = "chat.completion.chunk" if chat else "text_completion"
        self._head = (
            b'data: {"id":'
            + _encode(request_id)
            + b',"object":"'
            + self._object.encode()
            + b'","created":'
            + str(created).encode()
            + b',"model":'
            + _encode(model)
            + b',"choices":[{"index":'
        )
        # what closes a choice after its finish; a content chunk's finish is null (chat sends no stop_reason)
        self._ids = b',"token_ids":null}]' if chat else b',"prompt_token_ids":null,"token_ids":null}]'
        self._open = b',"finish_reason":null' + (b"" if chat else b',"stop_reason":null') + self._ids

    def _usage(self, completion: int) -> bytes:
        if not self._usage_each:
            return b""
        p = self._prompt_tokens
        counts = b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d' % (p, p + completion, completion)
        # chat passes completion_tokens_details (None without a reasoning parser) explicitly
        return b',"usage":' + counts + (b',"completion_tokens_details":null}' if self.chat else b"}")

    def role(self, index: int) -> bytes:
        return (
            self._head
            + b"%d" % index
            + b',"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
            + self._usage(0)
            + b',"prompt_token_ids":null,"prompt_text":null}\n\n'
        )

    def _text_and_logprobs(self, index: int, start: int, n: int) -> tuple[bytes, bytes]:
        answer = self._answers[index]
        echo = None
        if not self._echoed[index]:
            self._echoed[index] = True
            echo = self._echo
        text = _content(answer, start, n) if echo is None else _encode(echo[0] + answer.text(start, n))
        top = self._logprobs
        if top is None:
            return text, b"null"
        if self.chat:
            return text, _encode(chat_logprobs(answer, start, n, top))
        at = self._text_at[index]
        lp = completion_logprobs(answer, start, n, top, text_offset=at, echo=None if echo is None else echo[1])
        if lp.tokens:
            self._text_at[index] = lp.text_offset[-1] + len(lp.tokens[-1])
        return text, _encode(lp)

    def _choice(self, index: int, text: bytes) -> bytes:
        return self._head + b"%d" % index + (b',"delta":{"content":' + text + b"}" if self.chat else b',"text":' + text)

    def content(self, index: int, start: int, n: int, generated: int) -> bytes:
        """A content chunk of choice `index` for its tokens [start, start + n); `generated`: its running total."""
        if self._logprobs is None and self._echoed[index]:  # the common case, without the detour
            text, logprobs = _content(self._answers[index], start, n), b"null"
        else:
            text, logprobs = self._text_and_logprobs(index, start, n)
        return self._choice(index, text) + b',"logprobs":' + logprobs + self._open + self._usage(generated) + b"}\n\n"

    def final(
        self, index: int, start: int, n: int, generated: int, finish_reason: str, stop_reason: str | int | None
    ) -> bytes:
        """The chunk with `finish_reason`; `stop_reason` is the stop string or token id that ended it."""
        text, logprobs = self._text_and_logprobs(index, start, n)
        reason = b',"finish_reason":' + _encode(finish_reason) + b',"stop_reason":' + _encode(stop_reason)
        fingerprint = b""
        if not self._include_usage and self._fingerprint is not None:
            fingerprint = b',"system_fingerprint":' + _encode(self._fingerprint)
        choice = self._choice(index, text) + b',"logprobs":' + logprobs + reason + self._ids
        return choice + self._usage(generated) + fingerprint + b"}\n\n"

    def usage(self, usage: Usage, metrics: PerRequestMetrics | None) -> bytes:
        """The usage-only chunk (`choices: []`), with `exclude_none` as vLLM dumps it (a None count drops out)."""
        chunk = _UsageChunk(
            id=self._request_id,
            object=self._object,
            created=self._created,
            model=self._model,
            choices=[],
            usage=usage,
            system_fingerprint=self._fingerprint,
            metrics=metrics,
        )
        return b"data: " + _encode(exclude_none(msgspec.to_builtins(chunk))) + b"\n\n"
