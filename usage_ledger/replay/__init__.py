"""Replay: a recorded run's requests sent again to another server, through a real in-process gateway,
recorded as a new run (`ledger replay RUN --upstream URL`, docs/decide.md).

A writer that composes the gateway with the ledger, so it imports `gateway`, `ledger`, `projections`
and `answers`; only the CLI imports it. Modules: `plan` (which requests, in what order, their bodies),
`upstream` (is the target answering), `gateway` (the recording gateway in-process), `run` (the replay
itself and its summary line).
"""

from __future__ import annotations

from usage_ledger.replay.run import DEFAULT_DEADLINE_S, ReplayOptions, compare_replay, describe, replay_run

__all__ = (
    "DEFAULT_DEADLINE_S",
    "ReplayOptions",
    "compare_replay",
    "describe",
    "replay_run",
)
