"""Answers: what reads the read models to answer a question, beside `projections/` which keeps them.

Named for what it does rather than for one of its outputs: reports, eras, compare, agreement,
decide, audit, the exports (Parquet, CSV, ClickHouse) and the JSON API all take the tables the
projections fold and the events the ledger holds, and answer from them; none appends an event or
writes a read model. Imports `projections` and `ledger` only; `ui`, `otel`, `imports` and `replay`
read through it, and the CLI (usage_ledger.commands) prints what it answers.
"""

from __future__ import annotations

__all__ = ()
