"""Making a rename or a new link durable: the directory entry is on disk only after its directory is synced."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ("fsync_dir",)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
