"""`ledger` subcommands contributed by the projections package."""

from __future__ import annotations

import argparse

__all__ = ("register",)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this package's subcommands to the `ledger` parser."""
