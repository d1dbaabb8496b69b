"""What vLLM 0.32 refuses in a chat or completions request, with its messages and `param`s.

Checks raised while vLLM parses the body (its pydantic validators) come back as FastAPI's
`"type": "Bad Request"` with the parameter; later checks are `BadRequestError`. Beyond vLLM,
the emulator refuses what it does not emulate: several prompts in one request, and a forced
tool call (`tool_choice: "required"` or a named function).
"""

from __future__ import annotations

import msgspec

from usage_ledger.emulator.config import EmulatorConfig
from usage_ledger.emulator.lifecycle import BadRequest, check_context, check_model, invalid_body
from usage_ledger.emulator.tokenizer import count_tokens, render_chat
from usage_ledger.emulator.wire import ChatRequest, CompletionRequest

__all__ = ("MAX_LOGPROBS", "prompt_of", "sample_logprobs", "validate")

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


def prompt_of(req: ChatRequest | CompletionRequest) -> tuple[str, int, list[int] | None]:
    """(prompt text, prompt tokens, prompt token ids when the client sent ids)."""
    if isinstance(req, ChatRequest):
        text = render_chat([(m.role, m.text()) for m in req.messages])
        return text, count_tokens(text), None
    prompt = req.prompt
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt), None
    if prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        ids = [p for p in prompt if isinstance(p, int)]
        return str(ids), len(ids), ids
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0], count_tokens(prompt[0]), None
    raise BadRequest(400, "The emulator accepts one prompt per request (a string or a list of token ids).", "prompt")


def sample_logprobs(req: ChatRequest | CompletionRequest) -> int | None:
    """How many alternatives each generated token's logprobs list (None: no logprobs asked)."""
    if isinstance(req, ChatRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs


def _parse_time_checks(req: ChatRequest | CompletionRequest) -> None:
    """vLLM's `mode="before"` validators: FastAPI's "Bad Request" with the parameter."""
    if req.prompt_logprobs is not None:
        if req.stream and (req.prompt_logprobs > 0 or req.prompt_logprobs == -1):
            raise invalid_body(
                "Value error, `prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs"
            )
        if req.prompt_logprobs < 0 and req.prompt_logprobs != -1:
            raise invalid_body("Value error, `prompt_logprobs` must be a positive value or -1.", "prompt_logprobs")
    if isinstance(req, ChatRequest):
        top = req.top_logprobs
        if top is not None and top < 0 and top != -1:
            raise invalid_body("Value error, `top_logprobs` must be a positive value or -1.", "top_logprobs")
        if top is not None and (top == -1 or top > 0) and not req.logprobs:
            raise invalid_body(
                "Value error, when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
            )
        choice = req.tool_choice
        if choice is not msgspec.UNSET and choice is not None and choice != "none":
            if not req.tools:
                raise invalid_body("Value error, When using `tool_choice`, `tools` must be set.", "tool_choice")
            if isinstance(choice, str) and choice not in ("auto", "required"):
                raise invalid_body(f"Value error, Invalid value for `tool_choice`: {choice}!", "tool_choice")
    elif req.logprobs is not None and req.logprobs < 0 and req.logprobs != -1:
        raise invalid_body("Value error, `logprobs` must be a positive value or -1.", "logprobs")


def _tool_checks(config: EmulatorConfig, req: ChatRequest) -> None:
    if not req.tools:
        return  # a tool_choice without tools was refused while parsing
    choice = "auto" if req.tool_choice is msgspec.UNSET else req.tool_choice  # tools alone mean "auto"
    if choice is None or choice == "none":
        return
    if choice == "auto":
        if not config.enable_auto_tool_choice:
            raise BadRequest(
                400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
            )
        return  # accepted; the emulated model answers with text
    if not config.tool_call_parser:
        desc = f'"{choice}"' if isinstance(choice, str) else f'function "{choice.function.name}"'
        raise BadRequest(400, f"tool_choice={desc} requires --tool-call-parser to be set")
    raise BadRequest(400, "The emulator never calls tools: use tool_choice auto or none.", "tool_choice")


def validate(config: EmulatorConfig, req: ChatRequest | CompletionRequest, prompt_tokens: int) -> int | None:
    """The request's `max_tokens` after vLLM's checks (None: up to the context)."""
    _parse_time_checks(req)
    check_model(config, req.model)
    if req.stream_options is not None and not req.stream:
        raise BadRequest(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    if req.n < 1:
        raise BadRequest(400, f"n must be at least 1, got {req.n}.")
    if req.n > 1 and req.temperature is not None and req.temperature < 1e-5:
        raise BadRequest(400, f"n must be 1 when using greedy sampling, got {req.n}.")
    if isinstance(req, ChatRequest):
        _tool_checks(config, req)
    max_tokens = req.max_tokens
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        max_tokens = req.max_completion_tokens
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest(400, f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    if req.min_tokens < 0 or (max_tokens is not None and req.min_tokens > max_tokens):
        raise BadRequest(400, "min_tokens must be >= 0 and <= max_tokens.", "min_tokens")
    for asked in (sample_logprobs(req), req.prompt_logprobs):
        if asked is not None and asked > MAX_LOGPROBS:
            raise BadRequest(
                400, f"Requested sample logprobs of {asked}, which is greater than max allowed: {MAX_LOGPROBS}"
            )
    check_context(config, prompt_tokens)
    return max_tokens
