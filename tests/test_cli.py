"""The `ledger` command as a user meets it first: what a bare command says when no ledger is named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEDGER = str(Path(sys.executable).parent / "ledger")


def _ledger(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")} | {"PYTHONPATH": str(ROOT)}
    return subprocess.run([LEDGER, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_a_bare_report_after_the_demo_points_to_the_demos_ledger(tmp_path: Path) -> None:
    """After `ledger demo`, `ledger report runs` looked for ./ledger.db and only said to create it (issue #54)."""
    done = _ledger(tmp_path, "report", "runs")
    assert done.returncode == 2
    assert "no ledger database at sqlite:///./ledger.db" in done.stderr
    assert "neither --db nor LEDGER_DATABASE_URL" in done.stderr and "ledger-demo.db" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing created

    demo = tmp_path / "ledger-demo.db"
    assert _ledger(tmp_path, "db", "upgrade", "--db", "sqlite:///ledger-demo.db").returncode == 0
    done = _ledger(tmp_path, "report", "runs")
    assert done.returncode == 2 and demo.is_file() and not (tmp_path / "ledger.db").exists()
    assert "the demo's ledger is here: add --db sqlite:///ledger-demo.db" in done.stderr
    assert "export LEDGER_DATABASE_URL=sqlite:///ledger-demo.db" in done.stderr


def test_a_named_ledger_that_is_missing_gets_no_hint_about_defaults(tmp_path: Path) -> None:
    done = _ledger(tmp_path, "report", "runs", "--db", "sqlite:///elsewhere.db")
    assert done.returncode == 2 and "no ledger database at" in done.stderr
    assert "LEDGER_DATABASE_URL" not in done.stderr


def test_eras_by_a_label_no_run_carries_says_so_and_names_the_labels(tmp_path: Path) -> None:
    """`report eras --by hardware` on the demo's ledger grouped every run under `-` without saying why (#54)."""
    rows = [
        f'{{"run": "{run}", "model": "m", "started_at": {1_772_409_600 + i * 100}, "elapsed_s": 4, '
        f'"input_tokens": 10, "output_tokens": 20}}\n'
        for i, run in enumerate(("a", "b"))
    ]
    (tmp_path / "calls.jsonl").write_text("".join(rows))
    db = "sqlite:///ledger.db"
    for args in (["db", "upgrade"], ["import", "calls.jsonl"], ["annotate", "--run", "a", "--kind", "nightly"]):
        assert _ledger(tmp_path, *args, "--db", db).returncode == 0
    done = _ledger(tmp_path, "report", "eras", "--by", "hardware", "--db", db)
    assert done.returncode == 0
    assert "no run carries a hardware label; the labels runs carry: kind, model" in " ".join(done.stdout.split())
    assert _ledger(tmp_path, "annotate", "--run", "b", "--hardware", "5090", "--db", db).returncode == 0
    done = _ledger(tmp_path, "report", "eras", "--by", "hardware", "--db", db)
    assert done.returncode == 0 and "5090" in done.stdout and "no run carries" not in done.stdout
