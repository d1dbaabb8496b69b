"""The projections subcommands end to end (in-process), exit codes and JSON output."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.projections.seed import MOE, seed_rows, write_jsonl
from usage_ledger.cli import main


def test_cli_import_report_rebuild_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'l.db'}"
    assert main(["db", "upgrade", "--db", db]) == 0
    seed = write_jsonl(tmp_path / "moe.jsonl", seed_rows(MOE))
    assert main(["import", str(seed), "--db", db]) == 0
    assert main(["import", str(seed), "--db", db]) == 0
    capsys.readouterr()
    assert main(["report", "runs", "--db", db, "--format", "json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)
    assert round(run["throughput_tps"]) == 911 and run["calls"] == 1700
    assert main(["report", "daily", "--db", db, "--format", "json", "--tz", "Asia/Seoul"]) == 0
    assert [d["day"] for d in json.loads(capsys.readouterr().out)] == ["2026-03-02", "2026-03-03"]
    assert main(["recompute", "--formula", "per_call_mean", "--db", db, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["old_tps"] == pytest.approx(run["throughput_tps"])
    assert main(["rebuild", "--db", db]) == 0
    assert main(["annotate", "--run", MOE.run, "--hardware", "rtx5090", "--kind", "nightly", "--db", db]) == 0
    assert main(["retag", f"{MOE.run}-0001", "--tag", "desk=x", "--reason", "test", "--db", db]) == 0
    assert main(["show", "run", MOE.run, "--db", db, "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert shown["run"]["labels"] == {"hardware": "rtx5090", "kind": "nightly"} and len(shown["tickers"]) == 100
    assert main(["show", "call", f"{MOE.run}-0001", "--db", db, "--format", "json"]) == 0
    detail = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert detail["call"]["tags"]["desk"] == "x" and [e["type"] for e in detail["events"]] == [
        "call.imported",
        "call.retagged",
    ]
    out = tmp_path / "calls.parquet"
    assert main(["export", "--format", "parquet", "--output", str(out), "--db", db]) == 0
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    assert pq.read_table(out).num_rows == 1700
    assert main(["projections", "status", "--db", db, "--format", "json"]) == 0


def test_cli_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'l.db'}"
    assert main(["db", "upgrade", "--db", db]) == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"started_at": 0}\n')
    assert main(["import", str(bad), "--db", db]) == 2
    assert f"{bad}:1: missing required field input_tokens" in capsys.readouterr().err
    assert main(["report", "runs", "--run", "nope", "--db", db]) == 2
    assert main(["retag", "nope", "--run", "x", "--reason", "r", "--db", db]) == 2
    assert main(["report", "daily", "--tz", "Nowhere/X", "--db", db]) == 2


def test_rebuild_checks_every_name_before_rebuilding_any(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'l.db'}"
    assert main(["db", "upgrade", "--db", db]) == 0
    capsys.readouterr()
    assert main(["rebuild", "calls", "nosuch", "--db", db]) == 2
    assert "unknown projection 'nosuch'; known: annotations, calls" in capsys.readouterr().err
    assert main(["projections", "status", "--db", db]) == 0
    assert re.search(r"calls\s+1\s+True", capsys.readouterr().out)  # still version 1: `calls` was not rebuilt first


def test_rebuild_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ledger rebuild --workers N`; anything but a whole number of 1 or more is a usage error (exit 2)."""
    db = f"sqlite:///{tmp_path / 'l.db'}"
    assert main(["db", "upgrade", "--db", db]) == 0
    assert main(["import", str(write_jsonl(tmp_path / "moe.jsonl", seed_rows(MOE))), "--db", db]) == 0
    capsys.readouterr()
    assert main(["rebuild", "calls", "--workers", "2", "--db", db]) == 0
    assert "calls: version 2 promoted" in capsys.readouterr().out
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as exit_:
            main(["rebuild", "--workers", bad, "--db", db])
        assert exit_.value.code == 2
        assert f"{bad!r} is not a whole number of 1 or more" in capsys.readouterr().err
