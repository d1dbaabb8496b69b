"""A client that leaves a real vLLM stream part-way: the abort test's stream, and bench/vllm_stalls.py's."""

from __future__ import annotations

import time

import openai

from tests.realvllm.servers import MODEL_NAME

__all__ = ("LONG_STREAM_TOKENS", "leave_stream")

LONG_STREAM_TOKENS = 900
"""The stream's max_tokens: most of the 1k context, far more than a client reads before it leaves."""


def leave_stream(client: openai.OpenAI, *, chunks: int = 4) -> float:
    """Stream a long chat completion, close the connection after `chunks` data lines; seconds until then."""
    started = time.monotonic()
    seen = 0
    # Sampled, not greedy: greedily the tiny model repeats itself, so the ngram speculator's three
    # draft tokens can all be accepted, four tokens a step; in CI (stop 29) the stream had ended
    # before the client's fourth chunk. Sampled, a step yields about one token, as in the other
    # configurations; ignore_eos keeps an end-of-text from ending the stream before the client leaves.
    with client.chat.completions.with_streaming_response.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Write the whole night's report."}],
        max_tokens=LONG_STREAM_TOKENS,
        temperature=1.0,
        seed=7,
        stream=True,
        extra_body={"ignore_eos": True},
    ) as streamed:
        for line in streamed.iter_lines():
            seen += line.startswith("data: {")
            if seen == chunks:
                break  # leaving the block closes the connection mid-stream
    return time.monotonic() - started
