"""SSE bytes for streamed completions, as vLLM sends them, with the constant parts precomputed.

Each event is `data: {json}\\n\\n`. Chat: a role chunk, one content chunk per engine step, the
last one carrying `finish_reason`/`stop_reason`, then (with `stream_options.include_usage`) a
usage chunk with empty `choices`, then `data: [DONE]`. Completions: the same without the role
chunk, with `text` instead of `delta`.
"""

from __future__ import annotations

import msgspec

from emulator.tokenizer import PIECES, generated_text
from emulator.wire import Usage, error_body

__all__ = ("DONE", "StreamChunks", "error_event")

DONE = b"data: [DONE]\n\n"
_encode = msgspec.json.Encoder().encode
_content_cache: dict[tuple[int, int], bytes] = {}


def _content(offset: int, n: int) -> bytes:
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


class StreamChunks:
    """Builds the events of one streamed response."""

    __slots__ = ("_head", "_mid", "_prompt_tokens", "_tail", "_usage_each", "chat", "offset")

    def __init__(
        self,
        *,
        chat: bool,
        request_id: str,
        created: int,
        model: str,
        offset: int,
        prompt_tokens: int,
        usage_each: bool,
    ):
        self.chat = chat
        self.offset = offset
        self._prompt_tokens = prompt_tokens
        self._usage_each = usage_each
        obj = b"chat.completion.chunk" if chat else b"text_completion"
        self._head = (
            b'data: {"id":'
            + _encode(request_id)
            + b',"object":"'
            + obj
            + b'","created":'
            + str(created).encode()
            + b',"model":'
            + _encode(model)
            + b',"choices":'
        )
        if chat:
            self._mid = b'[{"index":0,"delta":{"content":'
            self._tail = b'},"logprobs":null,"finish_reason":null}]'
        else:
            self._mid = b'[{"index":0,"text":'
            self._tail = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]'

    def _usage(self, completion: int) -> bytes:
        p = self._prompt_tokens
        return b',"usage":' + _encode(Usage(prompt_tokens=p, total_tokens=p + completion, completion_tokens=completion))

    def role(self) -> bytes:
        usage = self._usage(0) if self._usage_each else b""
        return (
            self._head
            + b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
            + usage
            + b"}\n\n"
        )

    def content(self, start: int, n: int, generated: int) -> bytes:
        """A content chunk for tokens [start, start + n); `generated` is the running total."""
        usage = self._usage(generated) if self._usage_each else b""
        return self._head + self._mid + _content(self.offset + start, n) + self._tail + usage + b"}\n\n"

    def final(self, start: int, n: int, generated: int, finish_reason: str) -> bytes:
        usage = self._usage(generated) if self._usage_each else b""
        reason = _encode(finish_reason)
        if self.chat:
            body = b'[{"index":0,"delta":{"content":' + _content(self.offset + start, n) + b'},"logprobs":null'
        else:
            body = b'[{"index":0,"text":' + _content(self.offset + start, n) + b',"logprobs":null'
        return self._head + body + b',"finish_reason":' + reason + b',"stop_reason":null}]' + usage + b"}\n\n"

    def usage(self, completion: int) -> bytes:
        return self._head + b"[]" + self._usage(completion) + b"}\n\n"
