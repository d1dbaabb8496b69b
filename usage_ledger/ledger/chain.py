"""The hash chain: each row's hash covers the previous hash and the row's identity and payload.

    hash(n) = SHA-256( hash(n-1) as 32 raw bytes        (32 zero bytes before position 1)
                     ‖ position as 8-byte big-endian unsigned
                     ‖ event_id as its 16 raw bytes
                     ‖ occurred_at as 8-byte big-endian signed microseconds since the Unix epoch
                     ‖ len(type)   as 4-byte big-endian ‖ type as UTF-8
                     ‖ len(stream) as 4-byte big-endian ‖ stream as UTF-8
                     ‖ payload as UTF-8 (the stored text, byte for byte) )

stored as lowercase hex. DESIGN §3 names position, id, type and payload; stream and occurred_at are
covered as well so that no column of a row can be edited without breaking the chain.
"""

from __future__ import annotations

import hashlib
import struct
import uuid
from datetime import UTC, datetime, timedelta

__all__ = ("GENESIS_HASH", "HEAD_STRUCT", "LENGTH_STRUCT", "chain_hash", "epoch_micros")

GENESIS_HASH = "0" * 64
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)
HEAD_STRUCT = struct.Struct(">Q16sq")  # position, event id, occurred_at
LENGTH_STRUCT = struct.Struct(">I")


def epoch_micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICRO


def chain_hash(
    previous: str, position: int, event_id: uuid.UUID, occurred_at: datetime, type_: str, stream: str, payload: str
) -> str:
    """The row's hash as stored (hex), from the previous row's stored hash.

    The reference form of the layout above, used by `ledger verify`; the appenders' row builder
    (`ledger._rows`) computes the same bytes in a faster loop and a test pins the two together.
    """
    digest = hashlib.sha256(bytes.fromhex(previous))
    digest.update(HEAD_STRUCT.pack(position, event_id.bytes, epoch_micros(occurred_at)))
    type_bytes = type_.encode()
    stream_bytes = stream.encode()
    digest.update(LENGTH_STRUCT.pack(len(type_bytes)))
    digest.update(type_bytes)
    digest.update(LENGTH_STRUCT.pack(len(stream_bytes)))
    digest.update(stream_bytes)
    digest.update(payload.encode())
    return digest.hexdigest()
