"""The labels and returns the ledger holds now, from its `labels.recorded` / `returns.recorded` events.

Labels: per (run, key) the latest event's label counts (an empty one withdraws the key's label).
Returns: per (key, as_of) the latest event's value; then per key the one with the latest `as_of`
(on or before `as_of` when asked); a return without a date counts only for a key that has no dated one,
and not at all when a date is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

import msgspec
from sqlalchemy import select

from usage_ledger.ledger import Database, LabelsRecorded, ReturnsRecorded
from usage_ledger.ledger.schema import events

__all__ = ("Returns", "parse_as_of", "recorded_labels", "recorded_return_values", "recorded_returns")

_labels = msgspec.json.Decoder(LabelsRecorded)
_returns = msgspec.json.Decoder(ReturnsRecorded)


class Returns(msgspec.Struct, frozen=True, kw_only=True):
    values: dict[str, float]
    """key → the return that counts."""
    keys_recorded: int
    """Keys with any return in the ledger (some may not count under `as_of`)."""


async def _payloads(database: Database, type_: str) -> list[str]:
    async with database.engine.connect() as conn:
        query = select(events.c.payload).where(events.c.type == type_).order_by(events.c.position)
        return [payload for (payload,) in (await conn.execute(query)).all()]


async def recorded_labels(database: Database, runs: Sequence[str]) -> dict[str, dict[str, str]]:
    """run → key → label, for `runs` (a run without labels maps to an empty dict)."""
    wanted = set(runs)
    latest: dict[str, dict[str, str]] = {run: {} for run in runs}
    for payload in await _payloads(database, "labels.recorded"):
        for item in _labels.decode(payload).labels:
            if item.run in wanted:
                latest[item.run][item.key] = item.label
    return {run: {key: label for key, label in keys.items() if label} for run, keys in latest.items()}


async def recorded_return_values(database: Database) -> dict[tuple[str, date | None], float]:
    """(key, as_of) → the latest event's return: every dated and undated value that is current."""
    latest: dict[tuple[str, date | None], float] = {}
    for payload in await _payloads(database, "returns.recorded"):
        for item in _returns.decode(payload).returns:
            latest[item.key, item.as_of] = item.value
    return latest


async def recorded_returns(database: Database, *, as_of: date | None = None) -> Returns:
    latest = await recorded_return_values(database)
    best: dict[str, tuple[date, float]] = {}
    undated: dict[str, float] = {}
    for (key, when), value in latest.items():
        if when is None:
            undated[key] = value
        elif (as_of is None or when <= as_of) and (key not in best or when > best[key][0]):
            best[key] = (when, value)
    values = {key: value for key, (_, value) in best.items()}
    if as_of is None:
        values.update({key: value for key, value in undated.items() if key not in values})
    return Returns(values=values, keys_recorded=len({key for key, _ in latest}))


def parse_as_of(text: str, field: str = "as_of") -> date | None:
    """An ISO date (YYYY-MM-DD) or None for an empty text; ValueError naming `field` otherwise."""
    if not text:
        return None
    try:
        if len(text) == 10:
            return date.fromisoformat(text)
    except ValueError:
        pass
    raise ValueError(f"{field}: expected a date YYYY-MM-DD, got {text!r}")
