"""Files the ledger trusts: a rename or a new link made durable (its directory synced), and state files
checked to be the gateway's own before they are read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from usage_ledger.ledger.errors import ConfigError

__all__ = ("check_owned", "fsync_dir")


def check_owned(path: Path, what: str) -> None:
    """ConfigError unless `path` is owned by this process's user or root and no one else may write to it.

    A file others can write, or one another user left, may be planted (a spool of forged events, a known
    key): it is refused with what to do, never read. Read access for others is not checked here (a key
    shared read-only between replicas is allowed; its own module may warn). A sticky directory (`/tmp`)
    others may write to is allowed: they cannot replace or remove what is ours in it, and what we read from
    it is checked itself.
    """
    info = path.stat()
    owners = {os.geteuid(), 0}
    if info.st_uid not in owners:
        raise ConfigError(
            f"{what} {path} is owned by uid {info.st_uid}, not by this gateway's user ({os.geteuid()}) or root: "
            "it may have been planted; check it, then `chown` it or remove it"
        )
    sticky_dir = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX  # like /tmp: others cannot replace ours
    if stat.S_IMODE(info.st_mode) & 0o022 and not sticky_dir:
        raise ConfigError(
            f"{what} {path} may be written by other users (mode {stat.S_IMODE(info.st_mode):04o}): it may have been "
            f"tampered with; check it, then `chmod go-w {path}`"
        )


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
