"""The PostgreSQL statements of the bulk calls load: each payload parsed once, calls paired by hash joins.

    ledger_events ≤ head ─┬─ call.started (+ imported, retagged) ──json_to_record──► temp rebuild_starts
                          └─ call.finished / call.failed ──json_to_record──► temp rebuild_ends
    the call ids with more than one start, or end ──► temp rebuild_repeated_starts, _ends
    starts ⟕ their end ──► temp rebuild_rows (+ `plain` flag)
    every call that is not plain ──► temp rebuild_rest (positions, for the Python fold)

`json_to_record` reads every field a statement needs in one pass over the payload text (no
`::jsonb` of whole payloads); which fields, and what becomes of them, is `call_sql`'s (over
`_PostgresPayload`). Values as `fold_call` computes them, with the same rules as the
SQLite statements (`_bulk_sqlite`): timestamps only in the two shapes msgspec writes for UTC,
tags only when their stored JSON is canonical, durations exact (`EXTRACT(EPOCH …)` is numeric),
no payload holding a `\\u0000` escape.
"""

from __future__ import annotations

from usage_ledger.projections.call_rules import SPEC_COUNT_DIGITS, timestamp_shapes
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

__all__ = ("PG_STATEMENTS",)


_WHOLE, _FRACTION = timestamp_shapes("_")


def _ts(v: str) -> str:
    return f"(CASE WHEN {v} LIKE '{_WHOLE}' OR {v} LIKE '{_FRACTION}' THEN {v}::timestamptz END)"


# A payload holding the JSON escape of U+0000: PostgreSQL's JSON functions refuse to parse it at all
# ("unsupported Unicode escape sequence"). Such an event is never plain — the Python fold gives
# its row under the one rule of `projections.text` — and only its call id is read here, from the
# payload with each real `\u0000` escape (one not itself escaped, as in `\\u0000`) neutralised.
_CLEAN = r"strpos({p}, '\u0000') = 0"
_CALL_ID_ONLY = (
    r"json_build_object('call_id', "
    r"regexp_replace({p}, '(?<!\\)((\\\\)*)\\u0000', '\1\\ufffd', 'g')::json ->> 'call_id')"
)


def _parsed(p: str) -> str:
    """The payload `p` as json for `json_to_record`: whole when it has no NUL escape, else its call id alone."""
    return f"(CASE WHEN {_CLEAN.format(p=p)} THEN {p}::json ELSE {_CALL_ID_ONLY.format(p=p)} END)"


class _PostgresPayload:
    """`call_sql.PayloadSQL` for PostgreSQL, over the records `json_to_record` reads the payload into
    (one parse of its text each): `r` for the payload, and `u`, `t` for its `usage`, `timings` in the ends."""

    position = "e.position"
    type = "e.type"
    clean = _CLEAN.format(p="e.payload")
    _RECORDS = {"usage": "u", "timings": "t"}

    def field(self, path: str) -> str:
        top, _, inner = path.partition(".")
        if not inner:
            return f"r.{top}"
        return f"{self._RECORDS[top]}.{inner}" if top in self._RECORDS else f"r.{top} ->> '{inner}'"

    def json(self, path: str) -> str:
        top, _, inner = path.partition(".")
        return f"r.{top} -> '{inner}'" if inner else f"r.{top}"

    def json_text(self, path: str) -> str:
        return f"{self.json(path)}::text"

    def is_object(self, path: str) -> str:
        return f"json_typeof({self.json(path)}) = 'object'"

    def lacks(self, text: str, char: str) -> str:
        return f"strpos({text}, '{char}') = 0"

    def integer(self, value: str) -> str:
        return f"({value})::bigint"

    def moment(self, value: str) -> str:
        return _ts(value)

    def is_count(self, block: str, key: str) -> str:
        # a JSON number written as plain digits (msgspec writes a float with a point or an exponent)
        return (
            f"json_typeof({block} -> '{key}') = 'number' AND ({block} ->> '{key}') ~ '^[0-9]{{1,{SPEC_COUNT_DIGITS}}}$'"
        )

    def count(self, block: str, key: str) -> str:
        return f"({block} ->> '{key}')::bigint"


_P = _PostgresPayload()


_STARTS = f"""
CREATE TEMP TABLE rebuild_starts AS
SELECT {start_values_sql(_P)}
FROM (
  SELECT {start_fields_sql(_P)}
  FROM ledger_events e,
       json_to_record({_parsed("e.payload")}) AS r(call_id text, run text, tags json, model text,
                                                   request_blob text, received_at text)
  WHERE e.position <= :head AND e.type IN ('call.started', 'call.imported', 'call.retagged')
) x
"""

_ENDS = f"""
CREATE TEMP TABLE rebuild_ends AS
SELECT {end_values_sql(_P)}
FROM (
  SELECT {end_checks_sql(_P)}
  FROM (
    SELECT {end_fields_sql(_P)}
    FROM ledger_events e
    CROSS JOIN LATERAL json_to_record({_parsed("e.payload")}) AS r(call_id text, status text, client_status text,
                                                                 reason text, response_blob text, usage_source text,
                                                                 usage json, timings json, request_metrics json)
    LEFT JOIN LATERAL json_to_record(r.usage) AS u(prompt_tokens bigint, completion_tokens bigint,
                                                   cached_tokens bigint)
      ON true
    LEFT JOIN LATERAL json_to_record(r.timings) AS t(received text, upstream_headers text, first_token text,
                                                     last_token text, finished text)
      ON true
    WHERE e.position <= :head AND e.type IN ('call.finished', 'call.failed')
    OFFSET 0
  ) x
  OFFSET 0
) y
"""


def _seconds(later: str, earlier: str) -> str:
    # `EXTRACT(EPOCH …)` of an interval is numeric: exact microseconds, as `timedelta`'s
    return f"EXTRACT(EPOCH FROM ({later} - {earlier}))::float8"


# Call ids with more than one start (or retag, import) or more than one end, for `PLAIN_SQL`.
_REPEATED = tuple(
    f"CREATE TEMP TABLE rebuild_repeated_{kind} AS {REPEATED_SQL.format(table='rebuild_' + kind)}"
    for kind in ("starts", "ends")
)

# One row per start (two if it has two ends); only `plain` rows are copied.
_ROWS = f"""
CREATE TEMP TABLE rebuild_rows AS
SELECT {ROW_COLUMNS_SQL}
FROM (
  SELECT {row_sql(seconds=_seconds)}
  {ROWS_FROM_SQL}
) x
"""

# Every call that is not plain (a call id seen anywhere but not copied) with the positions of its events.
_REST = f"""
CREATE TEMP TABLE rebuild_rest AS
SELECT row_number() OVER () AS k, positions FROM (
  SELECT string_agg(x.pos::text, ',') AS positions
  FROM (SELECT cid, pos FROM rebuild_starts UNION ALL SELECT cid, pos FROM rebuild_ends) x
  WHERE x.cid IS NULL OR x.cid IN ({folded_ids_sql(["rebuild_rows"], orphans=True)})
  GROUP BY x.cid
) g
"""

PG_STATEMENTS: tuple[str, ...] = (
    _STARTS,
    _ENDS,
    "ANALYZE rebuild_starts",
    "ANALYZE rebuild_ends",
    *_REPEATED,
    _ROWS,
    _REST,
    "CREATE INDEX rebuild_rest_k ON rebuild_rest (k)",
)
