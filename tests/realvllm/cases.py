"""The requests the tier sends to real vLLM: one list, used by the recorder and by the tests.

Greedy (temperature 0) and few tokens, so responses are small and the same on every run. The tiny
model's greedy output repeats with period 5 (see build_model.py), so n-gram drafts are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.realvllm.servers import CONFIGS, MAX_MODEL_LEN, MODEL_NAME

__all__ = ("EMBEDDING_CASES", "GENERATE_CASES", "TOO_LONG_PROMPT", "Case", "cases_for")

MESSAGES = [{"role": "user", "content": "What did the ledger record for the apple ticker tonight?"}]
PROMPT = "the gateway passes bytes through unchanged while the server counts tokens"
# Each repetition is at least two tokens, so this is well over the context (MAX_MODEL_LEN tokens).
TOO_LONG_PROMPT = " ".join(["ledger stream"] * (MAX_MODEL_LEN // 2 + 50))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_price",
            "description": "The last price of a ticker.",
            "parameters": {"type": "object", "properties": {"ticker": {"type": "string"}}, "required": ["ticker"]},
        },
    }
]


@dataclass(frozen=True)
class Case:
    """One request: `body` is a JSON object, or a string sent as-is (not JSON: the bad-body case)."""

    name: str
    path: str
    body: dict[str, Any] | str | None = None
    method: str = "POST"
    expect_status: int = 200
    notes: str = ""
    tags: frozenset[str] = field(default_factory=frozenset)

    def expected_status(self, config: str) -> int:
        """The status vLLM answers with under `config` (tool cases need `--enable-auto-tool-choice`)."""
        if "tools" in self.tags and "--enable-auto-tool-choice" not in CONFIGS[config]:
            return 400
        return self.expect_status

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 16, "temperature": 0, **extra}


def _completion(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, **extra}


_USAGE = {"include_usage": True}
_CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}
# vLLM refuses n > 1 with greedy sampling (400 "n must be 1 when using greedy sampling"): sample, seeded.
_N2: dict[str, Any] = {"n": 2, "temperature": 0.8, "seed": 7}

GENERATE_CASES: tuple[Case, ...] = (
    Case("models", "/v1/models", method="GET"),
    Case("chat", "/v1/chat/completions", _chat()),
    Case("chat_stream", "/v1/chat/completions", _chat(stream=True)),
    Case("chat_stream_usage", "/v1/chat/completions", _chat(stream=True, stream_options=_USAGE)),
    Case("chat_stream_continuous_usage", "/v1/chat/completions", _chat(stream=True, stream_options=_CONTINUOUS)),
    Case("chat_n2", "/v1/chat/completions", _chat(**_N2)),
    Case("chat_stream_n2", "/v1/chat/completions", _chat(**_N2, stream=True, stream_options=_USAGE)),
    Case("chat_logprobs", "/v1/chat/completions", _chat(logprobs=True, top_logprobs=2, max_tokens=6)),
    Case("chat_stop", "/v1/chat/completions", _chat(stop=[" bytes"], max_tokens=30), notes="finish_reason stop"),
    Case(
        "chat_tools",
        "/v1/chat/completions",
        _chat(tools=TOOLS, tool_choice="auto"),
        notes="needs --enable-auto-tool-choice; without it vLLM answers 400",
        tags=frozenset({"tools"}),
    ),
    Case(
        "chat_tools_stream",
        "/v1/chat/completions",
        _chat(tools=TOOLS, tool_choice="auto", stream=True),
        tags=frozenset({"tools"}),
    ),
    Case("completions", "/v1/completions", _completion()),
    Case("completions_stream", "/v1/completions", _completion(stream=True)),
    Case("completions_stream_usage", "/v1/completions", _completion(stream=True, stream_options=_USAGE)),
    Case(
        "completions_stream_continuous_usage",
        "/v1/completions",
        _completion(stream=True, stream_options=_CONTINUOUS),
    ),
    Case("completions_n2", "/v1/completions", _completion(**_N2)),
    Case("completions_logprobs_echo", "/v1/completions", _completion(logprobs=2, echo=True, max_tokens=6)),
    Case(
        "responses",
        "/v1/responses",
        {"model": MODEL_NAME, "input": "Which tickers ran tonight?", "max_output_tokens": 16, "temperature": 0},
    ),
    Case(
        "responses_stream",
        "/v1/responses",
        {
            "model": MODEL_NAME,
            "input": "Which tickers ran tonight?",
            "max_output_tokens": 16,
            "temperature": 0,
            "stream": True,
        },
    ),
    Case("error_unknown_model", "/v1/chat/completions", {**_chat(), "model": "no-such-model"}, expect_status=404),
    Case(
        "error_bad_json",
        "/v1/chat/completions",
        '{"model": "tiny", "messages": [{"role": "user", "content": "unterminated',
        expect_status=400,
    ),
    Case(
        "error_too_long",
        "/v1/chat/completions",
        _chat(messages=[{"role": "user", "content": TOO_LONG_PROMPT}]),
        expect_status=400,
    ),
    Case(
        "error_too_long_stream",
        "/v1/chat/completions",
        _chat(messages=[{"role": "user", "content": TOO_LONG_PROMPT}], stream=True),
        expect_status=400,
    ),
)

# The SDK asks for base64 unless told otherwise; name the encoding so recorded and SDK requests match.
_EMBED = {"model": MODEL_NAME, "input": "apple revenue growth forecast", "encoding_format": "float"}

EMBEDDING_CASES: tuple[Case, ...] = (
    Case("models", "/v1/models", method="GET"),
    Case("embeddings", "/v1/embeddings", _EMBED),
    Case("embeddings_batch", "/v1/embeddings", {**_EMBED, "input": ["apple stock", "night batch run of tickers"]}),
    Case("embeddings_base64", "/v1/embeddings", {**_EMBED, "encoding_format": "base64"}),
    Case("error_unknown_model", "/v1/embeddings", {**_EMBED, "model": "no-such-model"}, expect_status=404),
    Case("error_too_long", "/v1/embeddings", {**_EMBED, "input": TOO_LONG_PROMPT}, expect_status=400),
    Case(
        "error_chat_on_pooling",
        "/v1/chat/completions",
        _chat(),
        expect_status=404,
        notes="a pooling server has no generation routes",
    ),
)


def cases_for(config: str) -> tuple[Case, ...]:
    return EMBEDDING_CASES if config == "embeddings" else GENERATE_CASES
