"""The installed version, read from the distribution's metadata: `pyproject.toml` is its one source."""

from __future__ import annotations

from importlib.metadata import version

__all__ = ("VERSION",)

VERSION = version("usage-ledger")
