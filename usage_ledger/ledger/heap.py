"""Keeping a long-running process's start-up objects out of the garbage collector's way."""

from __future__ import annotations

import gc

__all__ = ("freeze_startup_heap",)


def freeze_startup_heap() -> None:
    """Collect once, then move every object alive now out of all future collections (`gc.freeze`).

    Call when a long-running process (`ledger serve`, `ledger projections run --follow`) has
    started. Its start-up objects (modules, classes and functions of Litestar, SQLAlchemy, ...) live
    as long as it does, yet every full collection traversed all of them with the GIL held: ≈ 100k
    objects, 40-55 ms in the projection follower (a `gc.callbacks` probe, an estimate), whose SQLite
    write transaction (and so the gateway's strict-mode appends) waited that out.
    """
    gc.collect()
    gc.freeze()
