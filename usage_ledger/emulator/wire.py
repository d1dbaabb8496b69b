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
    "NamedToolChoice",
    "PromptTokensDetails",
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
    # vLLM's defaults: `"stream_options": {}` asks for nothing
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class NamedFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct):
    function: NamedFunction
    type: str = "function"


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
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    seed: int | None = None  # vLLM's per-request sampling seed; here it only picks the grade line's label

    def stop_reason(self) -> str | int | None:
        """What a natural stop reports: the first stop string or stop token id asked for, else None (EOS)."""
        if isinstance(self.stop, str):
            return self.stop
        if self.stop:
            return self.stop[0]
        return self.stop_token_ids[0] if self.stop_token_ids else None


class ChatRequest(_Sampling, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    tools: list[msgspec.Raw] | None = None
    tool_choice: str | NamedToolChoice | msgspec.UnsetType | None = msgspec.UNSET


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | list[int | str]
    echo: bool | None = False
    logprobs: int | None = None


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
    """vLLM's `PromptTokenUsageInfo` (with `--enable-prompt-tokens-details`)."""

    cached_tokens: int | None = None
    created_cache_tokens: int | None = None
    multimodal_tokens: None = None


class Usage(msgspec.Struct):
    """vLLM's `UsageInfo`: every key is present in a non-streamed body, nulls included."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: None = None


class ErrorInfo(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(msgspec.Struct):
    error: ErrorInfo


_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailable"}
_encoder = msgspec.json.Encoder()


def error_body(status: int, message: str, param: str | None = None, kind: str | None = None) -> bytes:
    """vLLM's error body: `{"error": {"message", "type", "param", "code"}}`.

    `kind` defaults to the type vLLM's handlers use for `status` (`BadRequestError`, ...); a
    request body that fails validation is `"Bad Request"` (FastAPI's handler).
    """
    kind = kind or _ERROR_TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")
    return _encoder.encode(ErrorResponse(ErrorInfo(message=message, type=kind, param=param, code=status)))
