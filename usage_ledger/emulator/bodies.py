"""Non-streamed response bodies (chat, completions, models) in vLLM 0.32's field layout (docs/emulator.md)."""

from __future__ import annotations

import msgspec

from usage_ledger.emulator.logprobs import ChatLogprobs, CompletionLogprobs, PromptLogprob
from usage_ledger.emulator.per_request import PerRequestMetrics
from usage_ledger.emulator.wire import Usage

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
    reasoning: None = None


PromptLogprobs = list[dict[str, PromptLogprob] | None]


class ChatChoice(msgspec.Struct, kw_only=True):
    message: ChatResponseMessage
    finish_reason: str
    index: int = 0
    logprobs: ChatLogprobs | None = None
    stop_reason: str | int | None = None
    token_ids: None = None
    routed_experts: None = None


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    metrics: PerRequestMetrics | None = None
    system_fingerprint: str | None = None
    prompt_logprobs: PromptLogprobs | None = None
    object: str = "chat.completion"
    service_tier: None = None
    prompt_token_ids: None = None
    prompt_text: None = None
    kv_transfer_params: None = None
    ec_transfer_params: None = None


class CompletionChoice(msgspec.Struct, kw_only=True):
    text: str
    finish_reason: str
    index: int = 0
    logprobs: CompletionLogprobs | None = None
    stop_reason: str | int | None = None
    token_ids: None = None
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: None = None
    routed_experts: None = None


class Completion(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    metrics: PerRequestMetrics | None = None
    system_fingerprint: str | None = None
    object: str = "text_completion"
    service_tier: None = None
    kv_transfer_params: None = None
    ec_transfer_params: None = None


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
