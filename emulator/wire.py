"""vLLM's OpenAI-compatible wire format as msgspec Structs (requests lenient, responses exact)."""

from __future__ import annotations

import msgspec

__all__ = (
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "ContentPart",
    "DetokenizeRequest",
    "ErrorInfo",
    "ErrorResponse",
    "StreamOptions",
    "TokenizeRequest",
    "Usage",
    "error_body",
)


# -- requests (unknown fields are accepted and ignored, as vLLM does) -------------------------
class ContentPart(msgspec.Struct):
    type: str = "text"
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content if part.type == "text")


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class _Sampling(msgspec.Struct, kw_only=True):
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    request_id: str | None = None


class ChatRequest(_Sampling, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | list[int | str]
    echo: bool = False


class TokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[int]


# -- responses -----------------------------------------------------------------------------
class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int | None = None


class Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ErrorInfo(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(msgspec.Struct):
    error: ErrorInfo


_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailable"}
_encoder = msgspec.json.Encoder()


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    """vLLM's error body: `{"error": {"message", "type", "param", "code"}}`."""
    kind = _ERROR_TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")
    return _encoder.encode(ErrorResponse(ErrorInfo(message=message, type=kind, param=param, code=status)))
