"""The installation's fingerprint key: what makes a recorded secret's fingerprint useless offline.

    load_fingerprint_key(settings, spool_dir)
      LEDGER_FINGERPRINT_KEY_FILE set   → read it; missing, unreadable or malformed: ConfigError (exit 2)
      unset → <parent of LEDGER_SPOOL_DIR>/ledger-fingerprint.key, created (mode 0600) on first start

The fingerprint's form, why a configured file is never created, and the rules of every key file
(`ledger.read_key_file`, `ledger.check_random`): docs/configuration.md, "Security: secrets and the fingerprint key".
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

import structlog

from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger import ConfigError, check_random, fsync_dir, read_key_file

__all__ = ("DEFAULT_KEY_FILE_NAME", "FINGERPRINT_PREFIX", "FingerprintKey", "key_file_path", "load_fingerprint_key")

log = structlog.get_logger("gateway.fingerprint_key")

FINGERPRINT_PREFIX = "hmac-sha256:"
DEFAULT_KEY_FILE_NAME = "ledger-fingerprint.key"
_KEY_BYTES = 32
_KEY_TEXT = re.compile(r"[0-9a-fA-F]{64}")
_KEY_ID_DOMAIN = b"usage-ledger/fingerprint-key-id/v1\x00"
_WHAT = "fingerprint key file"
_CREATE_HINT = (
    "create one with `(umask 077; openssl rand -hex 32 > {path})`, or copy the key file of the gateways "
    "that share this database"
)


class FingerprintKey:
    """A 256-bit key; `fingerprint(value)` is the stored stand-in for a secret."""

    __slots__ = ("_mac", "key_id")

    def __init__(self, key: bytes) -> None:
        if len(key) != _KEY_BYTES:
            raise ValueError(f"a fingerprint key is {_KEY_BYTES} bytes, not {len(key)}")
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self.key_id = hashlib.sha256(_KEY_ID_DOMAIN + key).hexdigest()[:8]
        """Names the key, not any secret: fingerprints with different ids are not comparable."""

    @classmethod
    def generate(cls) -> FingerprintKey:
        """A random key kept only in memory (tests, embedding): fingerprints compare within this process only."""
        return cls(secrets.token_bytes(_KEY_BYTES))

    def fingerprint(self, value: bytes) -> str:
        mac = self._mac.copy()
        mac.update(value)
        return f"{FINGERPRINT_PREFIX}{self.key_id}:{mac.hexdigest()[:16]}"


def key_file_path(settings: GatewaySettings, spool_dir: str) -> tuple[Path, bool]:
    """The key file, and whether it was configured (else the default beside the spool directory)."""
    if settings.fingerprint_key_file is not None:
        if not settings.fingerprint_key_file.strip():
            raise ConfigError("LEDGER_FINGERPRINT_KEY_FILE is empty: give the key file's path, or unset it")
        return Path(settings.fingerprint_key_file), True
    return Path(spool_dir).absolute().parent / DEFAULT_KEY_FILE_NAME, False


def load_fingerprint_key(settings: GatewaySettings, spool_dir: str) -> FingerprintKey:
    """Read (or, at the default path, create on first start) the installation's key; ConfigError if unusable."""
    path, configured = key_file_path(settings, spool_dir)
    try:
        text = read_key_file(path, _WHAT)
    except FileNotFoundError:
        if configured:
            raise ConfigError(
                f"LEDGER_FINGERPRINT_KEY_FILE={path}: no such file; " + _CREATE_HINT.format(path=path)
            ) from None
        return _create(path)
    except OSError as exc:
        raise ConfigError(f"cannot read the fingerprint key file {path}: {exc.strerror or exc}") from None
    key = _parse(path, text)
    log.info("fingerprint_key_loaded", path=str(path), key_id=key.key_id)
    return key


def _parse(path: Path, text: bytes) -> FingerprintKey:
    stripped = text.strip()
    if not _KEY_TEXT.fullmatch(stripped.decode("latin-1")):
        raise ConfigError(
            f"{path} does not hold a fingerprint key: expected 64 hex digits (32 random bytes) and nothing else; "
            + _CREATE_HINT.format(path=path)
        )
    key = bytes.fromhex(stripped.decode("ascii"))
    check_random(key, path, _WHAT, _CREATE_HINT.format(path=path))
    return FingerprintKey(key)


def _create(path: Path) -> FingerprintKey:
    """Write a new key atomically: a complete temporary file, hard-linked into place only if none is there.

    Two gateways starting at once with the same default path end up with the one key the first linked.
    """
    key = secrets.token_bytes(_KEY_BYTES)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.write(fd, key.hex().encode("ascii") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:  # another gateway created it first: use theirs
            return _parse(path, path.read_bytes())
        fsync_dir(path.parent)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the fingerprint key file {path}: {exc.strerror or exc}; "
            "set LEDGER_FINGERPRINT_KEY_FILE to an existing key file"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    created = FingerprintKey(key)
    log.info("fingerprint_key_created", path=str(path), key_id=created.key_id)
    return created
