"""`ledger labels import`, `ledger returns import` and `ledger decide` in-process: output, JSON and exit codes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

from tests.projections.decide_trace import (
    DENSE,
    EXTRACT,
    MOE,
    SCALE,
    append_trace,
    build_labels,
    build_returns,
    write_labels,
    write_returns,
)
from usage_ledger.answers.decide import decide
from usage_ledger.cli import main
from usage_ledger.ledger.db import open_database

SCALE_TEXT = ",".join(SCALE)


def _ledger(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


async def _trace(url: str) -> None:
    database = open_database(url, null_pool=True)
    try:
        await append_trace(database, build_labels())
    finally:
        await database.dispose()


async def _decided(url: str) -> bytes:
    database = open_database(url, null_pool=True)
    try:
        return msgspec.json.encode(await decide(database, MOE, DENSE, SCALE_TEXT))
    finally:
        await database.dispose()


def test_labels_returns_and_decide(
    backend_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = ("--db", backend_url)
    assert main(["db", "upgrade", *db]) == 0
    asyncio.run(_trace(backend_url))
    labels = write_labels(tmp_path / "labels.csv", {run: by for run, by in build_labels().items() if run != "moe-3"})
    code, out, _ = _ledger(capsys, "labels", "import", str(labels), *db)
    assert code == 0 and "labels.recorded appended at position" in out
    code, out, _ = _ledger(capsys, "labels", "import", str(labels), *db)
    assert code == 0 and "already in the ledger" in out
    code, out, _ = _ledger(capsys, "labels", "import", "--run", "moe-3", "--extract", EXTRACT, *db)
    assert code == 0 and "99 from run moe-3" in out
    returns = write_returns(tmp_path / "returns.csv", build_returns(), as_of="2026-06-30")
    assert _ledger(capsys, "returns", "import", str(returns), *db)[0] == 0

    code, out, _ = _ledger(capsys, "decide", "--a", *MOE, "--b", *DENSE, "--scale", SCALE_TEXT, "--format", "json", *db)
    assert code == 0
    report = json.loads(out)
    assert set(report) == {"a", "b", "between", "unmeasured", "within_noise"}
    assert out.encode() == asyncio.run(_decided(backend_url)) + b"\n"  # the one computation, printed as is
    assert report["a"]["rank_ic"] is not None and report["b"]["self_qwk"] is not None
    # each figure with its sample and interval (held to SciPy in test_decide_evidence.py)
    assert set(report["a"]["evidence"]) == {"throughput_tps", "self_qwk", "self_agree_rate", "rank_ic"}
    assert set(report["between"]["evidence"]) == {"qwk", "agree_rate"}
    assert report["a"]["evidence"]["throughput_tps"]["n"] == 3 and report["b"]["evidence"]["rank_ic"]["n"] == 99
    low, high = report["a"]["evidence"]["self_qwk"]["ci95"]
    assert low < report["a"]["self_qwk"] < high
    code, out, _ = _ledger(capsys, "decide", "--a", *MOE, "--b", *DENSE, "--scale", SCALE_TEXT, *db)
    assert code == 0 and "self_qwk" in out and "flipped keys" in out and "no verdict" in out
    assert f"{report['a']['self_qwk']:.4f} [{low:.2f}, {high:.2f}]" in out  # the table shows the interval
    assert "n (a | b): throughput_tps 3 | 2 runs; self_qwk 99 | 99; rank_ic 99 | 99 tickers" in out
    noise = report["within_noise"]
    assert noise and f"within noise (the a and b intervals overlap): {', '.join(noise)}" in out
    monkeypatch.setenv("COLUMNS", "80")  # a narrow terminal keeps every figure and its interval
    code, narrow, _ = _ledger(capsys, "decide", "--a", *MOE, "--b", *DENSE, "--scale", SCALE_TEXT, *db)
    assert code == 0 and max(len(line) for line in narrow.splitlines()) <= 80
    assert f"{report['a']['self_qwk']:.4f} [{low:.2f}, {high:.2f}]" in narrow and "throughput_tps" in narrow
    monkeypatch.delenv("COLUMNS")
    code, out, _ = _ledger(
        capsys,
        "decide",
        "--a",
        *MOE,
        "--b",
        *DENSE,
        "--scale",
        SCALE_TEXT,
        "--as-of",
        "2026-01-01",
        "--format",
        "json",
        *db,
    )
    assert code == 0 and json.loads(out)["a"]["rank_ic"] is None
    assert any("no return dated on or before 2026-01-01" in item for item in json.loads(out)["unmeasured"])


def test_bad_input_exits_2(backend_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = ("--db", backend_url)
    assert main(["db", "upgrade", *db]) == 0
    asyncio.run(_trace(backend_url))
    bad = tmp_path / "bad.csv"
    bad.write_text("run,key,label\nmoe-1,T000,Hold\nghost,T000,Hold\n")
    code, _, err = _ledger(capsys, "labels", "import", str(bad), *db)
    assert code == 2 and f"{bad}:3: no run 'ghost' in the ledger" in err
    returns = tmp_path / "r.csv"
    returns.write_text("key,return\nT000,oops\n")
    code, _, err = _ledger(capsys, "returns", "import", str(returns), *db)
    assert code == 2 and f"{returns}:2: return: expected a number" in err
    code, _, err = _ledger(capsys, "labels", "import", "--run", "moe-1", *db)
    assert code == 2 and "--run RUN with --extract REGEX" in err
    code, _, err = _ledger(capsys, "labels", "import", "--run", "ghost", "--extract", EXTRACT, *db)
    assert code == 2 and "no run 'ghost'" in err
    code, _, err = _ledger(capsys, "labels", "import", str(tmp_path / "missing.csv"), *db)
    assert code == 2 and "missing.csv" in err
    write_labels(tmp_path / "ok.csv", build_labels())
    assert _ledger(capsys, "labels", "import", str(tmp_path / "ok.csv"), *db)[0] == 0
    code, _, err = _ledger(capsys, "decide", "--a", "ghost", "--b", *DENSE, "--scale", SCALE_TEXT, *db)
    assert code == 2 and "no run 'ghost'" in err
    code, _, err = _ledger(capsys, "decide", "--a", *MOE, "--b", *DENSE, "--scale", "Sell,Hold,Buy", *db)
    assert code == 2 and "labels outside --scale" in err
    code, _, err = _ledger(capsys, "decide", "--a", *MOE, "--b", *DENSE, "--scale", SCALE_TEXT, "--as-of", "June", *db)
    assert code == 2 and "--as-of: expected a date YYYY-MM-DD" in err
