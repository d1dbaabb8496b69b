"""The rules every key file of an installation follows: the fingerprint key (`gateway.fingerprint_key`), the
spool's key (`ledger.spool`) and the checkpoint signing key (`ledger.checkpoint`).

    read_key_file(path, what)    the file's bytes, if it is ours: owned by this user or root and writable by no one
                                 else (`durable.check_owned`, ConfigError otherwise); readable by others: a warning
    check_random(key, path, what, hint)
                                 ConfigError for a key whose bytes are all the same (all zeros: a planted key)

Why (what a planted key would allow): docs/configuration.md, "Every key file".
"""

from __future__ import annotations

import stat
from pathlib import Path

import structlog

from usage_ledger.ledger.durable import check_owned
from usage_ledger.ledger.errors import ConfigError

__all__ = ("check_random", "read_key_file")

log = structlog.get_logger("ledger.key_files")


def read_key_file(path: Path, what: str) -> bytes:
    """The bytes of the key file `path` (`what` names it in errors and logs); FileNotFoundError as it comes."""
    check_owned(path, what)
    data = path.read_bytes()
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning(f"{what.replace(' ', '_')}_readable_by_others", path=str(path), mode=f"{mode:04o}", expected="0600")
    return data


def check_random(key: bytes, path: Path, what: str, hint: str) -> None:
    """ConfigError unless `key` could be random: every byte the same is a key anyone can guess."""
    if len(set(key)) <= 1:
        first = key[0] if key else 0
        raise ConfigError(f"{what} {path} holds a key that is not random (every byte {first:#04x}): {hint}")
