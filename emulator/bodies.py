"""Non-streamed response bodies (chat, completions, models) in vLLM's field layout."""

from __future__ import annotations

import msgspec

from emulator.wire import Usage

__all__ = (
    "ChatChoice",
    "ChatCompletion",
    "ChatResponseMessage",
    "Completion",
    "CompletionChoice",
    "ModelCard",
    "ModelList",
    "ModelPermission",
)


class ChatResponseMessage(msgspec.Struct):
    content: str
    role: str = "assistant"
    refusal: None = None
    annotations: None = None
    audio: None = None
    function_call: None = None
    tool_calls: list[str] = msgspec.field(default_factory=list)
    reasoning_content: None = None


class ChatChoice(msgspec.Struct):
    message: ChatResponseMessage
    finish_reason: str
    index: int = 0
    logprobs: None = None
    stop_reason: None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"
    service_tier: None = None
    system_fingerprint: None = None
    prompt_logprobs: None = None
    kv_transfer_params: None = None


class CompletionChoice(msgspec.Struct):
    text: str
    finish_reason: str
    index: int = 0
    logprobs: None = None
    stop_reason: None = None
    prompt_logprobs: None = None


class Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    object: str = "text_completion"
    system_fingerprint: None = None
    kv_transfer_params: None = None


class ModelPermission(msgspec.Struct):
    id: str
    created: int
    object: str = "model_permission"
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: None = None
    is_blocking: bool = False


class ModelCard(msgspec.Struct):
    id: str
    created: int
    max_model_len: int
    permission: list[ModelPermission]
    object: str = "model"
    owned_by: str = "vllm"
    root: str | None = None
    parent: None = None


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"
