"""Tables that fit a 100-column terminal: compact default columns, `--columns`, `--wide`, right-aligned
numbers with thousands separators, nothing wrapped or cut to a few characters; `show run` pages its calls.

Run in-process with COLUMNS=100 (stdout captured, so not a terminal) and once on a real 100-column
pseudo-terminal, where the width comes from the terminal itself.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import struct
import subprocess
import termios
from pathlib import Path

import pytest
from rich.cells import cell_len

from tests.ledger.helpers import build_ledger
from tests.projections.fit_seed import AUTO_1, LONG_RUN, seed_fit_ledger
from tests.projections.test_terminal import LEDGER
from usage_ledger.cli import main

WIDTH = 100


@pytest.fixture(autouse=True)
def _terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))


def _ledger(url: str, **seed: bool) -> str:
    """Migrate and seed the ledger at `url` (the CLI runs its own event loop, so the tests are sync)."""
    return asyncio.run(build_ledger(url, lambda database: seed_fit_ledger(database, **seed)))


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def _row(lines: list[str], name: str) -> str:
    (line,) = [line for line in lines if line.split() and line.split()[0] == name]
    return line


def _assert_fits(lines: list[str]) -> None:
    assert lines and all(cell_len(line.rstrip()) <= WIDTH for line in lines), [
        line for line in lines if cell_len(line.rstrip()) > WIDTH
    ]


def test_report_runs_fits_100_columns_with_a_compact_default(
    backend_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _ledger(backend_url)
    code, lines, _ = _run(capsys, "report", "runs", "--db", db)
    assert code == 0
    _assert_fits(lines)
    header = lines[1].split()
    assert header == ["run", "calls", "input", "output", "wall_s", "tok/s", "accept", "reconciled"]
    assert len(lines) == 3 + 4 + 2  # title, header, rule, one line per run (nothing wrapped), the formula's note
    assert lines[-2].startswith("tok/s = batch_aggregate: ")
    alpha = _row(lines, "alpha")
    assert alpha.split()[:4] == ["alpha", "3", "1,235,567", "2,101"]  # thousands separators
    assert alpha.split()[-2:] == ["0.667", "True"]  # the server block, where sampled
    assert _row(lines, "beta").split()[-2:] == ["-", "-"]
    # numbers right-aligned: each ends under the end of its header
    for name in ("calls", "input", "output", "tok/s"):
        end = lines[1].index(name) + len(name)
        for run in ("alpha", "beta", AUTO_1):
            line = _row(lines, run)
            assert line[end - 1] != " " and (end == len(line) or line[end] == " "), (name, run, line)


def test_optional_server_columns_only_when_sampled(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = _ledger(backend_url, samples=False)
    code, lines, _ = _run(capsys, "report", "runs", "--db", db)
    assert code == 0
    assert lines[1].split() == ["run", "calls", "input", "output", "wall_s", "tok/s"]


def test_a_long_run_name_is_shortened_and_columns_that_do_not_fit_are_named(
    backend_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _ledger(backend_url, long_run=True)
    code, lines, _ = _run(capsys, "report", "runs", "--db", db)
    assert code == 0
    _assert_fits(lines)
    (long_line,) = [line for line in lines if line.lstrip().startswith("nightly-benchm")]
    head, tail = long_line.split()[0].split("…")  # shortened in the middle: both ends tell runs apart
    assert len(head) + len(tail) + 1 >= 16 and LONG_RUN.startswith(head) and LONG_RUN.endswith(tail)
    assert "tok/s" in lines[1].split()  # throughput survives; what is left out is said
    assert lines[-3].startswith("1 more column (--wide, --columns): server.reconciled")  # then the formula's note
    for line in lines[3:-3]:  # no cell cut to a stub
        assert all(
            len(cell) > 3 or cell.replace(",", "").replace(".", "").isdigit() or cell in ("-", "m1")
            for cell in line.split()
        ), line


def test_columns_and_wide(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = _ledger(backend_url)
    code, lines, _ = _run(capsys, "report", "runs", "--db", db, "--columns", "run,model,failed_calls,started_at")
    assert code == 0
    assert lines[1].split() == ["run", "model", "failed", "started_at"]
    assert _row(lines, "alpha").split() == ["alpha", "m1", "1", "2026-03-02", "12:00:00", "UTC"]

    code, lines, _ = _run(capsys, "report", "runs", "--db", db, "--wide")
    assert code == 0
    assert {"model", "started_at", "formula", "h/100", "KV"} <= set(lines[1].split())
    assert len(lines) == 3 + 4 + 2  # past the terminal width, still one line a row; the formula's note
    assert cell_len(lines[1].rstrip()) > WIDTH

    code, lines, err = _run(capsys, "report", "runs", "--db", db, "--columns", "run,tokens,calls")
    assert code == 2 and lines == []
    assert "unknown 'tokens'" in err and "valid: run, model, calls, failed_calls" in err


def test_machine_formats_keep_every_field_and_raw_values(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = _ledger(backend_url)
    code, lines, _ = _run(capsys, "report", "runs", "--db", db, "--format", "csv")
    assert code == 0
    header = lines[0].split(",")
    assert len(header) == 31 and header[:3] == ["run", "model", "calls"]  # truncated_calls among them
    assert header[-7:-5] == ["tickers_done", "partial"] and header[-1] == "cost.per_million_output_tokens"
    assert lines[1].split(",")[header.index("input_tokens")] == "1235567"  # no separators in CSV
    assert "1,235,567" not in "\n".join(lines)
    code, lines, _ = _run(capsys, "report", "runs", "--db", db, "--format", "json")
    assert json.loads(lines[0])[0]["input_tokens"] == 1_235_567


def test_other_reports_fit_too(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = _ledger(backend_url)
    for args in (("tickers",), ("daily", "--tz", "UTC"), ("daily", "--weekday-mean"), ("eras", "--by", "model")):
        code, lines, _ = _run(capsys, "report", *args, "--db", db)
        assert code == 0, args
        _assert_fits(lines)
    code, lines, _ = _run(capsys, "report", "eras", "--by", "model", "--db", db)
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
    assert lines[-2].startswith("tok/s = batch_aggregate: ")  # the formula, named under the table


def test_show_call_is_one_field_a_line(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = _ledger(backend_url)
    code, lines, _ = _run(capsys, "show", "call", "a1", "--db", db)
    assert code == 0
    _assert_fits(lines)
    fields = {
        line.split()[0]: line.split()[1:] for line in lines[1:] if line.split() and not line[0:4].strip().isdigit()
    }
    assert fields["input_tokens"] == ["1,234,567"] and fields["status"] == ["ok"] and fields["run"] == ["alpha"]
    code, lines, _ = _run(capsys, "show", "call", "a1", "--db", db, "--columns", "call_id,output_tokens")
    assert [line.split()[0] for line in lines[1:3]] == ["call_id", "output_tokens"]


def test_show_run_pages_its_calls_and_says_the_total(backend_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = _ledger(backend_url)
    code, lines, _ = _run(capsys, "show", "run", "alpha", "--db", db, "--limit", "2")
    assert code == 0
    _assert_fits(lines)
    assert lines[-1] == "calls 1-2 of 3; next: --page 2"
    assert [line.split()[0] for line in lines if line.split() and line.split()[0] in ("a1", "a2", "a3")] == ["a1", "a2"]
    code, lines, _ = _run(capsys, "show", "run", "alpha", "--db", db, "--limit", "2", "--page", "2")
    assert lines[-1] == "calls 3-3 of 3"
    assert _row(lines, "a3").split()[:3] == ["a3", "T1", "failed"]
    code, lines, _ = _run(capsys, "show", "run", "alpha", "--db", db, "--offset", "1", "--limit", "1")
    assert lines[-1] == "calls 2-2 of 3; next: --page 3"
    code, lines, _ = _run(capsys, "show", "run", "alpha", "--db", db, "--offset", "1", "--limit", "2")
    assert lines[-1] == "calls 2-3 of 3"
    code, lines, _ = _run(capsys, "show", "run", "alpha", "--db", db, "--format", "json")
    page = json.loads(lines[-1])["calls"]
    assert page["total"] == 3 and [c["call_id"] for c in page["items"]] == ["a1", "a2", "a3"]
    code, _, err = _run(capsys, "show", "run", "alpha", "--db", db, "--page", "0")
    assert code == 2 and "pages count from 1" in err


def _on_terminal(*args: str, columns: int) -> str:
    """`ledger ARGS` on a pseudo-terminal `columns` wide (no COLUMNS variable): what it printed."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    proc = subprocess.Popen(
        [LEDGER, *args], stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env={**env, "TERM": "dumb"}
    )
    os.close(follower)
    output = bytearray()
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        output += data
    os.close(leader)
    assert proc.wait(timeout=60) == 0, output.decode(errors="replace")
    return output.decode(errors="replace")


def test_on_a_real_100_column_terminal(backend_url: str, tmp_path: Path) -> None:
    db = _ledger(backend_url, long_run=True)
    lines = _on_terminal("report", "runs", "--db", db, columns=WIDTH).replace("\r\n", "\n").splitlines()
    _assert_fits(lines)
    assert "tok/s" in lines[1] and _row(lines, "alpha").split()[:3] == ["alpha", "3", "1,235,567"]
