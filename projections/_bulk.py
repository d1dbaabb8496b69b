"""Loading the calls read model in bulk, in SQL: a full rebuild without a Python pass over every event.

    ledger_events ≤ head ──GROUP BY call_id──► temp `rebuild_calls` (one row per call: counts, positions)
    plain calls (`call.started`, then at most one `call.finished` / `call.failed`)
        ──json fields──► temp `rebuild_raw` ──typed, derived──► temp `rebuild_rows` ──INSERT … SELECT──► rows
    every other call (imports, retags, repeats, out of order, unusual payloads) ──► the Python fold

Everything up to `rebuild_rows` only reads the ledger (`prepare_calls`), so the writer transaction
holds the write lock just for the copy and the few folded calls. The layers are fenced
(`LIMIT -1` / `OFFSET 0`) so the planner does not inline them and re-evaluate each JSON path per use.

The SELECT computes what `fold_call` computes for a plain call, value for value: timestamps only
in the two shapes msgspec writes for UTC (`…:SSZ`, `…:SS.ffffffZ`), tags only when their stored
JSON is already canonical (sorted by `encode_event`, nothing escaped), durations as integer
microseconds / 10⁶ like `timedelta.total_seconds()`. A call with anything else is left out of the
INSERT and folded in Python afterwards; the digest property test holds the two paths together.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from projections._bulk_sqlite import SQLITE_STATEMENTS

__all__ = ("drop_work_tables", "insert_plain_calls", "prepare_calls", "remaining_positions")

_TYPES = "('call.started', 'call.finished', 'call.failed', 'call.imported', 'call.retagged')"
_ENDS = "('call.finished', 'call.failed')"
_COLUMNS = (
    "version, call_id, run, ticker, tags, model, origin, source, status, http_status, failure_reason, "
    "usage_source, started_at, first_token_at, last_token_at, ended_at, elapsed_s, ttft_s, input_tokens, "
    "output_tokens, cached_tokens, prefill_tps, decode_tps, request_blob, response_blob, retags, last_position"
)
_TIMES = ("started_at", "received", "upstream_headers", "first_token", "last_token", "finished")


def _summary(call_id: str, positions: str, scan_type: str = "type") -> str:
    return f"""
CREATE TEMP TABLE rebuild_calls AS
SELECT {call_id} AS call_id,
       count(*) AS n,
       sum(CASE WHEN type = 'call.started' THEN 1 ELSE 0 END) AS starts,
       sum(CASE WHEN type IN {_ENDS} THEN 1 ELSE 0 END) AS ends,
       min(position) AS first_pos,
       max(CASE WHEN type = 'call.started' THEN position END) AS start_pos,
       max(CASE WHEN type IN {_ENDS} THEN position END) AS end_pos,
       {positions} AS positions
FROM ledger_events
WHERE position <= :head AND {scan_type} IN {_TYPES}
GROUP BY 1
"""


# One row per plain call: the raw values (timestamps still as stored JSON text), then the row.
def _plain(json_text: str, tags: str, doc: str, fence: str, tags_json: str = "NULL") -> str:
    def s(path: str) -> str:
        return json_text.format(doc="sd", path=path)

    def f(path: str) -> str:
        return json_text.format(doc="fd", path=path)

    return f"""
SELECT call_id, start_pos, end_pos, end_type,
       {s("run")} AS run, {s("tags.ticker")} AS ticker, {tags} AS tags, {s("model")} AS model,
       {s("request_blob")} AS request_blob, {s("received_at")} AS started_at,
       {f("timings.received")} AS received, {f("timings.upstream_headers")} AS upstream_headers,
       {f("timings.first_token")} AS first_token, {f("timings.last_token")} AS last_token,
       {f("timings.finished")} AS finished,
       {f("status")} AS status, {f("client_status")} AS client_status, {f("reason")} AS reason,
       {f("response_blob")} AS response_blob, {f("usage_source")} AS usage_source,
       {f("usage.prompt_tokens")} AS prompt_tokens, {f("usage.completion_tokens")} AS completion_tokens,
       {f("usage.cached_tokens")} AS cached_tokens
FROM (
  SELECT k.call_id, k.start_pos, k.end_pos, f.type AS end_type, s.payload AS sp, {tags_json} AS tj,
         {doc.format(p="s.payload")} AS sd, {doc.format(p="f.payload")} AS fd
  FROM rebuild_calls k
  JOIN ledger_events s ON s.position = k.start_pos
  LEFT JOIN ledger_events f ON f.position = k.end_pos
  WHERE k.call_id IS NOT NULL AND k.starts = 1 AND k.ends <= 1 AND k.n = 1 + k.ends AND k.start_pos = k.first_pos {fence}
) j {fence}"""


def _rows(json_text: str, tags: str, doc: str, ts: str, seconds: str, int_: str, fence: str, us: str) -> str:
    def t(name: str) -> str:
        return ts.format(v=name)

    valid = " AND ".join(f"({name} IS NULL OR {t(name)} IS NOT NULL)" for name in _TIMES)
    ended = f"COALESCE({t('finished')}, {t('last_token')}, {t('upstream_headers')}, {t('received')})"
    ended_ok = "WHEN end_type = 'call.finished' AND {s} >= 200 AND {s} < 400 THEN 'ok' ".format(
        s=int_.format(v="status")
    )
    return f"""
CREATE TEMP TABLE rebuild_rows AS
SELECT call_id, run, ticker, tags, model, 'gateway' AS origin, NULL AS source, status, http_status, failure_reason,
       usage_source, started_at, first_token_at, last_token_at, ended_at, elapsed_s, ttft_s, input_tokens,
       output_tokens, cached_tokens,
       CASE WHEN ttft_s > 0 AND input_tokens <> 0 THEN input_tokens / ttft_s END AS prefill_tps,
       CASE WHEN decode_s > 0 AND output_tokens > 1 THEN (output_tokens - 1) / decode_s END AS decode_tps,
       request_blob, response_blob, 0 AS retags, last_position
FROM (
  SELECT *,
         {seconds.format(a="ended_at", b="started_at")} AS elapsed_s,
         {seconds.format(a="first_token_at", b="started_at")} AS ttft_s,
         {seconds.format(a="last_token_at", b="first_token_at")} AS decode_s
  FROM (SELECT *{us} FROM (
    SELECT call_id, run, ticker, tags, model, request_blob, response_blob,
           {t("started_at")} AS started_at, {t("first_token")} AS first_token_at, {t("last_token")} AS last_token_at,
           CASE WHEN end_type IS NOT NULL THEN {ended} END AS ended_at,
           CASE WHEN end_type IS NULL THEN 'incomplete' {ended_ok} WHEN end_type = 'call.finished' THEN 'error'
                ELSE 'failed' END AS status,
           CASE WHEN end_type = 'call.finished' THEN {int_.format(v="status")}
                ELSE {int_.format(v="client_status")} END AS http_status,
           CASE WHEN end_type = 'call.failed' THEN reason END AS failure_reason,
           CASE WHEN end_type IS NULL THEN 'absent' ELSE COALESCE(usage_source, 'absent') END AS usage_source,
           COALESCE({int_.format(v="prompt_tokens")}, 0) AS input_tokens,
           COALESCE({int_.format(v="completion_tokens")}, 0) AS output_tokens,
           {int_.format(v="cached_tokens")} AS cached_tokens,
           COALESCE(end_pos, start_pos) AS last_position
    FROM rebuild_raw raw
    WHERE started_at IS NOT NULL AND {valid} AND tags IS NOT NULL {fence}
  ) typed {fence}) timed {fence}
) derived
"""


_PG_TS = (
    "(CASE WHEN {v} LIKE '____-__-__T__:__:__Z' OR {v} LIKE '____-__-__T__:__:__.______Z' THEN {v}::timestamptz END)"
)
_PG_TAGS = (
    "(CASE WHEN tj IS NULL THEN '{{}}' "
    "WHEN json_typeof(tj) = 'object' AND strpos(tj::text, '\\') = 0 THEN tj::text END)"
)


def _pg_path(doc: str, path: str) -> str:
    *parents, leaf = path.split(".")
    return f"({doc}" + "".join(f" -> '{p}'" for p in parents) + f" ->> '{leaf}')"


_PG = {
    "summary": _summary("payload::json ->> 'call_id'", "string_agg(position::text, ',')"),
    "raw": "CREATE TEMP TABLE rebuild_raw AS "
    + _plain("{{pg:{doc}:{path}}}", _PG_TAGS.format(), "{p}::jsonb", "OFFSET 0", "s.payload::json -> 'tags'"),
    "rows": _rows(
        "{{pg:{doc}:{path}}}",
        _PG_TAGS.format(),
        "{p}::jsonb",
        _PG_TS,
        "EXTRACT(EPOCH FROM ({a} - {b}))::float8",
        "({v})::bigint",
        "OFFSET 0",
        "",
    ),
}


def _pg_fill(sql: str) -> str:
    """Expand the `{pg:doc:path}` placeholders into jsonb extraction."""
    out, rest = [], sql
    while "{pg:" in rest:
        head, _, tail = rest.partition("{pg:")
        spec, _, rest = tail.partition("}")
        doc, path = spec.split(":")
        out.append(head + _pg_path(doc, path))
    return "".join(out) + rest


_PG["raw"] = _pg_fill(_PG["raw"])


_WORK_TABLES = (
    "rebuild_calls",
    "rebuild_raw",
    "rebuild_rows",
    "rebuild_rest",
    "rebuild_starts",
    "rebuild_ends",
)


async def drop_work_tables(conn: AsyncConnection) -> None:
    for table in _WORK_TABLES:
        await conn.execute(text(f"DROP TABLE IF EXISTS {table}"))


async def prepare_calls(conn: AsyncConnection, head: int) -> None:
    """Compute, in the session's temp tables, the row of every plain call up to `head` and the rest's positions.

    Reads the ledger only (no write lock on SQLite); `insert_plain_calls` then copies the rows.
    """
    await drop_work_tables(conn)
    if conn.dialect.name != "postgresql":
        for statement in SQLITE_STATEMENTS:
            await conn.execute(text(statement), {"head": head} if ":head" in statement else {})
        return
    await conn.execute(text(_PG["summary"]), {"head": head})
    await conn.execute(text(_PG["raw"]))
    await conn.execute(text(_PG["rows"]))
    await conn.execute(
        text(
            "CREATE TEMP TABLE rebuild_rest AS SELECT row_number() OVER () AS k, positions FROM rebuild_calls "
            "WHERE call_id IS NULL OR call_id NOT IN (SELECT call_id FROM rebuild_rows)"
        )
    )
    await conn.execute(text("CREATE INDEX rebuild_rest_k ON rebuild_rest (k)"))


async def insert_plain_calls(conn: AsyncConnection, version: int) -> int:
    """Insert the prepared row of every plain call into `version`; returns how many."""
    if conn.dialect.name == "postgresql":
        select_ = "SELECT :version, * FROM rebuild_rows ORDER BY call_id"
    else:  # rows were written in call-id order
        select_ = f"SELECT :version, {_COLUMNS.split(', ', 1)[1]} FROM rebuild_rows WHERE plain ORDER BY rowid"
    result = await conn.execute(text(f"INSERT INTO projection_calls ({_COLUMNS}) {select_}"), {"version": version})
    return int(result.rowcount or 0)


async def remaining_positions(conn: AsyncConnection) -> AsyncIterator[list[int]]:
    """Positions of the events of every call left to the Python fold, 1000 calls at a time."""
    after = 0
    while True:
        rows = (
            await conn.execute(
                text("SELECT k, positions FROM rebuild_rest WHERE k > :after ORDER BY k LIMIT :limit"),
                {"after": after, "limit": 1000},
            )
        ).all()
        if not rows:
            return
        after = rows[-1][0]
        yield sorted(int(p) for r in rows for p in r[1].split(","))
