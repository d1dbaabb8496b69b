"""The calls read model's bulk SQL, made from `call_rules`: what the scans read of each event, and how a
plain call's row is made from its start and end. Both backends splice these in (`_bulk_sqlite`, `_bulk_pg`).

What the scans read is written once (`start_fields_sql`, `end_fields_sql`, over each backend's JSON access,
`PayloadSQL`); tests/projections/test_bulk_fields.py holds those reads to the fields `fold_call`'s slim
events declare. The row's SQL reads the work tables' names: `s` is the call's start, `e` its end (NULL
`e.pos` when it has none). `ROW_COLUMNS_SQL` over `row_sql` over `ROWS_FROM_SQL` is the row both backends
write for a plain call (`PLAIN_SQL`); what stays per backend is how it parses a payload once (its
`PayloadSQL` and the layers around the scans), its time arithmetic (`row_sql`'s `seconds`), how it gathers
the positions of the calls `folded_ids_sql` names, and on SQLite the rows written in two halves by call id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from usage_ledger.projections.call_rules import (
    DECODE_TPS,
    DURATIONS,
    ENDED_AT,
    FAILED_END_STATUS,
    FINISHED_STATUS,
    NO_END_STATUS,
    NO_USAGE,
    PREFILL_TPS,
    SPEC_DECODE_KEYS,
)
from usage_ledger.projections.tables import calls

__all__ = (
    "ENDED_AT_SQL",
    "END_KEPT_SQL",
    "END_VALID_SQL",
    "PLAIN_SQL",
    "REPEATED_SQL",
    "ROWS_FROM_SQL",
    "ROW_COLUMNS_SQL",
    "ROW_VALUES_SQL",
    "STATUS_SQL",
    "TOKENS_SQL",
    "USAGE_SOURCE_SQL",
    "PayloadSQL",
    "end_checks_sql",
    "end_fields_sql",
    "end_moments_sql",
    "end_values_sql",
    "folded_ids_sql",
    "row_sql",
    "spec_counts_sql",
    "spec_ok_sql",
    "start_fields_sql",
    "start_values_sql",
)

STATUS_SQL = f"""CASE WHEN e.pos IS NULL THEN '{NO_END_STATUS}'
              WHEN e.finished THEN {FINISHED_STATUS.sql(http_status="e.http_status")} ELSE '{FAILED_END_STATUS}' END"""
"""`FINISHED_STATUS` for a call with a `call.finished` end; `failed` for `call.failed`, `incomplete` without an end."""

USAGE_SOURCE_SQL = f"CASE WHEN e.pos IS NULL THEN '{NO_USAGE}' ELSE COALESCE(e.usage_source, '{NO_USAGE}') END"

TOKENS_SQL = "COALESCE(e.prompt, 0) AS input_tokens, COALESCE(e.completion, 0) AS output_tokens"
"""No usage: 0 tokens (never invented; `usage_source` says `NO_USAGE`), as `call_fold.CallRow`'s defaults."""

ENDED_AT_SQL = ENDED_AT.sql(finished="ts_finished", last_token="ts_last", headers="ts_headers", received="ts_received")
"""`ENDED_AT` over the moments of an end as the bulk SQL reads them (`end_moments_sql`)."""


def spec_ok_sql(p: PayloadSQL) -> str:
    """`spec_decode_counts`' test of `sd`, the block `end_fields_sql` reads: all three counters, or none."""
    return " AND ".join(p.is_count("sd", key) for key in SPEC_DECODE_KEYS)


def spec_counts_sql(p: PayloadSQL) -> str:
    """The counters as `spec_0`, `spec_1`, `spec_2` (`SPEC_DECODE_KEYS`' order) where the column `spec_ok`
    (`spec_ok_sql`, computed once a layer below: `end_checks_sql`) holds, else NULL."""
    return ", ".join(
        f"CASE WHEN spec_ok THEN {p.count('sd', key)} END AS spec_{i}" for i, key in enumerate(SPEC_DECODE_KEYS)
    )


ROW_VALUES_SQL = f"""s.cid AS call_id, s.run, s.ticker, s.tags, s.model, s.request_blob, e.response_blob, s.started_at,
e.first_token_at, e.last_token_at, e.ended_at,
{STATUS_SQL} AS status,
e.http_status, e.reason AS failure_reason,
{USAGE_SOURCE_SQL} AS usage_source,
{TOKENS_SQL}, e.cached AS cached_tokens,
e.spec_0 AS spec_draft_tokens, e.spec_1 AS spec_accepted_tokens, e.spec_2 AS spec_steps,
COALESCE(e.pos, s.pos) AS last_position"""
"""A plain call's values from its start `s` and end `e`, for `ROW_COLUMNS_SQL` to select from (`row_sql`
adds the durations and `plain`)."""

_ROW_MOMENTS_SQL = {
    "started_at": "s.started_at",
    "first_token_at": "e.first_token_at",
    "last_token_at": "e.last_token_at",
    "ended_at": "e.ended_at",
}
"""The row's moments as `ROW_VALUES_SQL` reads them, for `row_sql`'s durations."""

_COMPUTED_COLUMNS_SQL = {
    "origin": "'gateway'",
    "source": "CAST(NULL AS TEXT)",
    "prefill_tps": PREFILL_TPS.sql(),
    "decode_tps": DECODE_TPS.sql(),
    "retags": "0",
}
"""The row's columns `row_sql` does not select: a gateway call's constants, and the rates over its values."""

ROW_COLUMNS_SQL = ", ".join(
    [
        f"{_COMPUTED_COLUMNS_SQL[c.name]} AS {c.name}" if c.name in _COMPUTED_COLUMNS_SQL else c.name
        for c in calls.columns
        if c.name != "version"
    ]
    + ["plain"]
)
"""The calls row (every column of the table but `version`, in its order) and `plain`, selected over
`row_sql`: what both backends' bulk SQL writes to `rebuild_rows`. A column the table gains is selected
here by its name: `ROW_VALUES_SQL` (or `_COMPUTED_COLUMNS_SQL`) must give it, or the statement fails."""


class PayloadSQL(Protocol):
    """How one backend's bulk scans read a stored event: its JSON functions differ, what they read does not
    (`start_fields_sql`, `start_values_sql`, `end_fields_sql`, `end_moments_sql`, `spec_ok_sql`)."""

    position: str
    type: str
    """The event's position and type columns."""
    clean: str
    """True when the payload holds no JSON escape of U+0000 (such an event is never plain)."""

    def field(self, path: str) -> str:
        """The scalar at dotted `path` in the payload, as text or number (NULL when absent)."""
        ...

    def json(self, path: str) -> str:
        """The value at `path` as the backend's JSON (NULL when absent)."""
        ...

    def json_text(self, path: str) -> str:
        """The value at `path` as its JSON text (NULL when absent)."""
        ...

    def is_object(self, path: str) -> str:
        """Whether the value at `path` is a JSON object."""
        ...

    def lacks(self, text: str, char: str) -> str:
        """Whether `text` does not hold `char`."""
        ...

    def integer(self, value: str) -> str:
        """`value`, read by `field`, as an integer."""
        ...

    def moment(self, value: str) -> str:
        """`value`, a moment read by `field`, as the backend stores a timestamp when it has one of
        `TIMESTAMP_SHAPES`; else NULL."""
        ...

    def is_count(self, block: str, key: str) -> str:
        """Whether `key` of `block`, read by `json`, is what `spec_decode_counts` keeps: a JSON integer
        0 ≤ n < 10**`SPEC_COUNT_DIGITS` (what the stored text tells; not a boolean)."""
        ...

    def count(self, block: str, key: str) -> str:
        """That integer."""
        ...


def start_fields_sql(p: PayloadSQL) -> str:
    """What a scan reads of a start (`started` false for an import or retag, which make a call not plain)."""
    return f"""{p.field("call_id")} AS cid, {p.position} AS pos, {p.type} = 'call.started' AS started,
{p.clean} AS clean, {p.field("run")} AS run, {p.field("tags.ticker")} AS ticker, {p.json_text("tags")} AS tags,
{p.is_object("tags")} AS tags_object, {p.field("model")} AS model, {p.field("request_blob")} AS request_blob,
{p.field("received_at")} AS received_at"""


_BACKSLASH = "\\"  # (an f-string's expression cannot hold one before Python 3.12)


def start_values_sql(p: PayloadSQL) -> str:
    """A start's values over `start_fields_sql`: its tags only when their stored JSON is canonical
    (`encode_event` sorts them; nothing escaped), its time only in one of `TIMESTAMP_SHAPES`; else NULL,
    and the call is not plain."""
    return f"""cid, pos, started, run, ticker, model, request_blob,
CASE WHEN tags IS NULL THEN '{{}}' WHEN tags_object AND {p.lacks("tags", _BACKSLASH)} THEN tags END AS tags,
CASE WHEN clean THEN {p.moment("received_at")} END AS started_at"""


END_KEPT_SQL = "cid, pos, finished, http_status, reason, response_blob, usage_source, prompt, completion, cached"
"""The columns of `end_fields_sql` an ends work table keeps as read (`end_values_sql` adds the spec counters
and moments once `end_checks_sql` has checked their stored form, and `valid`, whether they all had it)."""

_TIMINGS = (
    ("received", "received"),
    ("upstream_headers", "headers"),
    ("first_token", "first"),
    ("last_token", "last"),
    ("finished", "finished"),
)
"""An end's moments (its `timings`) and the names the SQL gives them (`t_received` as stored,
`ts_received` as read…)."""


def end_fields_sql(p: PayloadSQL) -> str:
    """What a scan reads of an end: `call.finished` (its status, request metrics) or `call.failed` (the
    status its client got, the reason), `fold_call`'s `_finish`; moments as stored, `t_*`."""
    finished, failed = (f"{p.type} = 'call.{kind}'" for kind in ("finished", "failed"))
    timings = ", ".join(f"{p.field('timings.' + name)} AS t_{alias}" for name, alias in _TIMINGS)
    return f"""{p.field("call_id")} AS cid, {p.position} AS pos, {finished} AS finished, {p.clean} AS clean,
{p.integer(f"CASE WHEN {finished} THEN {p.field('status')} ELSE {p.field('client_status')} END")} AS http_status,
CASE WHEN {failed} THEN {p.field("reason")} END AS reason,
{p.field("response_blob")} AS response_blob, {p.field("usage_source")} AS usage_source,
{p.field("usage.prompt_tokens")} AS prompt, {p.field("usage.completion_tokens")} AS completion,
{p.field("usage.cached_tokens")} AS cached,
CASE WHEN {finished} THEN {p.json("request_metrics.speculative_decoding")} END AS sd,
{timings}"""


def end_moments_sql(p: PayloadSQL) -> str:
    """Over `end_fields_sql`: each moment as stored (`t_first`…) and as read (`ts_first`…: NULL unless it
    has one of `TIMESTAMP_SHAPES`)."""
    return ", ".join(f"t_{alias}, {p.moment(f't_{alias}')} AS ts_{alias}" for _, alias in _TIMINGS)


END_VALID_SQL = " AND ".join(f"(t_{alias} IS NULL OR ts_{alias} IS NOT NULL)" for _, alias in _TIMINGS) + " AND clean"
"""Over `end_moments_sql`: whether the bulk SQL may write an end's values (every moment absent or read, and a
payload without a U+0000 escape); `PLAIN_SQL` reads it as `e.valid`."""


def end_checks_sql(p: PayloadSQL) -> str:
    """Over `end_fields_sql`, in a layer of its own: the kept columns, the spec counters' test once
    (`spec_ok`) and each moment as stored and as read (`end_moments_sql`)."""
    return f"{END_KEPT_SQL}, clean, sd, sd IS NOT NULL AND {spec_ok_sql(p)} AS spec_ok,\n{end_moments_sql(p)}"


def end_values_sql(p: PayloadSQL) -> str:
    """Over `end_checks_sql`: an end's values as the row reads them (`e.…` in `ROW_VALUES_SQL`) and `valid`."""
    return f"""{END_KEPT_SQL}, {spec_counts_sql(p)},
ts_first AS first_token_at, ts_last AS last_token_at, {ENDED_AT_SQL} AS ended_at, {END_VALID_SQL} AS valid"""


REPEATED_SQL = "SELECT cid FROM {table} WHERE cid IS NOT NULL GROUP BY cid HAVING count(*) > 1"
"""The call ids with more than one row in the work table `table` (starts, or ends): never plain. Each backend
writes them to `rebuild_repeated_starts` and `rebuild_repeated_ends`, found once in the call ids rather than
counted per row; NULL ids are left out (`NOT IN` a list holding a NULL is never true; a NULL id is not plain)."""

ROWS_FROM_SQL = """FROM rebuild_starts s LEFT JOIN rebuild_ends e ON e.cid = s.cid
WHERE s.cid IS NOT NULL AND s.started"""
"""What `row_sql` selects from: one row per start with a call id (two if it has two ends); imports and
retags (`started` false) make a call not plain, and the rows only of plain calls are copied."""


def row_sql(*, seconds: Callable[[str, str], str]) -> str:
    """The select list of a plain call's row from its start `s` and end `e` (`ROWS_FROM_SQL`), for
    `ROW_COLUMNS_SQL`: `ROW_VALUES_SQL`, the durations, and `plain` (`PLAIN_SQL`).

    `seconds(later, earlier)` is the backend's time arithmetic: the seconds between two moments of the work
    tables (`e.ended_at`, `s.started_at`…), as `timedelta.total_seconds()` gives them (NULL when either is).
    """
    moment = _ROW_MOMENTS_SQL
    durations = ", ".join(f"{seconds(moment[later], moment[earlier])} AS {name}" for name, later, earlier in DURATIONS)
    return f"{ROW_VALUES_SQL},\n{durations},\n{PLAIN_SQL} AS plain"


PLAIN_SQL = (
    "s.tags IS NOT NULL AND s.started_at IS NOT NULL "
    "AND s.cid NOT IN (SELECT cid FROM rebuild_repeated_starts) "
    "AND (e.pos IS NULL OR (e.valid AND e.pos > s.pos AND s.cid NOT IN (SELECT cid FROM rebuild_repeated_ends)))"
)
"""Whether the bulk load may write a call's row itself, or leaves the call to `fold_call`.

Plain: its one start (no other start, import or retag: `REPEATED_SQL`) has canonical tags and time, and
it has no end, or one end after the start whose values are all canonical (`e.valid`). Anything else
(imports, retags, repeats, odd values) is folded in Python."""

_ORPHAN_ENDS_SQL = (
    "SELECT cid FROM rebuild_ends e WHERE NOT EXISTS (SELECT 1 FROM rebuild_starts s WHERE s.cid = e.cid)"
)


def folded_ids_sql(rows_tables: Sequence[str], *, orphans: bool) -> str:
    """The call ids the bulk load leaves to `fold_call` (a NULL one for events without an id), as `cid`: rows
    of `rows_tables` that are not plain, imports and retags, and (`orphans`: any may exist) ends without a start."""
    rows = [f"SELECT call_id AS cid FROM {table} WHERE NOT plain" for table in rows_tables]
    return "\nUNION ".join(
        [*rows, "SELECT cid FROM rebuild_starts WHERE NOT started OR cid IS NULL"]
        + ([_ORPHAN_ENDS_SQL] if orphans else [])
    )
