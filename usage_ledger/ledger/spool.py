"""A local, append-only, fsync'd spool for events the database could not take.

Record layout: 4-byte big-endian length ‖ 4-byte CRC-32 of the body ‖ body. The body is `0x00` ‖
HMAC-SHA-256 of the rest under the spool's key ‖ msgpack of a `SpoolRecord` (events and the prepared
bodies they reference). A record is durable once `write` returns; a write that fails or comes up short
(ENOSPC) is cut back to the last good record and raises `SpoolWriteFailed`, so nothing half-written is
ever counted durable.

Trust: the spool's directory, file and key must be the gateway's own (owned by its user or root, not
writable by others: `durable.check_owned`), else `open` refuses them. The key (`KEY_FILE_NAME`, 32 random
bytes, made on first open) lives beside the spool directory, not in it: a spool directory brought from
another ledger, or a record forged without the key, fails its HMAC and is quarantined as damage, never
replayed. A record without a key (a msgpack body, no `0x00`: written before records were keyed, or forged by
someone without the key) is damage too, unless the scan is asked to accept it (`ledger spool replay
--accept-unkeyed`, never the gateway): then it is read and counted in `SpoolScan.unkeyed`.

Reading: a torn tail (a crash mid-write) is dropped; a damaged region before the end is skipped, the valid
records after it still read, and never resynchronised on where it may be a body quoting a record (the rules:
docs/RELIABILITY.md, "Spool faults"). `recover()` moves damage to `events.spool.quarantine-<UTC>-<offset>`.

One process owns a spool directory at a time (an exclusive `flock`); replicas use their own.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import os
import secrets
import struct
import time
import zlib
from pathlib import Path

import msgspec

from usage_ledger.ledger.blobs import PreparedBlob
from usage_ledger.ledger.durable import check_owned, fsync_dir
from usage_ledger.ledger.errors import ConfigError, SpoolWriteFailed
from usage_ledger.ledger.events import NewEvent
from usage_ledger.ledger.key_files import check_random, read_key_file

__all__ = ("UNKEYED", "Spool", "SpoolDamage", "SpoolRecord", "SpoolScan")

_HEADER = struct.Struct(">II")
_MAX_RECORD = 1 << 31
_KEYED = b"\x00"  # a msgpack record (a map) never starts with it
_MAC_BYTES = 32
_KEY_BYTES = 32
UNKEYED = (
    "is not keyed (written by a gateway older than keyed spool records, or forged without the key); if an older "
    "gateway wrote it, replay it with `ledger spool replay --accept-unkeyed`"
)


class SpoolRecord(msgspec.Struct, frozen=True):
    events: list[NewEvent]
    blobs: list[PreparedBlob] = []


class SpoolDamage(msgspec.Struct, frozen=True):
    """A damaged region before the end of the spool: `size` bytes from byte `offset`."""

    offset: int
    size: int
    reason: str


class SpoolScan(msgspec.Struct, frozen=True):
    """What a scan found: good records, damaged regions, and where a torn tail starts (if any)."""

    records: list[SpoolRecord]
    torn_tail_at: int | None
    torn_tail_bytes: int
    damaged: list[SpoolDamage] = []
    spans: list[tuple[int, int]] = []  # (start, end) of each good record, in file order
    unkeyed: int = 0
    """Good records written before records were keyed (read only when the scan accepts them)."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SpoolRecord)


class Spool:
    FILE_NAME = "events.spool"
    QUARANTINE_PREFIX = FILE_NAME + ".quarantine-"
    KEY_FILE_NAME = "ledger-spool.key"

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.path = self.directory / self.FILE_NAME
        self.key_path = self.directory.absolute().parent / self.KEY_FILE_NAME
        self._key: bytes | None = None
        self._fd: int | None = None
        self._retired: list[int] = []  # descriptors of files replaced by `recover`, kept locked until close

    # -- ownership -------------------------------------------------------------------------
    def open(self) -> None:
        """Create the directory and take ownership of the spool (ConfigError if another process has it, or
        if the directory, file or key could have been planted or changed by another user)."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            check_owned(self.directory, "spool directory")
            self._key = self._load_key()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise ConfigError(
                f"cannot open spool {self.path}: {exc.strerror}; set LEDGER_SPOOL_DIR to a writable directory"
            ) from exc
        try:
            check_owned(self.path, "spool file")
        except ConfigError:
            os.close(fd)
            raise
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
        for fd in self._retired:
            os.close(fd)
        self._retired = []

    def _load_key(self) -> bytes:
        """The spool's key: read (by the rules of every key file: `key_files`), or made on first open (mode 0600)."""
        try:
            key = read_key_file(self.key_path, "spool key")
        except FileNotFoundError:
            key = secrets.token_bytes(_KEY_BYTES)
            tmp = self.key_path.with_name(f".{self.KEY_FILE_NAME}.{os.getpid()}.tmp")
            _write_file(tmp, key)
            try:
                os.link(tmp, self.key_path)
            except FileExistsError:  # another process made it first: use theirs
                key = self.key_path.read_bytes()
            finally:
                tmp.unlink(missing_ok=True)
            fsync_dir(self.key_path.parent)
        if len(key) != _KEY_BYTES:
            raise ConfigError(f"spool key {self.key_path} is not {_KEY_BYTES} bytes: check it, or remove it")
        check_random(key, self.key_path, "spool key", "check it, or remove it (a new one is made on the next start)")
        return key

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

    def quarantined(self) -> list[Path]:
        """Side files holding damaged regions that nobody has moved away yet."""
        try:
            return sorted(p for p in self.directory.iterdir() if p.name.startswith(self.QUARANTINE_PREFIX))
        except FileNotFoundError:
            return []

    # -- writing -----------------------------------------------------------------------------
    def write(self, record: SpoolRecord) -> None:
        """Append one record and fsync: when this returns, the record survives a crash.

        A failed or short write (ENOSPC, EIO) is cut back to where the record started, and raises
        `SpoolWriteFailed`: the record is not durable, and the spool still ends on a good record.
        """
        fd = self._require_fd()
        payload = _encoder.encode(record)
        body = _KEYED + hmac.digest(self._require_key(), payload, hashlib.sha256) + payload
        data = _HEADER.pack(len(body), zlib.crc32(body)) + body
        start = os.fstat(fd).st_size  # O_APPEND and one owner: the record lands here
        try:
            _write_all(fd, data)
            os.fsync(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, start)
                os.fsync(fd)
            except OSError as cut_exc:
                raise SpoolWriteFailed(
                    f"spool {self.path}: write failed ({exc.strerror}) and cutting it back to byte {start} failed "
                    f"too ({cut_exc.strerror}); the next start quarantines the torn record"
                ) from exc
            raise SpoolWriteFailed(
                f"spool {self.path}: write failed ({exc.strerror}); the record was not kept. Free space in "
                f"{self.directory} or point LEDGER_SPOOL_DIR elsewhere"
            ) from exc

    def probe(self) -> None:
        """SpoolWriteFailed unless a record can be written now (after a full disk was freed): a record of no
        events, written as any record and cut off again (a crash in between leaves a record that adds nothing)."""
        start = os.fstat(self._require_fd()).st_size
        self.write(SpoolRecord(events=[]))
        self._cut_back(start)

    def clear(self) -> None:
        """Empty the spool after its records were committed to the database."""
        self._cut_back(0)

    def _cut_back(self, offset: int) -> None:
        """Cut the file back to its first `offset` bytes, durably."""
        fd = self._require_fd()
        os.ftruncate(fd, offset)
        os.fsync(fd)

    def recover(self, *, accept_unkeyed: bool = False) -> SpoolScan:
        """Scan; move damaged regions (and unkeyed records, unless `accept_unkeyed`) to quarantine files and keep
        only the good records.

        Order matters for crash safety: the quarantine files are fsync'd first, then the good
        records are written to a new file that atomically replaces the spool. A torn tail is cut.
        """
        fd = self._require_fd()
        data = self.path.read_bytes()
        scan = _scan(data, self._require_key(), accept_unkeyed)
        if scan.damaged:
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            for damage in scan.damaged:
                side = self.directory / f"{self.QUARANTINE_PREFIX}{stamp}-{damage.offset}"
                _write_file(side, data[damage.offset : damage.offset + damage.size])
            tmp = self.directory / (self.FILE_NAME + ".recovering")
            tmp.unlink(missing_ok=True)
            new_fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
            try:
                fcntl.flock(new_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # locked before anyone can see it
                good = b"".join(data[start:end] for start, end in scan.spans)
                _write_all(new_fd, good)
                os.fsync(new_fd)
                os.replace(tmp, self.path)
                fsync_dir(self.directory)
            except BaseException:
                os.close(new_fd)
                tmp.unlink(missing_ok=True)
                raise
            self._retired.append(fd)  # still locked: a process that opened the old file cannot take over
            self._fd = new_fd
        elif scan.torn_tail_at is not None:
            self._cut_back(scan.torn_tail_at)
        return scan

    # -- reading -----------------------------------------------------------------------------
    def scan(self, *, accept_unkeyed: bool = False) -> SpoolScan:
        """Read every good record; a torn tail and damaged regions are reported in the result, not raised.

        An unkeyed record is damage unless `accept_unkeyed` (`ledger spool replay --accept-unkeyed`)."""
        data = self.path.read_bytes() if self.path.exists() else b""
        return _scan(data, self._require_key(), accept_unkeyed)

    def _require_fd(self) -> int:
        if self._fd is None:
            raise RuntimeError("spool not opened")
        return self._fd

    def _require_key(self) -> bytes:
        if self._key is None:
            raise RuntimeError("spool not opened")
        return self._key


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # no progress: treat like the ENOSPC a retry would raise
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _check(data: bytes, offset: int) -> tuple[int, str | None]:
    """At `offset`: (record end, None) for a header whose length and CRC check out, else (-1, reason).

    The reason "torn" means the record runs past the end of the data.
    """
    end = len(data)
    if end - offset < _HEADER.size:
        return -1, "torn"
    length, crc = _HEADER.unpack_from(data, offset)
    start = offset + _HEADER.size
    if length > _MAX_RECORD:
        return -1, f"has an impossible length {length}"
    if start + length > end:
        return -1, "torn"
    if zlib.crc32(data[start : start + length]) != crc:
        return -1, "fails its checksum"
    return start + length, None


def _clean_to_end(data: bytes, offset: int) -> bool:
    """Whether good records follow one another from `offset` to exactly the end of the data."""
    while offset < len(data):
        offset, reason = _check(data, offset)
        if reason is not None:
            return False
    return True


def _record(body: bytes, key: bytes, accept_unkeyed: bool) -> tuple[SpoolRecord, bool]:
    """(record, keyed) of a body whose CRC checked out; ValueError if it is not one of this spool's records."""
    keyed = body[:1] == _KEYED
    if keyed:
        mac, body = body[1 : 1 + _MAC_BYTES], body[1 + _MAC_BYTES :]
        if not hmac.compare_digest(mac, hmac.digest(key, body, hashlib.sha256)):
            raise ValueError("is not keyed by this spool's key (a spool from another ledger, or forged)")
    elif not accept_unkeyed:
        raise ValueError(UNKEYED)
    try:
        return _decoder.decode(body), keyed
    except msgspec.DecodeError as exc:
        raise ValueError(f"does not decode: {exc}") from None


def _scan(data: bytes, key: bytes, accept_unkeyed: bool) -> SpoolScan:
    records: list[SpoolRecord] = []
    spans: list[tuple[int, int]] = []
    damaged: list[SpoolDamage] = []
    unkeyed = 0
    offset = 0
    end = len(data)
    while offset < end:
        record_end, reason = _check(data, offset)
        if reason is None:
            try:
                record, keyed = _record(data[offset + _HEADER.size : record_end], key, accept_unkeyed)
                records.append(record)
                spans.append((offset, record_end))
                unkeyed += not keyed
            except ValueError as exc:
                damaged.append(SpoolDamage(offset=offset, size=record_end - offset, reason=str(exc)))
            offset = record_end
            continue
        if reason == "fails its checksum":  # the length is plausible: trust it before scanning inside the body
            claimed_end = offset + _HEADER.size + _HEADER.unpack_from(data, offset)[0]
            if claimed_end == end:  # the last record: a torn write
                return SpoolScan(records, offset, end - offset, damaged, spans, unkeyed)
            if _check(data, claimed_end)[1] is None:
                damaged.append(SpoolDamage(offset=offset, size=claimed_end - offset, reason=reason))
                offset = claimed_end
                continue
        # resynchronise: the next offset where a header's length and CRC check out
        following = next((p for p in range(offset + 1, end - _HEADER.size + 1) if _check(data, p)[1] is None), None)
        if following is None:  # nothing valid after it: a torn tail (a crash mid-write), dropped
            return SpoolScan(records, offset, end - offset, damaged, spans, unkeyed)
        if reason == "torn":
            reason = "has a length running past the end of the file"
            if not _clean_to_end(data, following):
                # What a crash mid-write leaves; a CRC-valid header inside it that does not lead to
                # the end may be a client's body quoting a record: keep it all, replay none of it.
                damaged.append(SpoolDamage(offset=offset, size=end - offset, reason=reason + " (kept, not replayed)"))
                return SpoolScan(records, None, 0, damaged, spans, unkeyed)
        damaged.append(SpoolDamage(offset=offset, size=following - offset, reason=reason))
        offset = following
    return SpoolScan(records, None, 0, damaged, spans, unkeyed)
