"""Content-addressed bodies: SHA-256 of the raw bytes names a zstd-compressed copy, stored once."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from datetime import datetime

import msgspec
import zstandard
from sqlalchemy import Update, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.errors import BlobNotFound
from usage_ledger.ledger.events import BlobRedacted, decode_event, utc_now
from usage_ledger.ledger.schema import blobs, events

__all__ = (
    "BlobCompressor",
    "Erasure",
    "PreparedBlob",
    "blob_erasures",
    "blob_hash",
    "blob_redacted_at",
    "blob_stream",
    "erase_contents",
    "read_blob",
    "redact_blob",
)

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
        if len(data) >= _MIN_COMPRESS and len(packed := self._compressor.compress(data)) < len(data):
            return PreparedBlob(digest, len(data), "zstd", packed)
        return PreparedBlob(digest, len(data), "raw", data)

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
        erasure = (await blob_erasures(conn, [digest])).get(digest)
        if erasure is None:  # erased without its event: `ledger verify` names that
            raise BlobNotFound(f"blob {digest} was redacted at {row.redacted_at.isoformat()}")
        raise BlobNotFound(f"blob {digest} {erasure.describe()}")
    content: bytes = row.content
    return _decompressor.decompress(content) if row.codec == "zstd" else content


async def blob_redacted_at(conn: AsyncConnection, digest: str) -> datetime | None:
    """When a stored blob was redacted (None: its content is still stored); `BlobNotFound` if unknown."""
    row = (await conn.execute(select(blobs.c.redacted_at).where(blobs.c.hash == digest))).one_or_none()
    if row is None:
        raise BlobNotFound(f"no blob {digest} in the ledger")
    redacted_at: datetime | None = row.redacted_at
    return redacted_at


def erase_contents(digests: Iterable[str]) -> Update:
    """The UPDATE erasing the content of those of `digests` not erased yet (the only change the blob triggers allow)."""
    return (
        update(blobs)
        .where(blobs.c.hash.in_(digests), blobs.c.redacted_at.is_(None))
        .values(content=None, stored_size=0, redacted_at=utc_now())
    )


async def redact_blob(conn: AsyncConnection, digest: str) -> bool:
    """Erase a body's content. False if unknown/already."""
    return bool((await conn.execute(erase_contents([digest]))).rowcount)


def blob_stream(digest: str) -> str:
    """The stream of a body's `blob.redacted` events: `blob-<hash>` (indexed, so an erasure is found by it)."""
    return f"blob-{digest}"


class Erasure(msgspec.Struct, frozen=True, kw_only=True):
    """Why and when a body was erased: its first `blob.redacted` event."""

    blob_hash: str
    reason: str
    recorded_at: datetime
    position: int

    def describe(self) -> str:
        """What readers print instead of the body (`show call`, replay, `labels import --extract`)."""
        return (
            f"was erased on {self.recorded_at.date().isoformat()} (blob.redacted at position {self.position}: "
            f"{self.reason})"
        )


async def blob_erasures(conn: AsyncConnection, digests: Iterable[str]) -> dict[str, Erasure]:
    """The first `blob.redacted` event of each of `digests` that has one (by their indexed streams)."""
    wanted = {blob_stream(digest): digest for digest in digests}
    if not wanted:
        return {}
    rows = await conn.execute(
        select(events.c.position, events.c.recorded_at, events.c.payload)
        .where(events.c.stream.in_(sorted(wanted)), events.c.type == "blob.redacted")
        .order_by(events.c.position)
    )
    hashes = set(wanted.values())
    found: dict[str, Erasure] = {}
    for position, recorded_at, payload in rows:
        body = decode_event(payload)
        if isinstance(body, BlobRedacted) and body.blob_hash in hashes:
            found.setdefault(
                body.blob_hash,
                Erasure(blob_hash=body.blob_hash, reason=body.reason, recorded_at=recorded_at, position=position),
            )
    return found
