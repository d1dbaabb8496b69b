"""A local, append-only, fsync'd spool for events the database could not take.

Record layout: 4-byte big-endian length ‖ 4-byte CRC-32 of the body ‖ body (msgpack of a
`SpoolRecord`: events and the prepared bodies they reference). A record is durable once `write`
returns. A record cut short at the end of the file (a crash mid-write) is reported and dropped;
a damaged record before the end raises `SpoolCorrupt` naming its offset.

One process owns a spool directory at a time (an exclusive `flock`); replicas use their own.
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec

from ledger.blobs import PreparedBlob
from ledger.errors import ConfigError, SpoolCorrupt
from ledger.events import NewEvent

__all__ = ("Spool", "SpoolRecord", "SpoolScan")

_HEADER = struct.Struct(">II")
_MAX_RECORD = 1 << 31


class SpoolRecord(msgspec.Struct, frozen=True):
    events: list[NewEvent]
    blobs: list[PreparedBlob] = []


class SpoolScan(msgspec.Struct, frozen=True):
    """What a scan found: good records, and the byte offset where a torn tail starts (if any)."""

    records: list[SpoolRecord]
    torn_tail_at: int | None
    torn_tail_bytes: int


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SpoolRecord)


class Spool:
    FILE_NAME = "events.spool"

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.path = self.directory / self.FILE_NAME
        self._fd: int | None = None

    # -- ownership -------------------------------------------------------------------------
    def open(self) -> None:
        """Create the directory and take ownership of the spool (ConfigError if another process has it)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise ConfigError(
                f"cannot open spool {self.path}: {exc.strerror}; set LEDGER_SPOOL_DIR to a writable directory"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise ConfigError(
                f"spool {self.path} is in use by another process; give each gateway its own LEDGER_SPOOL_DIR"
            ) from exc
        self._fd = fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Spool:
        self.open()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def size_bytes(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    # -- writing -----------------------------------------------------------------------------
    def write(self, record: SpoolRecord) -> None:
        """Append one record and fsync: when this returns, the record survives a crash."""
        fd = self._require_fd()
        body = _encoder.encode(record)
        os.write(fd, _HEADER.pack(len(body), zlib.crc32(body)) + body)
        os.fsync(fd)

    def clear(self) -> None:
        """Empty the spool after its records were committed to the database."""
        fd = self._require_fd()
        os.ftruncate(fd, 0)
        os.fsync(fd)

    def cut_torn_tail(self, offset: int) -> None:
        fd = self._require_fd()
        os.ftruncate(fd, offset)
        os.fsync(fd)

    # -- reading -----------------------------------------------------------------------------
    def scan(self) -> SpoolScan:
        """Read every record; a torn last record is reported in the result, not raised."""
        data = self.path.read_bytes() if self.path.exists() else b""
        records: list[SpoolRecord] = []
        torn: int | None = None
        for offset, item in _iter_records(data, self.path):
            if item is None:
                torn = offset
                break
            records.append(item)
        return SpoolScan(records=records, torn_tail_at=torn, torn_tail_bytes=0 if torn is None else len(data) - torn)

    def _require_fd(self) -> int:
        if self._fd is None:
            raise RuntimeError("spool not opened")
        return self._fd


def _iter_records(data: bytes, path: Path) -> Iterator[tuple[int, SpoolRecord | None]]:
    offset = 0
    end = len(data)
    while offset < end:
        if end - offset < _HEADER.size:
            yield offset, None
            return
        length, crc = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        if length > _MAX_RECORD:
            raise SpoolCorrupt(f"{path}: record at byte {offset} has an impossible length {length}")
        if start + length > end:
            yield offset, None
            return
        body = data[start : start + length]
        if zlib.crc32(body) != crc:
            if start + length == end:
                yield offset, None  # the last record: a torn write
                return
            raise SpoolCorrupt(f"{path}: record at byte {offset} fails its checksum; the spool needs inspection")
        try:
            record = _decoder.decode(body)
        except msgspec.DecodeError as exc:
            raise SpoolCorrupt(f"{path}: record at byte {offset} does not decode: {exc}") from exc
        yield offset, record
        offset = start + length
