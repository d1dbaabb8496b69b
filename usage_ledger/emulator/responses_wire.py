"""The Responses API (`POST /v1/responses`) wire format of vLLM 0.32 as msgspec Structs.

vLLM dumps a response with `model_dump(mode="json", by_alias=True)`: every field present,
nulls included, except `metrics`, which is left out while it is None. Stream events are the
`openai` SDK's event models dumped the same way, one `event: <type>\\ndata: {json}` per event.
Request fields vLLM echoes back (`text`, `reasoning`, `tool_choice`, `tools`, `metadata`,
`prompt`) are kept as raw JSON and returned as sent.
"""

from __future__ import annotations

import msgspec

from usage_ledger.emulator.per_request import PerRequestMetrics

__all__ = (
    "ContentPartEvent",
    "ErrorEvent",
    "IncompleteDetails",
    "InputItem",
    "InputPart",
    "InputTokensDetails",
    "OutputItemEvent",
    "OutputMessage",
    "OutputText",
    "OutputTextDelta",
    "OutputTextDone",
    "OutputTokensDetails",
    "ResponseEvent",
    "ResponseUsage",
    "ResponsesRequest",
    "ResponsesResponse",
)

_NULL = msgspec.Raw(b"null")


# -- request (unknown fields are accepted and ignored) --------------------------------------
class InputPart(msgspec.Struct, kw_only=True):
    type: str = "input_text"
    text: str | None = None


class InputItem(msgspec.Struct, kw_only=True):
    type: str | None = None
    role: str | None = None
    content: str | list[InputPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content if p.type in ("input_text", "output_text", "text"))


class ResponsesRequest(msgspec.Struct, kw_only=True):
    input: str | list[InputItem]
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    ignore_eos: bool = False
    request_id: str | None = None
    background: bool | None = False
    parallel_tool_calls: bool | None = True
    service_tier: str = "auto"
    truncation: str | None = "disabled"
    user: str | None = None
    previous_response_id: str | None = None
    max_tool_calls: int | None = None
    include: list[str] | None = None
    top_logprobs: int | None = 0
    metadata: msgspec.Raw = _NULL
    prompt: msgspec.Raw = _NULL
    reasoning: msgspec.Raw = _NULL
    text: msgspec.Raw = _NULL
    tool_choice: msgspec.Raw = msgspec.Raw(b'"auto"')
    tools: msgspec.Raw = msgspec.Raw(b"[]")


# -- response ------------------------------------------------------------------------------
class OutputText(msgspec.Struct, kw_only=True):
    text: str
    annotations: list[str] = msgspec.field(default_factory=list)
    type: str = "output_text"
    logprobs: list[str] | None = None


class OutputMessage(msgspec.Struct, kw_only=True):
    id: str
    content: list[OutputText]
    status: str
    role: str = "assistant"
    type: str = "message"
    phase: None = None


class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    input_tokens_per_turn: list[int] = msgspec.field(default_factory=list)
    cached_tokens_per_turn: list[int] = msgspec.field(default_factory=list)


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int = 0
    tool_output_tokens: int = 0
    output_tokens_per_turn: list[int] = msgspec.field(default_factory=list)
    tool_output_tokens_per_turn: list[int] = msgspec.field(default_factory=list)


class ResponseUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(msgspec.Struct):
    reason: str


class ResponsesResponse(msgspec.Struct, kw_only=True):
    id: str
    created_at: int
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    metadata: msgspec.Raw
    model: str
    object: str = "response"
    output: list[OutputMessage]
    parallel_tool_calls: bool
    temperature: float
    tool_choice: msgspec.Raw
    tools: msgspec.Raw
    top_p: float
    background: bool
    max_output_tokens: int
    max_tool_calls: int | None
    previous_response_id: str | None
    prompt: msgspec.Raw
    reasoning: msgspec.Raw
    service_tier: str
    status: str
    text: msgspec.Raw
    top_logprobs: int | None
    truncation: str
    usage: ResponseUsage | None
    user: str | None
    metrics: PerRequestMetrics | msgspec.UnsetType = msgspec.UNSET  # left out while None
    presence_penalty: float
    frequency_penalty: float
    kv_transfer_params: None = None
    ec_transfer_params: None = None
    input_messages: None = None
    output_messages: None = None


# -- stream events (`sequence_number` counts from 0 across the stream) ------------------------
class ResponseEvent(msgspec.Struct, kw_only=True):
    """`response.created`, `response.in_progress`, `response.completed`."""

    response: ResponsesResponse
    sequence_number: int
    type: str


class OutputItemEvent(msgspec.Struct, kw_only=True):
    """`response.output_item.added` / `.done`."""

    item: OutputMessage
    output_index: int
    sequence_number: int
    type: str


class ContentPartEvent(msgspec.Struct, kw_only=True):
    """`response.content_part.added` / `.done`."""

    content_index: int
    item_id: str
    output_index: int
    part: OutputText
    sequence_number: int
    type: str


class OutputTextDelta(msgspec.Struct, kw_only=True):
    content_index: int
    delta: str
    item_id: str
    logprobs: list[str]
    output_index: int
    sequence_number: int
    type: str = "response.output_text.delta"


class OutputTextDone(msgspec.Struct, kw_only=True):
    content_index: int
    item_id: str
    logprobs: list[str]
    output_index: int
    sequence_number: int
    text: str
    type: str = "response.output_text.done"


class ErrorEvent(msgspec.Struct, kw_only=True):
    """`error` (OpenAI's `ResponseErrorEvent`): a failure in the middle of a stream."""

    code: str | None
    message: str
    sequence_number: int
    param: str | None = None
    type: str = "error"
