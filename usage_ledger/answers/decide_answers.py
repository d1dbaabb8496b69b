"""The stored answers behind a key's labels: per run, the text of the last completed call for the key.

What the Decide page opens for a flipped key, so the two groups' answers can be read side by side.
The key is the `ticker` tag (as `ledger agreement` and `labels import --extract` read it by default);
the text is the assistant text of the stored response (`agreement_labels.answer_text`), or why there is none.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from usage_ledger.answers.agreement_labels import answer_text, run_calls
from usage_ledger.answers.reports import live_versions
from usage_ledger.ledger import Database
from usage_ledger.projections import recorded_labels

__all__ = ("RunAnswer", "key_answers")


class RunAnswer(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    label: str | None
    """The label the ledger holds for the run and key."""
    calls: int
    """The run's calls for the key."""
    call_id: str | None = None
    """The call whose answer is shown: the last completed one."""
    text: str | None = None
    missing: str = ""
    """Why there is no text: no call, none completed, or the body's state (redacted, not stored, …)."""


async def key_answers(
    database: Database, runs: Sequence[str], key: str, *, run_gap_s: float = 900.0
) -> list[RunAnswer]:
    """Each run's answer for `key`, in the order given; NotFound for a run the ledger does not have."""
    version, _, _ = await live_versions(database)
    labels = await recorded_labels(database, runs)
    answers = []
    async with database.engine.connect() as conn:
        for run in runs:
            mine = [call for call in await run_calls(conn, version, run, run_gap_s) if call.tags.get("ticker") == key]
            done = [call for call in mine if call.status == "ok"]
            label = labels[run].get(key)
            if not done:
                answers.append(RunAnswer(run=run, label=label, calls=len(mine), missing="no completed call"))
                continue
            last = done[-1]
            text, why = await answer_text(conn, last.call_id, last.origin, last.response_blob)
            answers.append(
                RunAnswer(run=run, label=label, calls=len(mine), call_id=last.call_id, text=text, missing=why)
            )
    return answers
