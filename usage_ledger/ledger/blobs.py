"""Content-addressed bodies: SHA-256 of the raw bytes names a zstd-compressed copy, stored once."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from datetime import datetime

import msgspec
import zstandard
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.errors import BlobNotFound
from usage_ledger.ledger.events import utc_now
from usage_ledger.ledger.schema import blobs

__all__ = ("BlobCompressor", "PreparedBlob", "blob_hash", "blob_redacted_at", "read_blob", "redact_blob")

# Bodies shorter than this are stored raw: zstd's frame overhead would make them larger.
_MIN_COMPRESS = 64


class PreparedBlob(msgspec.Struct, frozen=True, array_like=True):
    """A body ready to store: its hash, raw size, codec and the stored bytes."""

    hash: str
    size: int
    codec: str
    content: bytes


def blob_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class BlobCompressor:
    """Compresses bodies, remembering recently stored hashes so repeats cost only a hash."""

    def __init__(self, level: int = 3, remember: int = 50_000) -> None:
        self._compressor = zstandard.ZstdCompressor(level=level)
        self._known: OrderedDict[str, None] = OrderedDict()
        self._remember = remember

    def prepare(self, data: bytes, digest: str | None = None) -> PreparedBlob | None:
        """A blob to write, or None when this process already stored the same bytes."""
        digest = digest or blob_hash(data)
        if digest in self._known:
            self._known.move_to_end(digest)
            return None
        if len(data) < _MIN_COMPRESS:
            return PreparedBlob(digest, len(data), "raw", data)
        packed = self._compressor.compress(data)
        if len(packed) >= len(data):
            return PreparedBlob(digest, len(data), "raw", data)
        return PreparedBlob(digest, len(data), "zstd", packed)

    def remember(self, digests: Iterable[str]) -> None:
        for digest in digests:
            self._known[digest] = None
            self._known.move_to_end(digest)
        while len(self._known) > self._remember:
            self._known.popitem(last=False)

    def forget(self) -> None:
        """After a failed commit nothing this process prepared is known to be stored."""
        self._known.clear()


_decompressor = zstandard.ZstdDecompressor()


async def read_blob(conn: AsyncConnection, digest: str) -> bytes:
    row = (
        await conn.execute(select(blobs.c.codec, blobs.c.content, blobs.c.redacted_at).where(blobs.c.hash == digest))
    ).one_or_none()
    if row is None:
        raise BlobNotFound(f"no blob {digest} in the ledger")
    if row.content is None:
        raise BlobNotFound(f"blob {digest} was redacted at {row.redacted_at.isoformat()}")
    content: bytes = row.content
    return _decompressor.decompress(content) if row.codec == "zstd" else content


async def blob_redacted_at(conn: AsyncConnection, digest: str) -> datetime | None:
    """When a stored blob was redacted (None: its content is still stored); `BlobNotFound` if unknown."""
    row = (await conn.execute(select(blobs.c.redacted_at).where(blobs.c.hash == digest))).one_or_none()
    if row is None:
        raise BlobNotFound(f"no blob {digest} in the ledger")
    redacted_at: datetime | None = row.redacted_at
    return redacted_at


async def redact_blob(conn: AsyncConnection, digest: str) -> bool:
    """Erase a body's content (the only change the blob triggers allow). False if unknown/already."""
    result = await conn.execute(
        update(blobs)
        .where(blobs.c.hash == digest, blobs.c.redacted_at.is_(None))
        .values(content=None, stored_size=0, redacted_at=utc_now())
    )
    return bool(result.rowcount)
