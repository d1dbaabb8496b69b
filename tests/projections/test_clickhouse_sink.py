"""The ClickHouse sink (`answers.clickhouse_sink`): the export loaded into chdb (ClickHouse in-process) with
the printed schema, on both backends, and checked against the product's own figures: the calls read model's
row count, `report runs`, the daily report, every value of every row; a retag re-exported incrementally
replaces its row (and a stale export loaded again does not bring the old one back)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
import structlog

from tests._required import unavailable
from tests.projections.helpers import append, at, failed, finished, started
from usage_ledger.answers.callviews import calls_page, iter_calls
from usage_ledger.answers.clickhouse_sink import (
    LOW_CARDINALITY,
    NOT_IN_SINK,
    SINK_COLUMNS,
    VERSION_COLUMN,
    clickhouse_schema,
)
from usage_ledger.answers.export import export_calls
from usage_ledger.answers.export_columns import EXPORT_COLUMNS, ExportColumn
from usage_ledger.answers.reports import daily_report, runs_report
from usage_ledger.cli import main
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallFinished, CallImported, CallRetagged, CallStarted, Timings, Usage, new_event
from usage_ledger.projections.call_rules import FAILED_STATUSES
from usage_ledger.projections.rows import CallView

TABLE = "sink.calls"
ZONE = "Asia/Seoul"  # the calls cross its midnight (15:00 UTC): days in ClickHouse must follow the zone
_FAILED = ", ".join(f"'{s}'" for s in FAILED_STATUSES)


def _require_chdb() -> Any:
    try:
        from chdb import session
    except ImportError:
        unavailable(
            "the ClickHouse sink tests need chdb (pip install -e '.[dev]')",
            required=os.environ.get("LEDGER_TEST_REQUIRE_CHDB") == "1",
        )
    return session


@pytest.fixture
def clickhouse(tmp_path: Path) -> Iterator[Any]:
    """A chdb session with the sink's table created from the printed schema."""
    sess = _require_chdb().Session(str(tmp_path / "chdb"))
    try:
        sess.query("CREATE DATABASE sink")
        sess.query(clickhouse_schema(TABLE))
        yield sess
    finally:
        sess.close()


def _load(ch: Any, path: Path, fmt: str) -> None:
    """As docs/scaling.md loads it with clickhouse-client (INSERT … FORMAT, the settings it names for JSONL)."""
    if fmt == "parquet":
        ch.query(f"INSERT INTO {TABLE} FROM INFILE '{path}' FORMAT Parquet")
    else:
        settings = "date_time_input_format = 'best_effort', input_format_skip_unknown_fields = 1"
        ch.query(f"INSERT INTO {TABLE} FROM INFILE '{path}' SETTINGS {settings} FORMAT JSONEachRow")


def _rows(ch: Any, sql: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ch.query(sql, "ArrowTable").to_pylist()
    return rows


def _non_stream(call_id: str, t0: float, t1: float, *, prompt: int, completion: int, status: int = 200) -> Any:
    body = CallFinished(
        call_id=call_id,
        status=status,
        usage=Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion),
        usage_source="reported",
        timings=Timings(received=at(t0), upstream_headers=at(t1 - 0.01), finished=at(t1)),
    )
    return new_event(body, stream=f"call-{call_id}", occurred_at=at(t1))


def _imported(call_id: str, days_before: float, *, tokens_in: int, run: str | None, ttft: float | None) -> Any:
    t = at(0) - timedelta(days=days_before)
    body = CallImported(
        call_id=call_id,
        source="old.jsonl",
        line=1,
        started_at=t,
        finished_at=t + timedelta(seconds=30),
        input_tokens=tokens_in,
        output_tokens=700,
        run=run,
        model="old-model",
        ttft_s=ttft,
        tags={"ticker": "IMP"},
    )
    return new_event(body, stream=f"call-{call_id}", occurred_at=t + timedelta(seconds=30))


async def _seed(database: Database) -> None:
    """Stream, non-stream, failed, upstream-error, unfinished, imported (February: a second partition),
    untagged (an auto- run), implausible counts, unicode and NUL in tags."""
    hour = 3600.0
    odd_tags = CallStarted(
        call_id="odd",
        received_at=at(2 * hour + 0.123457),  # microseconds: DateTime64(6) keeps them
        method="POST",
        path="/v1/chat/completions",
        run="r1",
        tags={"ticker": "삼성", "desk\x00": "a\x00b", "emoji": "📈 ü"},
        model="m",
        stream=True,
    )
    await append(
        database,
        *(started(f"s{i}", i * hour, run="r1", ticker=f"T{i % 3}") for i in range(6)),
        *(finished(f"s{i}", i * hour, i * hour + 20, prompt=1000 + i, completion=100 + i) for i in range(6)),
        new_event(odd_tags, stream="call-odd", occurred_at=at(2 * hour)),
        finished("odd", 2 * hour + 0.123457, 2 * hour + 9.654321, prompt=5, completion=6, ttft=0.000001),
        *(started(f"n{i}", 30 + i * hour, run="r2", model="m2") for i in range(3)),
        *(_non_stream(f"n{i}", 30 + i * hour, 40 + i * hour, prompt=2000, completion=1) for i in range(3)),
        started("f1", 50, run="r1"),
        failed("f1", 50, 51),
        started("e1", 60, run="r2", model="m2"),
        _non_stream("e1", 60, 61, prompt=0, completion=0, status=500),
        started("u1", 4 * hour + 5, run="r2", model="m2"),  # never finishes: incomplete, ended_at NULL
        started("big", 70, run="r1"),
        finished("big", 70, 80, prompt=2**70, completion=2**64),  # implausible: kept out of every sum
        started("a1", 9 * hour),
        finished("a1", 9 * hour, 9 * hour + 3, prompt=7, completion=8),
        started("a2", 9 * hour + 10),
        finished("a2", 9 * hour + 10, 9 * hour + 13, prompt=9, completion=10),
        _imported("i1", 20, tokens_in=300, run="imp", ttft=None),
        _imported("i2", 19.5, tokens_in=2**63, run="imp", ttft=0.25),
    )


async def _check_against_reports(database: Database, ch: Any) -> None:
    page = await calls_page(database, limit=1)
    assert _rows(ch, f"SELECT count() AS n FROM {TABLE} FINAL") == [{"n": page.total}]

    runs = await runs_report(database)
    tagged = {
        r.run: (r.calls, r.failed_calls, r.input_tokens, r.output_tokens) for r in runs if not r.run.startswith("auto-")
    }
    untagged = [r for r in runs if r.run.startswith("auto-")]
    per_run = _rows(
        ch,
        f"SELECT run, count() AS calls, countIf(status IN ({_FAILED})) AS failed, sum(input_tokens) AS tin,"
        f" sum(output_tokens) AS tout FROM {TABLE} FINAL GROUP BY run",
    )
    got = {r["run"]: (r["calls"], r["failed"], r["tin"], r["tout"]) for r in per_run}
    assert got.pop(None) == tuple(
        sum(getattr(r, f) for r in untagged) for f in ("calls", "failed_calls", "input_tokens", "output_tokens")
    )
    assert got == tagged

    daily = await daily_report(database, tz=ZONE)
    per_day = _rows(
        ch,
        f"SELECT toString(toDate(started_at, '{ZONE}')) AS day, count() AS calls,"
        f" countIf(status IN ({_FAILED})) AS failed_calls, sum(input_tokens) AS input_tokens,"
        f" sum(output_tokens) AS output_tokens FROM {TABLE} FINAL GROUP BY day ORDER BY day",
    )
    assert per_day == [msgspec.structs.asdict(d) for d in daily]
    assert len(daily) >= 3  # February's imports and two local days in March


def _sink_values(view: CallView) -> dict[str, Any]:
    return {c.name: getattr(view, c.name) for c in SINK_COLUMNS}


async def _check_rows(database: Database, ch: Any) -> None:
    """Every value of every row as the export has it (the types map exactly: times to the microsecond, NULLs)."""
    want = {v.call_id: _sink_values(v) async for v in iter_calls(database)}
    got = {}
    for row in _rows(ch, f"SELECT * FROM {TABLE} FINAL"):
        row["tags"] = dict(row["tags"])
        got[row["call_id"]] = row
    assert got.keys() == want.keys()
    for call_id, values in want.items():
        assert got[call_id] == values, call_id


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
async def test_loaded_sink_agrees_with_the_reports(
    database: Database, clickhouse: Any, tmp_path: Path, fmt: str
) -> None:
    await _seed(database)
    first = tmp_path / f"calls.{fmt}"
    done = await export_calls(database, fmt=fmt, output=first)
    assert done.calls == (await calls_page(database, limit=1)).total == 18
    _load(clickhouse, first, fmt)
    await _check_against_reports(database, clickhouse)
    await _check_rows(database, clickhouse)
    partitions = _rows(clickhouse, f"SELECT DISTINCT _partition_id AS p FROM {TABLE} ORDER BY p")
    assert [r["p"] for r in partitions] == ["202602", "202603"]
    odd = _rows(clickhouse, f"SELECT tags FROM {TABLE} FINAL WHERE call_id = 'odd'")
    assert dict(odd[0]["tags"]) == {"ticker": "삼성", "desk\ufffd": "a\ufffdb", "emoji": "📈 ü"}

    # a retag moves s1 to r2: the incremental export holds that one call, and loading it replaces the row
    retag = CallRetagged(call_id="s1", reason="wrong run", run="r2", tags={"fixed": "yes"})
    await append(database, new_event(retag, stream="call-s1", occurred_at=at(99_999)))
    second = tmp_path / f"changed.{fmt}"
    again = await export_calls(database, fmt=fmt, output=second, since_position=done.position)
    assert (again.calls, again.position) == (1, done.position + 1)
    _load(clickhouse, second, fmt)
    _load(clickhouse, first, fmt)  # an older export loaded again does not bring the old row back
    await _check_against_reports(database, clickhouse)
    await _check_rows(database, clickhouse)
    (s1,) = _rows(clickhouse, f"SELECT run, retags, tags FROM {TABLE} FINAL WHERE call_id = 's1'")
    assert (s1["run"], s1["retags"], dict(s1["tags"])) == ("r2", 1, {"ticker": "T1", "fixed": "yes"})
    clickhouse.query(f"OPTIMIZE TABLE {TABLE} FINAL")
    assert _rows(clickhouse, f"SELECT count() AS n FROM {TABLE}") == [{"n": 18}]

    nothing = await export_calls(database, fmt=fmt, output=tmp_path / f"none.{fmt}", since_position=again.position)
    assert (nothing.calls, nothing.position) == (0, again.position)


def test_the_schema_has_every_export_column_but_in_flight() -> None:
    assert [c.name for c in SINK_COLUMNS] == [f for f in CallView.__struct_fields__ if f not in NOT_IN_SINK]
    assert set(CallView.__struct_fields__) >= NOT_IN_SINK
    kinds = {c.name: c for c in EXPORT_COLUMNS}
    assert all(kinds[name].kind == "text" for name in LOW_CARDINALITY)
    assert kinds[VERSION_COLUMN] == ExportColumn(name=VERSION_COLUMN, kind="integer", nullable=False)
    ddl = clickhouse_schema()
    assert "`last_position`   UInt64," in ddl and "`in_flight`" not in ddl
    assert "`model`           LowCardinality(Nullable(String))," in ddl
    assert "`started_at`      DateTime64(6, 'UTC')," in ddl and "`input_tokens`    Int64," in ddl


def test_a_field_of_a_new_type_is_refused() -> None:
    from msgspec import inspect

    from usage_ledger.answers import export_columns

    class Later(msgspec.Struct):
        spans: list[int]
        either: int | str

    for field in inspect.type_info(Later).fields:  # type: ignore[attr-defined]
        with pytest.raises(TypeError, match=f"CallView.{field.name}"):
            export_columns._column(field)


def test_chdb_missing_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "chdb", None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"need chdb .*must run in CI"):
        _require_chdb()


@pytest.fixture
def _reset_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.mark.usefixtures("_reset_logging")
def test_cli_schema_and_incremental_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--clickhouse-schema", "--table", "analytics.calls"]) == 0
    assert capsys.readouterr().out == clickhouse_schema("analytics.calls")
    assert "CREATE TABLE IF NOT EXISTS `analytics`.`calls`" in clickhouse_schema("analytics.calls")
    assert main(["export", "--clickhouse-schema", "--table", "a.b.c"]) == 2
    assert "--table 'a.b.c': give a table name or database.table" in capsys.readouterr().err
    assert main(["export", "--table", "x"]) == 2
    db = f"sqlite:///{tmp_path / 'l.db'}"
    assert main(["db", "upgrade", "--db", db]) == 0
    out = tmp_path / "calls.jsonl"
    capsys.readouterr()
    assert main(["export", "--db", db, "--output", str(out), "--since-position", "0"]) == 0
    assert "0 calls written to" in capsys.readouterr().err


def test_the_schema_in_the_docs_is_the_printed_one() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "scaling.md").read_text(encoding="utf-8")
    assert f"```sql\n{clickhouse_schema().rstrip()}\n```" in doc
