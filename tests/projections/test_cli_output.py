"""What a new user reads (issue #39, point 7): each table says what its figures are, counts print as whole
numbers, notes and findings wrap instead of being cut, bodies are readable, a closed pipe ends quietly.

In-process with COLUMNS=100 (stdout captured, so not a terminal), on the CLI-fit ledger of both backends.
"""

from __future__ import annotations

import asyncio
import json
import subprocess

import msgspec
import pytest
from rich.cells import cell_len

from tests.ledger.helpers import build_ledger
from tests.projections.fit_seed import LONG_RUN, seed_fit_ledger
from tests.projections.helpers import finished, started
from tests.projections.test_terminal import LEDGER
from usage_ledger.cli import main
from usage_ledger.commands.bodies import MAX_LINES
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import BlobCompressor, blob_hash
from usage_ledger.ledger.db import open_database
from usage_ledger.projections.engine import catch_up_all

WIDTH = 100


@pytest.fixture(autouse=True)
def _terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))


def _ledger(url: str) -> str:
    return asyncio.run(build_ledger(url, lambda database: seed_fit_ledger(database, long_run=True)))


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    """Exit code and lines printed; a table's lines fit the terminal."""
    capsys.readouterr()
    code = main(list(args))
    lines = capsys.readouterr().out.splitlines()
    if "--format" not in args:
        assert all(cell_len(line.rstrip()) <= WIDTH for line in lines), [
            line for line in lines if cell_len(line.rstrip()) > WIDTH
        ]
    return code, lines


def _joined(lines: list[str]) -> str:
    """Wrapped lines as one paragraph."""
    return " ".join(line.strip() for line in lines)


def test_runs_and_eras_name_their_formula(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = _ledger(backend_url)
    _, lines = _run(capsys, "report", "runs", "--db", db)
    assert "tok/s = batch_aggregate: Σ output tokens ÷ (last call end - first call start)" in _joined(lines)
    _, lines = _run(capsys, "report", "runs", "--db", db, "--formula", "per_call_mean")
    assert "tok/s = per_call_mean: Mean over calls of output tokens ÷ call elapsed" in _joined(lines)
    _, lines = _run(capsys, "report", "runs", "--db", db, "--format", "csv")
    assert not any(line.startswith("tok/s") for line in lines)  # machine formats stay as they were


def test_eras_show_min_and_max_and_how_to_label(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = _ledger(backend_url)
    _, lines = _run(capsys, "report", "eras", "--by", "hardware", "--db", db)
    assert lines[1].split() == [
        "group",
        "runs",
        "in",
        "means",
        "days",
        "mean",
        "tok/s",
        "median",
        "min",
        "max",
        "mean",
        "wall_s",
    ]
    assert lines[3].split()[:2] == ["-", "5"]  # no run is labelled: one group of all five
    text = _joined(lines)
    assert "-: 5 runs without a hardware label; label a run with `ledger annotate --run R --hardware VALUE`" in text
    _, lines = _run(capsys, "report", "eras", "--by", "rack", "--db", db)
    assert "`ledger annotate --run R --label rack=VALUE`" in _joined(lines)
    _, lines = _run(capsys, "report", "eras", "--by", "model", "--db", db)
    assert "without a model label" not in _joined(lines)  # every run has its calls' model


def test_weekday_means_of_counts_are_whole_numbers(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = _ledger(backend_url)
    _, lines = _run(capsys, "report", "daily", "--weekday-mean", "--tz", "UTC", "--db", db)
    rows = [line.split() for line in lines[3:] if line.split()]
    assert rows and all(not cell.endswith(".0") for row in rows for cell in row[2:]), rows
    mon = next(row for row in rows if row[0] == "Mon")  # 2026-03-02: alpha and beta, 5 calls
    assert mon[1:3] == ["1", "5"]
    _, lines = _run(capsys, "report", "daily", "--weekday-mean", "--tz", "UTC", "--db", db, "--format", "json")
    assert next(r for r in json.loads(lines[0]) if r["weekday"] == "Mon")["calls"] == 5.0  # JSON keeps the mean


def test_reconcile_titles_what_it_lists(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = _ledger(backend_url)
    code, lines = _run(capsys, "reconcile", "--run", "alpha", "--db", db)
    assert code == 0 and lines[0] == "reconcile" and lines[3].split()[:2] == ["alpha", "True"]
    code, lines = _run(capsys, "reconcile", "--db", db)
    assert code == 0 and lines[0] == "runs that do not reconcile: no rows"


def test_audit_against_shows_the_values_in_full(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = _ledger(backend_url)
    code, lines = _run(capsys, "audit", LONG_RUN, "--against", "beta", "--db", db)
    assert code == 1 and lines[0] == f"audit of {LONG_RUN} against beta"
    assert f'differs_from_other_run: model: {LONG_RUN} "m1" vs beta "m2"' in _joined(lines)


def test_compare_names_models_plainly_and_wraps_its_notes(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = _ledger(backend_url)
    code, lines = _run(capsys, "compare", LONG_RUN, "beta", "--db", db)
    assert code == 0
    notes = lines[next(i for i, line in enumerate(lines) if line.startswith("A = ")) :]
    assert f'B differs from A: model: beta "m2" vs {LONG_RUN} "m1"' in _joined(notes)
    assert "['" not in "\n".join(lines)


REQUEST = {"model": "m1", "messages": [{"role": "user", "content": "price history\n" + "d0001,1.0\n" * 4000}]}
STREAM = "".join(f'data: {{"choices": [{{"delta": {{"content": "token {i} "}}}}]}}\n\n' for i in range(200))


async def _call_with_bodies(url: str) -> None:
    database = open_database(url, null_pool=True)
    try:
        compressor = BlobCompressor()
        request, response = json.dumps(REQUEST).encode(), (STREAM + "data: [DONE]\n\n").encode()
        blobs = [b for b in (compressor.prepare(request), compressor.prepare(response)) if b is not None]
        begin, end = started("bodies", 0, run="alpha"), finished("bodies", 0, 5)
        begin = msgspec.structs.replace(
            begin, body=msgspec.structs.replace(begin.body, request_blob=blob_hash(request))
        )
        end = msgspec.structs.replace(end, body=msgspec.structs.replace(end.body, response_blob=blob_hash(response)))
        await append_events(database, [begin, end], blobs)
        await catch_up_all(database)
    finally:
        await database.dispose()


def test_show_call_bodies_are_readable_and_clipped(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = _ledger(backend_url)
    asyncio.run(_call_with_bodies(db))
    code, lines = _run(capsys, "show", "call", "bodies", "--db", db)  # every line fits (checked in _run)
    assert code == 0
    request = lines[lines.index(next(line for line in lines if line.startswith("--- request body"))) + 1 :]
    assert request[:3] == ["{", '  "model": "m1",', '  "messages": [']  # indented JSON
    content = next(line for line in request if '"content"' in line)
    assert content.startswith('      "content": "price history\\nd0001,1.0\\n') and content.endswith(" characters)")
    response = lines[lines.index(next(line for line in lines if line.startswith("--- response body"))) + 1 :]
    assert response[0] == 'data: {"choices": [{"delta": {"content": "token 0 "}}]}'  # one event a line
    assert (
        len(response) == MAX_LINES + 1 and response[-1] == f"… {201 - MAX_LINES} more lines (--full shows everything)"
    )
    code, lines = _run(capsys, "show", "call", "bodies", "--db", db, "--no-bodies")
    assert not any(line.startswith("---") for line in lines)
    capsys.readouterr()
    assert main(["show", "call", "bodies", "--db", db, "--full"]) == 0
    full = capsys.readouterr().out
    assert json.dumps(REQUEST["messages"][0]["content"]) in full and "token 199 " in full and "more lines" not in full


@pytest.mark.parametrize(
    "args",
    [
        ("show", "run", "alpha"),
        ("report", "runs", "--format", "json"),
        ("export", "--format", "jsonl"),
        ("compare", "alpha", "beta"),
        ("show", "call", "a1"),
    ],
)
def test_a_closed_pipe_ends_quietly(backend_url: str, args: tuple[str, ...]) -> None:
    """`ledger … | head -1`: the reader went away before the first write; no traceback, exit 1 (EPIPE)."""
    db = _ledger(backend_url)
    proc = subprocess.Popen([LEDGER, *args, "--db", db], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1 and err == "", err
