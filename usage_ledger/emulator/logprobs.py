"""Log-probabilities in vLLM 0.32's layouts, for the emulator's own tokens (values are made up).

A token is one 4-byte piece (see `emulator.tokenizer`); its logprob and its alternatives are
drawn deterministically from its position, so a run is reproducible. Layouts:

- chat `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob,
  bytes}] * top_logprobs}]}`;
- completions `logprobs`: `{text_offset, token_logprobs, tokens, top_logprobs}`, where each
  top-logprobs entry maps token text to logprob for the sampled token plus `logprobs`
  alternatives; with `echo` the prompt's tokens come first, the very first one without a
  logprob (`null` in `token_logprobs` and `top_logprobs`);
- `prompt_logprobs`: `[null, {token_id: {logprob, rank, decoded_token}}, ...]`.
"""

from __future__ import annotations

import msgspec

from usage_ledger.emulator.tokenizer import BYTES_PER_TOKEN, PIECES, Answer, decode, encode

__all__ = (
    "ChatLogprobs",
    "CompletionLogprobs",
    "PromptLogprob",
    "chat_logprobs",
    "completion_logprobs",
    "prompt_logprobs",
    "prompt_pieces",
)


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct):
    content: list[TokenLogprob]


class CompletionLogprobs(msgspec.Struct):
    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class PromptLogprob(msgspec.Struct):
    logprob: float
    rank: int
    decoded_token: str


def _logprob(position: int) -> float:
    return -round(((position * 2654435761) % 1000) / 400.0, 4)


def _alternatives(position: int, k: int) -> list[tuple[str, float]]:
    base = _logprob(position)
    return [(PIECES[(position * 7 + 3 * a + 1) % len(PIECES)], round(base - 1.5 * (a + 1), 4)) for a in range(k)]


def chat_logprobs(answer: Answer, start: int, n: int, top: int) -> ChatLogprobs:
    """Chat logprobs of generated tokens [start, start + n) of `answer`."""
    offset = answer.offset
    content = []
    for i in range(start, start + n):
        token = answer.piece(i)
        alts = [(token, _logprob(offset + i)), *_alternatives(offset + i, top)][:top]
        content.append(
            TokenLogprob(
                token=token,
                logprob=_logprob(offset + i),
                bytes=list(token.encode()),
                top_logprobs=[TopLogprob(t, lp, list(t.encode())) for t, lp in alts],
            )
        )
    return ChatLogprobs(content)


def prompt_pieces(prompt_text: str, prompt_ids: list[int] | None) -> list[str]:
    """The prompt's tokens as text (one per emulated token)."""
    if prompt_ids is not None:
        return [decode([t]) for t in prompt_ids]
    raw = prompt_text.encode()
    return [raw[i : i + BYTES_PER_TOKEN].decode(errors="replace") for i in range(0, len(raw), BYTES_PER_TOKEN)]


def completion_logprobs(
    answer: Answer, start: int, n: int, top: int, *, text_offset: int = 0, echo: list[str] | None = None
) -> CompletionLogprobs:
    """Completions logprobs of `answer`'s tokens [start, start + n), after the `echo`ed prompt tokens."""
    # each token with the position its made-up values are drawn from; the prompt's first has none
    tokens = [(token, -j) for j, token in enumerate(echo or [])]
    tokens += [(answer.piece(i), answer.offset + i) for i in range(start, start + n)]
    out = CompletionLogprobs([], [], [], [])
    at = text_offset
    for j, (token, position) in enumerate(tokens):
        lp = None if echo and j == 0 else _logprob(position)
        out.text_offset.append(at)
        out.tokens.append(token)
        out.token_logprobs.append(lp)
        out.top_logprobs.append(None if lp is None else {token: lp, **dict(_alternatives(position, top))})
        at += len(token)
    return out


def prompt_logprobs(pieces: list[str], top: int) -> list[dict[str, PromptLogprob] | None]:
    """vLLM's `prompt_logprobs`: none for the first token, then the token and `top` alternatives by id."""
    out: list[dict[str, PromptLogprob] | None] = [None]
    for j, token in enumerate(pieces[1:], start=1):
        entry = {str(_token_id(token)): PromptLogprob(_logprob(-j), 1 + j % 50, token)}
        for rank, (alt, lp) in enumerate(_alternatives(-j, top), start=1):
            entry.setdefault(str(_token_id(alt)), PromptLogprob(lp, rank, alt))
        out.append(entry)
    return out


def _token_id(piece: str) -> int:
    ids = encode(piece)
    return ids[0] if ids else 0
