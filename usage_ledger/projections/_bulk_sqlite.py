"""The SQLite statements of the bulk calls load: every payload parsed once, calls paired through an index.

    ledger_events ≤ head ─┬─ call.started (+ imported, retagged) ──json, typed──► work rebuild_starts
        (one scan each,   └─ call.finished / call.failed ──json, typed──► work rebuild_ends
         position order)
    starts in call-id order ⟕ their end (index on call id) ──► rebuild_rows (+ `plain` flag), in two
                                                               halves by call id, a file each
    every call that is not plain ──► rebuild_rest (positions, for the Python fold)

`_sqlite_prepare` runs them in a child process: the scans on two connections, the halves of the
rows on two processes, each into a work file of its own.

A call is plain when it has exactly one start, that start comes first, at most one end, no import
or retag, and every value below is in the canonical form msgspec writes (otherwise the Python fold
decides). Which fields the scans read is `call_sql`'s (over `_SQLitePayload`). Each statement
reads a JSON field once (every `->>` looks the path up in the payload's parse again and copies the
value out; on SQLite ≥ 3.45 `->>` is cheaper than `json_extract`) and computes each derived value
once, in layers fenced with `LIMIT -1` so the planner does not inline them. Sorting happens once,
on the call id alone (two small indexes), instead of grouping every event with its payload.

Values, exactly as `fold_call` computes them for a plain call: timestamps only in the two shapes
msgspec writes for UTC (`…:SSZ`, `…:SS.ffffffZ`), stored as SQLAlchemy stores them on SQLite
(`YYYY-MM-DD HH:MM:SS.ffffff`); durations as integer microseconds / 10⁶ like
`timedelta.total_seconds()`; tags only when their stored JSON is already canonical (sorted by
`encode_event`, nothing escaped); no payload holding a `\\u0000` escape.
"""

from __future__ import annotations

from usage_ledger.projections.call_rules import NO_END_STATUS, SPEC_COUNT_DIGITS, timestamp_shapes
from usage_ledger.projections.call_sql import (
    REPEATED_SQL,
    ROW_COLUMNS_SQL,
    ROWS_FROM_SQL,
    end_checks_sql,
    end_fields_sql,
    end_values_sql,
    folded_ids_sql,
    row_sql,
    start_fields_sql,
    start_values_sql,
)

__all__ = (
    "ENDS_INDEX",
    "ENDS_SELECT",
    "NOTE_EVERY",
    "NOTE_FUNCTION",
    "ORPHANS_POSSIBLE",
    "REPEATED_STATEMENTS",
    "STARTS_STATEMENTS",
    "rest_statements",
    "rows_statement",
)


_WHOLE, _FRACTION = timestamp_shapes("?")


def _ts(v: str) -> str:
    return (
        f"(CASE WHEN {v} GLOB '{_FRACTION}' THEN replace(substr({v}, 1, 26), 'T', ' ') "
        f"WHEN {v} GLOB '{_WHOLE}' THEN replace(substr({v}, 1, 19), 'T', ' ') || '.000000' END)"
    )


def _us(t: str) -> str:
    """Integer microseconds since the epoch of a stored timestamp (`YYYY-MM-DD HH:MM:SS.ffffff`)."""
    return f"(unixepoch(substr({t}, 1, 19)) * 1000000 + substr({t}, 21, 6))"


class _SQLitePayload:
    """`call_sql.PayloadSQL` for SQLite: each `->>` looks its path up in the parse SQLite keeps of the
    payload, so every field is read once, in the innermost layer."""

    position = "position"
    type = "type"
    # the escape of U+0000 in the text (the Python fold gives such an event's row, as on PostgreSQL,
    # whose JSON functions cannot parse it at all)
    clean = r"instr(payload, '\u0000') = 0"

    def field(self, path: str) -> str:
        return f"payload ->> '$.{path}'"

    json_text = field  # `->>` gives an object's JSON text

    def json(self, path: str) -> str:
        return f"payload -> '$.{path}'"

    def is_object(self, path: str) -> str:
        return f"json_type(payload, '$.{path}') = 'object'"

    def lacks(self, text: str, char: str) -> str:
        return f"instr({text}, '{char}') = 0"

    def integer(self, value: str) -> str:
        return value  # `->>` gives a JSON integer as one

    def moment(self, value: str) -> str:
        return _ts(value)

    def is_count(self, block: str, key: str) -> str:
        # `json_type` tells an integer from a real and from `true`/`false`
        in_range = f"{block} ->> '$.{key}' BETWEEN 0 AND {10**SPEC_COUNT_DIGITS - 1}"
        return f"json_type({block}, '$.{key}') = 'integer' AND {in_range}"

    def count(self, block: str, key: str) -> str:
        return f"{block} ->> '$.{key}'"


_P = _SQLitePayload()

NOTE_FUNCTION = "rebuild_note"
"""A function of one argument, the position, that the scanning connection must define; always true."""
NOTE_EVERY = 1024
"""The scans call `NOTE_FUNCTION` on every position that is a multiple of this (a power of two), for progress."""
# true for every row; on every `NOTE_EVERY`-th position also a call out, before the type is looked at
_NOTE = f"(position & {NOTE_EVERY - 1} <> 0 OR {NOTE_FUNCTION}(position))"

# Starts, and the few imports and retags (`started` = 0): any of those makes its call not plain.
_STARTS = f"""
CREATE TABLE work.rebuild_starts AS
SELECT cid, pos, started, run, ticker, model, request_blob, tags, started_at, {_us("started_at")} AS started_us
FROM (
  SELECT {start_values_sql(_P)}
  FROM (
    SELECT {start_fields_sql(_P)}
    FROM ledger_events
    WHERE position <= :head AND {_NOTE} AND +type IN ('call.started', 'call.imported', 'call.retagged')
    LIMIT -1
  ) LIMIT -1
) LIMIT -1
"""

# The ends scan's SELECT over positions `:first` to `:last` (`_sqlite_prepare` splits them between its
# two scan connections). Each moment's shape is checked once (`_ts` is NULL for any other shape):
# `valid` and the microseconds come from the converted text.
ENDS_SELECT = f"""
SELECT *, {_us("first_token_at")} AS first_us, {_us("last_token_at")} AS last_us, {_us("ended_at")} AS ended_us
FROM (
  SELECT {end_values_sql(_P)}
  FROM (
    SELECT {end_checks_sql(_P)}
    FROM (
      SELECT {end_fields_sql(_P)}
      FROM ledger_events
      WHERE position BETWEEN :first AND :last AND {_NOTE} AND +type IN ('call.finished', 'call.failed')
      LIMIT -1
    ) LIMIT -1
  ) LIMIT -1
) LIMIT -1
"""

# Each moment's integer microseconds (the scans computed them once): durations exact, as `timedelta`'s.
_MICROSECONDS = {
    "s.started_at": "s.started_us",
    "e.first_token_at": "e.first_us",
    "e.last_token_at": "e.last_us",
    "e.ended_at": "e.ended_us",
}


def _seconds(later: str, earlier: str) -> str:
    return f"({_MICROSECONDS[later]} - {_MICROSECONDS[earlier]}) / 1000000.0"


# One row per start (two if it has two ends), in call-id order; only `plain` rows are copied. `{op}`: the
# half of the starts, by call id against `:split` (`rows_statement`); the other half goes to a file of its own.
_ROWS = f"""
CREATE TABLE rebuild_rows AS
SELECT {ROW_COLUMNS_SQL}
FROM (
  SELECT {row_sql(seconds=_seconds)}
  {ROWS_FROM_SQL} AND s.cid {{op}} :split
  ORDER BY s.cid
  LIMIT -1
)
"""

# Every call that is not plain (a call id seen anywhere but not copied) with the positions of its events.
_REST = """
CREATE TABLE rebuild_rest AS
SELECT row_number() OVER () AS k,
       (SELECT group_concat(pos) FROM (
          SELECT pos FROM rebuild_starts x WHERE x.cid IS ids.cid
          UNION ALL SELECT pos FROM rebuild_ends x WHERE x.cid IS ids.cid
        )) AS positions
FROM ({ids}) ids
"""

# Whether an end may lack a start (a look-up per end finds them). None can when no call id has two
# starts and every end is in a row of `rebuild_rows` (either half): there each end meets its call's one start.
ORPHANS_POSSIBLE = f"""
SELECT EXISTS (SELECT 1 FROM rebuild_repeated_starts)
       OR (SELECT count(*) FROM rebuild_ends)
          <> (SELECT count(*) FROM rebuild_rows WHERE status <> '{NO_END_STATUS}')
             + (SELECT count(*) FROM u.rebuild_rows WHERE status <> '{NO_END_STATUS}')
"""


def rows_statement(*, upper: bool) -> str:
    """`rebuild_rows` for the starts below `:split` (the call id between the halves), or from it on (`upper`).

    With `:split` NULL (no start has a call id) both halves are empty, as every row would be.
    """
    return _ROWS.format(op=">=" if upper else "<")


def rest_statements(*, orphans: bool) -> tuple[str, ...]:
    """Every call that is not plain, with the positions of its events (`orphans`: look for ends without a start).

    On a connection whose `main` holds the lower half's `rebuild_rows`, the upper half's attached as `u`.
    """
    ids = folded_ids_sql(["rebuild_rows", "u.rebuild_rows"], orphans=orphans)
    return (_REST.format(ids=ids), "CREATE INDEX rebuild_rest_k ON rebuild_rest (k)")


# Call ids with more than one start (or retag, import) or more than one end, for `PLAIN_SQL`: written
# beside the tables they come from, which both halves of the rows read.
REPEATED_STATEMENTS = tuple(
    f"CREATE TABLE {schema}.rebuild_repeated_{kind} AS {REPEATED_SQL.format(table=f'{schema}.rebuild_{kind}')}"
    for schema, kind in (("s", "starts"), ("e", "ends"))
)

# The starts scan on its own connection, into its own work file attached as `work` (the ledger is `main`).
STARTS_STATEMENTS: tuple[str, ...] = (_STARTS, "CREATE INDEX work.rebuild_starts_cid ON rebuild_starts (cid)")
ENDS_INDEX = "CREATE INDEX e.rebuild_ends_cid ON rebuild_ends (cid)"
