"""Import (DESIGN §6): parser properties, file:line errors, atomicity, idempotency, CSV."""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from usage_ledger.answers.reports import runs_report
from usage_ledger.imports.importer import MAX_LINE_BYTES, RowError, import_file, parse_record
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import new_event
from usage_ledger.projections.errors import ImportFailed

_ID = uuid.UUID(int=1)
_names = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20)
_times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))


@given(
    start=_times,
    elapsed=st.floats(0, 86_400, allow_nan=False),
    tin=st.integers(0, 10**9),
    tout=st.integers(0, 10**9),
    run=st.none() | _names,
    ticker=st.none() | _names,
    epoch=st.booleans(),
)
def test_valid_records_round_trip(
    start: datetime, elapsed: float, tin: int, tout: int, run: str | None, ticker: str | None, epoch: bool
) -> None:
    fields: dict[str, object] = {
        "started_at": start.timestamp() if epoch else start.isoformat(),
        "elapsed_s": elapsed,
        "input_tokens": tin,
        "output_tokens": tout,
    }
    if run is not None:
        fields["run"] = run
    if ticker is not None:
        fields["ticker"] = ticker
    body = parse_record(msgspec.json.decode(msgspec.json.encode(fields)), source="s", line=3, event_id=_ID)
    assert abs((body.started_at - start).total_seconds()) < 1e-3
    assert abs((body.finished_at - body.started_at).total_seconds() - elapsed) < 1e-3
    assert (body.input_tokens, body.output_tokens, body.run, body.tags.get("ticker")) == (tin, tout, run, ticker)


@given(
    st.dictionaries(st.text(max_size=12), st.none() | st.integers() | st.text(max_size=12) | st.floats(), max_size=6)
)
def test_parser_never_crashes(fields: dict[str, object]) -> None:
    with contextlib.suppress(RowError):
        parse_record(fields, source="s", line=1, event_id=_ID)


_any_moment = (
    st.datetimes(timezones=st.timezones() | st.just(UTC)).map(lambda t: t.isoformat())
    | st.floats()
    | st.integers(-(2**70), 2**70)
)


@given(
    started=_any_moment,
    finished=st.none() | _any_moment,
    elapsed=st.none() | st.floats() | st.integers(-(2**70), 2**70),
    ttft=st.none() | st.floats(),
    tokens=st.integers(-(2**70), 2**70),
)
def test_the_known_fields_at_any_value_give_a_row_or_a_reason(
    started: object, finished: object, elapsed: object, ttft: object, tokens: int
) -> None:
    """Whatever the values of the fields a row has, the parser gives a row or a `RowError`, and a row's
    moments can be folded (TTFT within the call)."""
    fields = {"started_at": started, "finished_at": finished, "elapsed_s": elapsed, "ttft_s": ttft}
    fields |= {"input_tokens": tokens, "output_tokens": 1}
    try:
        body = parse_record({k: v for k, v in fields.items() if v is not None}, source="s", line=1, event_id=_ID)
    except RowError:
        return
    assert body.started_at <= body.finished_at
    if body.ttft_s is not None:
        assert body.started_at + timedelta(seconds=body.ttft_s) <= body.finished_at + timedelta(milliseconds=1)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"started_at": "2026-03-01T00:00:00", "elapsed_s": 1, "input_tokens": 1, "output_tokens": 1}, "no UTC offset"),
        ({"started_at": 0, "input_tokens": 1, "output_tokens": 1}, "finished_at or elapsed_s"),
        ({"started_at": 0, "elapsed_s": 1, "input_tokens": -1, "output_tokens": 1}, "must be >= 0"),
        ({"started_at": 0, "elapsed_s": 1, "input_tokens": 1.5, "output_tokens": 1}, "whole number"),
        ({"started_at": 10, "finished_at": 5, "input_tokens": 1, "output_tokens": 1}, "before started_at"),
        ({"started_at": 0, "elapsed_s": 1, "input_tokens": 1, "output_tokens": 1, "outptu": 1}, "unknown field"),
        ({"started_at": 0, "elapsed_s": 1, "input_tokens": 1, "output_tokens": 1, "status": "meh"}, "status"),
        # moments the calendar cannot hold are bad rows, never a traceback (red team, round three)
        ({"started_at": 0, "elapsed_s": 1e300, "input_tokens": 1, "output_tokens": 1}, "elapsed_s: 1e.300 s"),
        ({"started_at": "9999-12-31T23:59:59Z", "elapsed_s": 5, "input_tokens": 1, "output_tokens": 1}, "past 9999"),
        (
            {"started_at": "0001-01-01T00:00:00+05:00", "elapsed_s": 5, "input_tokens": 1, "output_tokens": 1},
            "before 0001",
        ),
        (
            {"started_at": 0, "elapsed_s": 5, "ttft_s": 1e300, "input_tokens": 1, "output_tokens": 1},
            "longer than the call",
        ),
    ],
)
def test_bad_rows_say_why(fields: dict[str, object], reason: str) -> None:
    with pytest.raises(RowError, match=reason):
        parse_record(fields, source="s", line=1, event_id=_ID)


def _row(i: int, **extra: object) -> bytes:
    t = datetime(2026, 3, 1, 14, 0, tzinfo=UTC) + timedelta(seconds=i * 10)
    row = {"started_at": t.isoformat(), "elapsed_s": 5, "input_tokens": 100, "output_tokens": 10, "run": "r", **extra}
    return msgspec.json.encode(row) + b"\n"


async def test_file_is_atomic_and_idempotent(database: Database, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(_row(0) + b"{not json\n" + _row(1) + _row(2, output_tokens="x"))
    with pytest.raises(ImportFailed) as info:
        await import_file(database, bad)
    assert info.value.errors[0].startswith(f"{bad}:2: invalid JSON")
    assert info.value.errors[1].startswith(f"{bad}:4: output_tokens")
    assert await runs_report(database) == []

    skipped = await import_file(database, bad, skip_invalid=True)
    assert (skipped.appended, skipped.invalid) == (2, 2)
    good = tmp_path / "good.jsonl"
    good.write_bytes(_row(10) + _row(10) + _row(11))  # identical lines are distinct calls
    first = await import_file(database, good)
    again = await import_file(database, good)
    assert (first.appended, again.appended, again.duplicates) == (3, 0, 3)
    (run,) = await runs_report(database)
    assert run.calls == 5


async def test_a_line_past_the_cap_is_a_bad_row_read_no_further(database: Database, tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    long_line = b'{"run": "' + b"x" * (MAX_LINE_BYTES + 10) + b'"}\n'
    path.write_bytes(_row(0) + long_line + _row(1))
    with pytest.raises(ImportFailed) as info:
        await import_file(database, path)
    assert info.value.errors == [f"{path}:2: line longer than {MAX_LINE_BYTES:,} bytes"]
    result = await import_file(database, path, skip_invalid=True)
    assert (result.rows, result.appended, result.invalid) == (3, 2, 1)


async def test_unlikely_spans_are_imported_with_a_warning(database: Database, tmp_path: Path) -> None:
    """A mistyped year (a run of 31,536,010 s) is imported as given, and said."""
    path = tmp_path / "typo.jsonl"
    year_later = {"started_at": "2027-03-01T14:00:20+00:00"}
    path.write_bytes(_row(0) + _row(1, elapsed_s=2 * 86_400) + _row(2, **year_later) + _row(3, run="fine"))
    result = await import_file(database, path)
    assert result.appended == 4
    assert result.warnings == [
        f"{path}:1: run 'r' spreads over 365.0 days in this file (lines 1 to 3): check those dates",
        f"{path}:2: a call of 172,800 s (over a day): check its times",
    ]


async def test_csv_with_tag_columns(database: Database, tmp_path: Path) -> None:
    path = tmp_path / "calls.csv"
    path.write_text(
        "started_at,finished_at,input_tokens,output_tokens,run,ticker,tag.Desk,status\n"
        "2026-03-01T23:00:00+09:00,2026-03-01T23:00:30+09:00,1000,100,n1,AAPL,eq,ok\n"
        "1772373660,1772373700,2000,200,n1,MSFT,,error\n"
    )
    result = await import_file(database, path)
    assert result.appended == 2
    (run,) = await runs_report(database)
    assert (run.calls, run.failed_calls, run.tickers, run.input_tokens) == (2, 1, 2, 3000)


async def test_a_csv_record_past_the_cap_is_a_bad_row_and_later_lines_keep_their_numbers(
    database: Database, tmp_path: Path
) -> None:
    """The CSV reader caps a line as the JSONL reader does (many short cells: no field over csv's own limit)."""
    path = tmp_path / "long.csv"
    good = "2026-03-01T14:00:00+00:00,5,{},10,r\r\n"
    long_line = "," * (MAX_LINE_BYTES + 10) + "\r\n"
    path.write_text(
        "started_at,elapsed_s,input_tokens,output_tokens,run\r\n" + good.format(1) + long_line + good.format(2)
    )
    with pytest.raises(ImportFailed) as info:
        await import_file(database, path)
    assert info.value.errors == [f"{path}:3: line longer than {MAX_LINE_BYTES:,} bytes"]
    result = await import_file(database, path, skip_invalid=True)
    assert (result.rows, result.appended, result.invalid) == (3, 2, 1)
    (run,) = await runs_report(database)
    assert run.input_tokens == 3


async def test_a_csv_header_that_cannot_be_read_is_line_1(database: Database, tmp_path: Path) -> None:
    path = tmp_path / "header.csv"
    path.write_text("started_at," + "x" * 200_000 + "\n2026-03-01T14:00:00+00:00,1\n")
    with pytest.raises(ImportFailed) as info:
        await import_file(database, path)
    assert info.value.errors == [f"{path}:1: invalid CSV: field larger than field limit (131072)"]


async def test_a_renamed_copy_adds_nothing(database: Database, tmp_path: Path) -> None:
    original = tmp_path / "calls-2026-10.jsonl"
    original.write_bytes(_row(0) + _row(0) + _row(1, call_id="c-1"))
    copy = tmp_path / "backup" / "old-calls.jsonl"
    copy.parent.mkdir()
    copy.write_bytes(original.read_bytes())
    first = await import_file(database, original)
    again = await import_file(database, copy)
    other_source = await import_file(database, copy, source="somewhere-else")
    assert (first.appended, again.appended, again.duplicates) == (3, 0, 3)
    assert (other_source.appended, other_source.duplicates) == (0, 3)
    (run,) = await runs_report(database)
    assert run.calls == 3


async def test_the_same_call_in_csv_and_jsonl_is_one_call(database: Database, tmp_path: Path) -> None:
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_bytes(_row(0, call_id="c-1"))
    t = (datetime(2026, 3, 1, 14, 0, tzinfo=UTC)).isoformat()
    csv = tmp_path / "a.csv"
    csv.write_text(f"started_at,elapsed_s,input_tokens,output_tokens,run,call_id\n{t},5,100,10,r,c-1\n")
    assert (await import_file(database, jsonl)).appended == 1
    again = await import_file(database, csv)
    assert (again.appended, again.duplicates) == (0, 1)


async def test_a_conflicting_call_id_names_both_files_and_lines(database: Database, tmp_path: Path) -> None:
    first = tmp_path / "first.jsonl"
    first.write_bytes(_row(0) + _row(1, call_id="c-1"))
    second = tmp_path / "second.jsonl"
    second.write_bytes(_row(5) + _row(6) + _row(7, call_id="c-1", output_tokens=99))
    await import_file(database, first)
    with pytest.raises(ImportFailed) as info:
        await import_file(database, second)
    (error,) = info.value.errors
    assert error.startswith(f"{second}:3: call_id 'c-1'")
    assert "first.jsonl:2" in error and "own call_id" in error
    (run,) = await runs_report(database)
    assert (run.calls, run.output_tokens) == (2, 20)  # nothing of second.jsonl, c-1 not replaced

    skipped = await import_file(database, second, skip_invalid=True)
    assert (skipped.appended, skipped.invalid) == (2, 1)
    (run,) = await runs_report(database)
    assert (run.calls, run.output_tokens) == (4, 40)


@pytest.mark.parametrize("field", ["input_tokens", "output_tokens", "elapsed_s", "ttft_s", "started_at"])
def test_jsonl_numbers_given_as_strings_are_refused(field: str) -> None:
    fields: dict[str, object] = {"started_at": 1772373600, "elapsed_s": 5, "input_tokens": 12, "output_tokens": 3}
    fields[field] = "12"
    with pytest.raises(RowError, match=f"{field}: .*string '12'"):
        parse_record(fields, source="s", line=1, event_id=_ID)


def test_csv_numbers_are_parsed_but_must_be_whole() -> None:
    fields = {"started_at": "1772373600", "elapsed_s": "5", "input_tokens": "12", "output_tokens": "3"}
    body = parse_record(fields, source="s", line=1, event_id=_ID, from_text=True)
    assert (body.input_tokens, body.output_tokens) == (12, 3)
    with pytest.raises(RowError, match="input_tokens: expected a whole number"):
        parse_record({**fields, "input_tokens": "12.5"}, source="s", line=1, event_id=_ID, from_text=True)


async def test_a_string_count_in_jsonl_is_a_file_line_error(database: Database, tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_bytes(_row(0) + _row(1, input_tokens="12"))
    with pytest.raises(ImportFailed) as info:
        await import_file(database, path)
    assert info.value.errors == [
        f"{path}:2: input_tokens: expected a whole number, got the string '12' (drop the quotes)"
    ]


async def test_rows_stored_under_the_old_source_scoped_ids_count_as_present(database: Database, tmp_path: Path) -> None:
    """Ledgers written before content identity hold ids over (source, occurrence, content): no doubling."""
    path = tmp_path / "old.jsonl"
    path.write_bytes(_row(0))
    fields = msgspec.json.decode(_row(0))
    content = msgspec.json.Encoder(order="sorted").encode(fields).decode()
    legacy = uuid.uuid5(uuid.UUID("0b5d7c56-6a1e-5b8e-8f0e-4c2a7d9e1f30"), f"old.jsonl\n0\n{content}")
    body = parse_record(fields, source="old.jsonl", line=1, event_id=legacy)
    await append_events(database, [new_event(body, stream=f"call-{body.call_id}", event_id=legacy)])
    result = await import_file(database, path)
    assert (result.appended, result.duplicates) == (0, 1)
    (run,) = await runs_report(database)
    assert run.calls == 1


async def test_a_bad_row_at_the_end_of_a_large_file_imports_nothing(database: Database, tmp_path: Path) -> None:
    """The file is read in batches (validated, then appended): a bad row after many batches still means none."""
    path = tmp_path / "large.jsonl"
    rows = 12_345  # several of the importer's batches
    path.write_bytes(b"".join(_row(i, ticker=f"T{i % 100}") for i in range(rows)) + _row(rows, input_tokens=-1))
    with pytest.raises(ImportFailed) as info:
        await import_file(database, path)
    assert info.value.errors == [f"{path}:{rows + 1}: input_tokens: must be >= 0, got -1"]
    assert await runs_report(database) == []

    conflict = tmp_path / "conflict.jsonl"  # a call_id the ledger holds with other content, in the last batch
    await import_file(database, _one(tmp_path, _row(0, call_id="taken")))
    conflict.write_bytes(b"".join(_row(i) for i in range(1, rows)) + _row(rows, call_id="taken"))
    with pytest.raises(ImportFailed) as info:
        await import_file(database, conflict)
    assert info.value.errors[0].startswith(f"{conflict}:{rows}: call_id 'taken' is already in the ledger")
    (run,) = await runs_report(database)
    assert run.calls == 1

    result = await import_file(database, path, skip_invalid=True)
    again = await import_file(database, path, skip_invalid=True)
    assert (result.appended, result.invalid, again.appended, again.duplicates) == (rows, 1, 0, rows)
    (run,) = await runs_report(database)
    assert (run.calls, run.tickers) == (rows + 1, 100)


def _one(tmp_path: Path, line: bytes) -> Path:
    path = tmp_path / "one.jsonl"
    path.write_bytes(line)
    return path


@pytest.mark.parametrize("depth", [1_000, 100_000])
async def test_a_deeply_nested_line_is_a_bad_row_not_a_traceback(
    database: Database, tmp_path: Path, depth: int
) -> None:
    """msgspec raises RecursionError past ~1,000 levels: one such line is `file:line` like any bad row."""
    path = tmp_path / "deep.jsonl"
    nested = b'{"run": "r", "tags": {"a": ' + b"[" * depth + b"]" * depth + b"}}\n"
    path.write_bytes(_row(0) + nested + _row(1))
    with pytest.raises(ImportFailed) as info:
        await import_file(database, path)
    assert info.value.errors == [f"{path}:2: invalid JSON: nested too deeply"]
    result = await import_file(database, path, skip_invalid=True)
    assert (result.rows, result.appended, result.invalid) == (3, 2, 1)
