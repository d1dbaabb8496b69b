"""The blob a call's chunk gaps are stored in (`CallFinished.chunk_gaps_blob`): a JSON array of whole µs.

Out of the event so that events stay small (a rebuild parses every payload; the gaps are read by
`ledger compare` only), and in the blob store, which compresses with zstd: plain JSON costs
2.4 bytes a chunk there, a packed array 1.8–2.2 (docs/decide.md, "Compare"), and stays readable by
anyone with the blob, of any length and any gap, with no format of ours to learn.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

__all__ = ("decode_chunk_gaps", "encode_chunk_gaps")

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(list[int])


def encode_chunk_gaps(gaps: Sequence[int]) -> bytes:
    """The blob's bytes: `[1500,0,40000]` (the blob store hashes and compresses them)."""
    return _encoder.encode(gaps)


def decode_chunk_gaps(data: bytes) -> list[int]:
    """The gaps a blob holds; `msgspec.ValidationError` / `DecodeError` if it holds something else."""
    return _decoder.decode(data)
