"""A deterministic stand-in tokenizer: one token per 4 bytes of UTF-8.

Token ids are the chunk's bytes read as a big-endian integer behind a 0x01 marker byte, so
`decode(encode(text)) == text` and `count_tokens(text) == len(encode(text))` for any text.
An ASCII string of 4*N characters is exactly N tokens. Chat requests are rendered with a
ChatML-like template before counting (see `render_chat`). Generated text is a rotation of a
fixed passage cut into 4-character pieces, so re-tokenizing a completion gives its
`completion_tokens` exactly; an `Answer` may begin with a lead (a grade line, `emulator.grades`)
whose 4-character pieces take the place of the first tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

__all__ = (
    "BYTES_PER_TOKEN",
    "PIECES",
    "Answer",
    "count_tokens",
    "decode",
    "encode",
    "generated_text",
    "lead_pieces",
    "render_chat",
)

BYTES_PER_TOKEN = 4

_PASSAGE = (
    "The quick brown fox jumps over the lazy dog while the engine keeps every batch busy. "
    "Tokens arrive one step at a time, and the ledger records what each call cost. "
)
# 4-character pieces; the passage length is padded to a multiple of 4.
_PADDED = _PASSAGE + " " * (-len(_PASSAGE) % BYTES_PER_TOKEN)
PIECES: tuple[str, ...] = tuple(_PADDED[i : i + BYTES_PER_TOKEN] for i in range(0, len(_PADDED), BYTES_PER_TOKEN))


def count_tokens(text: str) -> int:
    """Number of tokens in `text`."""
    n = len(text) if text.isascii() else len(text.encode())
    return -(-n // BYTES_PER_TOKEN)


def encode(text: str) -> list[int]:
    """Token ids of `text`."""
    raw = text.encode()
    return [int.from_bytes(b"\x01" + raw[i : i + BYTES_PER_TOKEN], "big") for i in range(0, len(raw), BYTES_PER_TOKEN)]


def decode(ids: Iterable[int]) -> str:
    """Text of token ids (ids that are not ours decode to U+FFFD)."""
    out = bytearray()
    for token in ids:
        if token <= 0:
            out += "\ufffd".encode()
            continue
        raw = token.to_bytes((token.bit_length() + 7) // 8, "big")
        if raw[0] != 1 or not 2 <= len(raw) <= BYTES_PER_TOKEN + 1:
            out += "\ufffd".encode()
            continue
        out += raw[1:]
    return out.decode(errors="replace")


def render_chat(messages: Sequence[tuple[str, str]], add_generation_prompt: bool = True) -> str:
    """ChatML-like rendering of (role, content) pairs, as the model would see them."""
    parts = [f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages]
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def generated_text(offset: int, n_tokens: int) -> str:
    """The `n_tokens` generated tokens starting at token `offset` of a passage rotation."""
    n = len(PIECES)
    start = offset % n
    reps = (start + n_tokens) // n + 1
    return (_PADDED * reps)[start * BYTES_PER_TOKEN : (start + n_tokens) * BYTES_PER_TOKEN]


def lead_pieces(line: str) -> tuple[str, ...]:
    """`line` and a blank line as whole tokens: padded with spaces before its newlines to a multiple of 4 bytes."""
    if not line.isascii() or "\n" in line:
        raise ValueError(f"a lead is one line of ASCII, got {line!r}")
    text = line + " " * (-(len(line) + 2) % BYTES_PER_TOKEN) + "\n\n"
    return tuple(text[i : i + BYTES_PER_TOKEN] for i in range(0, len(text), BYTES_PER_TOKEN))


class Answer(NamedTuple):
    """One choice's generated text: the `lead`'s pieces as its first tokens, then the rotation at `offset`
    (token i past the lead is the rotation's token `offset + i`, as without a lead)."""

    offset: int
    lead: tuple[str, ...] = ()

    def piece(self, i: int) -> str:
        """Token `i` as text."""
        return self.lead[i] if i < len(self.lead) else PIECES[(self.offset + i) % len(PIECES)]

    def text(self, start: int, n: int) -> str:
        """Tokens [start, start + n) as text."""
        if start >= len(self.lead):
            return generated_text(self.offset + start, n)
        head = "".join(self.lead[start : start + n])
        rest = start + n - len(self.lead)
        return head + (generated_text(self.offset + len(self.lead), rest) if rest > 0 else "")
