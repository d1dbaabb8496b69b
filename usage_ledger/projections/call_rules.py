"""The calls read model's rules, each written once for both of its builders.

`calls.fold_call` applies them in Python (the follower, and the calls a rebuild cannot load in
bulk); the bulk rebuild runs them as SQL on both backends (`_bulk_sqlite`, `_bulk_pg` splice in the
fragments below). A rule of values (`FINISHED_STATUS`, `ENDED_AT`, `PREFILL_TPS`, `DECODE_TPS`) is one
`rule_expr` expression, made into both its SQL and its Python function; `DURATIONS` names the moments
each duration spans for both. What a speculative-decoding counter must be is written twice, side by
side (`spec_decode_counts` over the parsed value, `PayloadSQL.is_count` over the stored JSON text). A
rule changed here changes for every builder; the digest property tests
(tests/projections/test_rebuild_properties.py) hold the Python and the SQL to the same rows.

What the scans read of each event is written once too (`start_fields_sql`, `end_fields_sql`, over
each backend's JSON access, `PayloadSQL`); tests/projections/test_bulk_fields.py holds those reads
to the fields `fold_call`'s slim events declare. The row's SQL reads the work tables' names: `s` is
the call's start, `e` its end (NULL `e.pos` when it has none). `ROW_COLUMNS_SQL` over `row_sql` over
`ROWS_FROM_SQL` is the row both backends write for a plain call (`PLAIN_SQL`); what stays per backend is
how it parses a payload once (its `PayloadSQL` and the layers around the scans), its time arithmetic
(`row_sql`'s `seconds`), how it gathers the positions of the calls `folded_ids_sql` names, and on
SQLite the rows written in two halves by call id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from usage_ledger.projections.rule_expr import all_of, case, coalesce, differs, value
from usage_ledger.projections.tables import calls

__all__ = (
    "CALL_STATUSES",
    "DECODE_TPS",
    "DURATIONS",
    "ENDED_AT",
    "ENDED_AT_SQL",
    "END_KEPT_SQL",
    "END_VALID_SQL",
    "FAILED_END_STATUS",
    "FAILED_STATUSES",
    "FINISHED_STATUS",
    "NO_END_STATUS",
    "NO_USAGE",
    "PLAIN_SQL",
    "PREFILL_TPS",
    "REPEATED_SQL",
    "ROWS_FROM_SQL",
    "ROW_COLUMNS_SQL",
    "ROW_VALUES_SQL",
    "SPEC_COUNT_DIGITS",
    "SPEC_DECODE_KEYS",
    "TIMESTAMP_SHAPES",
    "PayloadSQL",
    "decode_rate_note",
    "decode_tps",
    "end_checks_sql",
    "end_fields_sql",
    "end_moments_sql",
    "end_values_sql",
    "ended_at",
    "finished_status",
    "folded_ids_sql",
    "prefill_tps",
    "row_sql",
    "spec_counts_sql",
    "spec_decode_counts",
    "spec_ok_sql",
    "start_fields_sql",
    "start_values_sql",
    "timestamp_shapes",
)

NO_END_STATUS = "incomplete"
"""The status of a call with no end recorded (yet, or ever)."""
FAILED_END_STATUS = "failed"
"""The status of a call whose end is `call.failed`: it broke off before the upstream's answer was whole
(upstream unreachable, timed out or reset, an error in its stream, the client gone, a gateway error)."""
FAILED_STATUSES = ("error", FAILED_END_STATUS)
"""The statuses of calls that did not succeed."""
CALL_STATUSES = ("ok", *FAILED_STATUSES, NO_END_STATUS)
"""Every status a call row can have."""
NO_USAGE = "absent"
"""The `usage_source` of a call without usage: the events' own default (`ledger.events`), and a row's
without an end. Its tokens are then 0, never invented."""

_HTTP_STATUS = value("http_status")
FINISHED_STATUS = case((all_of(_HTTP_STATUS >= 200, _HTTP_STATUS < 400), "ok"), otherwise="error")
"""A call the upstream answered: `ok` for 2xx and 3xx (what a client takes for success), else `error`."""
finished_status: Callable[[int], str] = FINISHED_STATUS.python("http_status")
"""`FINISHED_STATUS` of an HTTP status, in Python."""


STATUS_SQL = f"""CASE WHEN e.pos IS NULL THEN '{NO_END_STATUS}'
              WHEN e.finished THEN {FINISHED_STATUS.sql(http_status="e.http_status")} ELSE '{FAILED_END_STATUS}' END"""
"""`FINISHED_STATUS` for a call with a `call.finished` end; `failed` for `call.failed`, `incomplete` without an end."""

USAGE_SOURCE_SQL = f"CASE WHEN e.pos IS NULL THEN '{NO_USAGE}' ELSE COALESCE(e.usage_source, '{NO_USAGE}') END"
TOKENS_SQL = "COALESCE(e.prompt, 0) AS input_tokens, COALESCE(e.completion, 0) AS output_tokens"
"""No usage: 0 tokens (never invented; `usage_source` says `NO_USAGE`), as `call_fold.CallRow`'s defaults."""


TIMESTAMP_SHAPES = ("????-??-??T??:??:??Z", "????-??-??T??:??:??.??????Z")
"""The two shapes msgspec writes a UTC datetime in (whole seconds; microseconds), `?` one character:
the bulk SQL reads a stored moment only in these (any other shape makes the call not plain, and the
Python fold reads it)."""


def timestamp_shapes(one_char: str) -> tuple[str, str]:
    """`TIMESTAMP_SHAPES` as patterns whose one-character wildcard is `one_char` (`_` for LIKE)."""
    whole, fraction = (shape.replace("?", one_char) for shape in TIMESTAMP_SHAPES)
    return whole, fraction


ENDED_AT = coalesce(value("finished"), value("last_token"), value("headers"), value("received"))
"""When a call ended: its final event's moment, else the last thing seen of it."""
_Moment = datetime | None
ended_at: Callable[[_Moment, _Moment, _Moment, datetime], datetime] = ENDED_AT.python(
    "finished", "last_token", "headers", "received"
)
"""`ENDED_AT` of an end's moments (finished, last token, upstream headers, received), in Python."""


ENDED_AT_SQL = ENDED_AT.sql(finished="ts_finished", last_token="ts_last", headers="ts_headers", received="ts_received")
"""`ENDED_AT` over the moments of an end as the bulk SQL reads them (`end_moments_sql`)."""

_INPUT_TOKENS, _OUTPUT_TOKENS, _TTFT_S, _DECODE_S = map(value, ("input_tokens", "output_tokens", "ttft_s", "decode_s"))
PREFILL_TPS = case((all_of(_TTFT_S > 0, differs(_INPUT_TOKENS, 0)), _INPUT_TOKENS / _TTFT_S))
"""Prompt tokens over the time to the first token."""
DECODE_TPS = case((all_of(_DECODE_S > 0, _OUTPUT_TOKENS > 1), (_OUTPUT_TOKENS - 1) / _DECODE_S))
"""Tokens after the first over the time from the first to the last token (one token: no interval)."""
prefill_tps: Callable[[int, float | None], float | None] = PREFILL_TPS.python("input_tokens", "ttft_s")
"""`PREFILL_TPS` of (input tokens, TTFT s), in Python."""
decode_tps: Callable[[int, float | None], float | None] = DECODE_TPS.python("output_tokens", "decode_s")
"""`DECODE_TPS` of (output tokens, decode s), in Python."""


def decode_rate_note(
    decode_tps: float | None, output_tokens: int, first: datetime | None, last: datetime | None
) -> str | None:
    """Why a call has no decode rate (`decode_tps`'s rule, in words); None when it has one."""
    if decode_tps is not None:
        return None
    if output_tokens <= 1:
        return "at most one output token: no decode interval"
    if first is None or last is None:
        return "no token timings (not a stream, or no token arrived)"
    if last <= first:
        return "every token arrived in one read: no decode interval to divide by"
    return None  # pragma: no cover - decode_tps gives a rate in every other case


SPEC_DECODE_KEYS = ("num_draft_tokens", "num_accepted_draft_tokens", "num_spec_steps")
"""The counters of vLLM's per-request `speculative_decoding` block the calls read model keeps, in the
order of its columns `spec_draft_tokens`, `spec_accepted_tokens`, `spec_steps`."""
SPEC_COUNT_DIGITS = 15
"""A counter is kept when it is a JSON integer of at most this many digits (0 ≤ n < 10¹⁵): what
both backends' SQL can tell from the stored text and BIGINT holds."""


def spec_decode_counts(block: Any) -> tuple[int, int, int] | None:
    """(draft tokens, accepted draft tokens, spec steps) of the `speculative_decoding` block of a call's
    `request_metrics`, as vLLM sent it; None unless it holds all three as non-negative integers (booleans are not)."""
    if not isinstance(block, dict):
        return None
    draft, accepted, steps = (_spec_count(block.get(key)) for key in SPEC_DECODE_KEYS)
    if draft is None or accepted is None or steps is None:
        return None
    return draft, accepted, steps


def _spec_count(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value < 10**SPEC_COUNT_DIGITS else None


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

DURATIONS = (
    ("elapsed_s", "ended_at", "started_at"),
    ("ttft_s", "first_token_at", "started_at"),
    ("decode_s", "last_token_at", "first_token_at"),
)
"""A call's durations, each the seconds from the later of two of its row's moments back to the earlier
(`call_fold._derive` and `row_sql` compute them); `decode_s` is not a column, `DECODE_TPS` divides by it."""

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
