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


HEAVY = ("sqlalchemy", "litestar", "httpx", "rich", "alembic", "asyncpg", "aiosqlite", "openai", "numpy")
_HELP_EVERYWHERE = """
import argparse, contextlib, io, sys
from usage_ledger.cli import build_parser, main

def paths(parser, prefix):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield [*prefix, name]
                yield from paths(child, [*prefix, name])

helped = 0
for path in [[], *paths(build_parser(), [])]:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        main([*path, "--help"])
    helped += "usage: ledger" in out.getvalue()
print(helped, " ".join(sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))))
"""


def test_help_imports_none_of_the_heavy_dependencies() -> None:
    """`ledger --help` and every `ledger CMD --help` build the parsers only: no database driver, web stack or table
    library (issue #54: every command, --help included, spent 1.1–1.4 s importing; docs/BENCHMARKS.md)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _HELP_EVERYWHERE, *HEAVY], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    helped, *imported = done.stdout.split()
    assert int(helped) >= 30  # every command and subcommand printed its help
    assert imported == [], f"--help imported {imported}"


def test_a_command_imports_what_it_needs_when_it_runs(tmp_path: Path) -> None:
    """The lazy imports resolve: each command's function is found, and `--version` still reads the version."""
    done = _ledger(tmp_path, "--version")
    assert done.returncode == 0 and done.stdout.startswith("ledger ") and done.stdout.split()[1][0].isdigit()
    done = _ledger(tmp_path, "report", "runs", "--formula", "no-such", "--db", "sqlite:///x.db")
    assert done.returncode == 2 and "invalid choice: 'no-such' (choose from batch_aggregate, per_call_mean" in (
        done.stderr
    )
