"""Every shell block of README.md and docs/ runs as written, or says by name why not (tests/_doc_blocks.py).

Runnable blocks run in a scratch directory holding a real ledger (`ledger.db`, `LEDGER_DATABASE_URL` names it)
with a few imported runs, the file that made it (`calls-2026-10.jsonl`, README's import example) and `docs/` and
`.venv/` linked in, so the docs' paths resolve. A document's blocks run in order in one shell (`cd` and `export`
carry over, as for a reader pasting them), stopping at the first command that fails. Synopsis blocks are checked
against the `ledger` parser: every subcommand and option they name exists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._doc_blocks import SKIP_REASONS, Block, doc_files, read_blocks
from usage_ledger.cli import build_parser
from usage_ledger.emulator.faults import FaultError, parse_faults

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = [block for path in doc_files(ROOT) for block in read_blocks(path, ROOT)]
SHELL = [block for block in BLOCKS if block.is_shell]
RUNNABLE_DOCS = sorted({str(block.path) for block in SHELL if block.runnable})

# The scratch ledger's runs: the names the docs' examples use (compare, report), two tickers, two steps each.
RUNS = {
    "moe-2026-03-02": "emulator-moe",
    "dense-2026-03-03": "emulator-dense",
    **dict.fromkeys(("nightly-a", "nightly-b", "replay-of-a"), "m"),
}


def _fixture_calls() -> str:
    rows = []
    start = 1_772_409_600  # 2026-03-02T00:00:00Z
    for r, (run, model) in enumerate(RUNS.items()):
        for t, ticker in enumerate(("AAPL", "MSFT")):
            for step in range(2):
                begin = start + r * 86_400 + t * 60 + step * 20
                rows.append(
                    {
                        "run": run,
                        "model": model,
                        "ticker": ticker,
                        "started_at": begin,
                        "elapsed_s": 12.5 + step,
                        "ttft_s": 0.4,
                        "input_tokens": 900 + step,
                        "output_tokens": 450 + 10 * t,
                        "call_id": f"{run}-{ticker}-{step}",
                    }
                )
    return "".join(json.dumps(row) + "\n" for row in rows)


def test_every_shell_block_runs_or_says_why_not() -> None:
    problems = []
    for block in SHELL:
        if block.mark == "skip" and block.skip_reason not in SKIP_REASONS:
            problems.append(f"{block.where}: skip reason {block.skip_reason!r} is not one of {sorted(SKIP_REASONS)}")
        if block.language == "console" and block.runnable and not block.commands():
            problems.append(f"{block.where}: a console block without a `$ ` line runs nothing: fence it as sh")
        if not block.language and block.mark is None:
            problems.append(f"{block.where}: commands without a language: fence them as console or sh, or mark them")
    for block in BLOCKS:
        if block.mark and not block.is_shell:
            problems.append(f"{block.where}: a doc-test mark on a block that is not shell commands")
    assert not problems, "\n".join(problems)
    assert RUNNABLE_DOCS  # the test runs something


def _synopsis_commands(block: Block) -> list[tuple[int, str]]:
    """(line, command) for each `ledger …` usage of a synopsis block, continuation lines joined."""
    out: list[tuple[int, str]] = []
    for offset, line in enumerate(block.text.splitlines(), start=1):
        text = line.split(" #", 1)[0].removeprefix("$ ").strip()
        if text.startswith("ledger "):
            out.extend((block.line + offset, part) for part in re.split(r"\s\|\s(?=ledger\s)", text))
        elif text and out:
            out[-1] = (out[-1][0], f"{out[-1][1]} {text}")
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


@pytest.mark.parametrize("block", [b for b in SHELL if b.mark == "synopsis"], ids=lambda b: b.where.replace("/", "_"))
def test_a_synopsis_names_commands_and_options_that_exist(block: Block) -> None:
    commands = _synopsis_commands(block)
    assert commands, f"{block.where}: a synopsis block without a `ledger …` line"
    problems = []
    for line, command in commands:
        words = command.split()[1:]
        parser, path = build_parser(), ["ledger"]
        while words and words[0] in _subparsers(parser):
            path.append(words[0])
            parser = _subparsers(parser)[words.pop(0)]
        if len(path) == 1 or _subparsers(parser):
            problems.append(f"{block.path}:{line}: `{command}` names no command")
            continue
        options = {option for action in parser._actions for option in action.option_strings}
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", command):
            if flag not in options:
                problems.append(f"{block.path}:{line}: `{' '.join(path)}` has no option {flag}")
    assert not problems, "\n".join(problems)


def _script(doc: str) -> str:
    """One shell script of the document's runnable blocks; each command announces where it comes from."""
    parts = ["set -e -o pipefail"]
    for block in SHELL:
        if str(block.path) != doc or not block.runnable:
            continue
        for command in block.commands():
            parts.append(f"echo {shlex.quote(f'>>> {block.where}: {command.splitlines()[0]}')} >&2")
            parts.append(command)
    return "\n".join(parts) + "\n"


def _env(directory: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),  # the subprocesses import this checkout
        "LEDGER_DATABASE_URL": "sqlite:///ledger.db",
        "COLUMNS": "100",
        "HOME": str(directory),
    }


@pytest.fixture(scope="module")
def template_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scratch ledger, made once: migrated, the fixture calls imported (two commands, seconds each)."""
    directory = tmp_path_factory.mktemp("template")
    (directory / "calls-2026-10.jsonl").write_text(_fixture_calls())
    for command in (["ledger", "db", "upgrade"], ["ledger", "import", "calls-2026-10.jsonl"]):
        subprocess.run(command, cwd=directory, env=_env(directory), check=True, capture_output=True)
    return directory


@pytest.fixture
def scratch(tmp_path: Path, template_ledger: Path) -> Path:
    for name in ("ledger.db", "calls-2026-10.jsonl"):
        shutil.copyfile(template_ledger / name, tmp_path / name)
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    return tmp_path


@pytest.mark.parametrize("doc", RUNNABLE_DOCS)
def test_the_docs_commands_run_as_written(doc: str, scratch: Path) -> None:
    done = subprocess.run(
        ["bash", "-c", _script(doc)], cwd=scratch, env=_env(scratch), capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        where = [line for line in done.stderr.splitlines() if line.startswith(">>> ")]
        failed = where[-1].removeprefix(">>> ") if where else "(before the first command)"
        pytest.fail(f"{failed}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}", pytrace=False)


def test_every_fault_the_emulator_takes_is_documented() -> None:
    """`ledger emulate --fault` once said "see docs" and no doc said more (issue #54)."""
    section = (ROOT / "docs" / "emulator.md").read_text().split("## Faults", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([a-z-]+)", section, flags=re.MULTILINE)
    with pytest.raises(FaultError) as unknown:
        parse_faults(["no-such-fault"])
    accepted = re.findall(r"([a-z]+(?:-[a-z]+)+|status)(?=[\[=])", str(unknown.value).split(";", 1)[1])
    assert documented and sorted(documented) == sorted(accepted)
    for name in documented:
        parse_faults([f"{name}={503 if name == 'status' else 1}"])  # each as documented parses
    emulate = _subparsers(build_parser())["emulate"]
    (fault,) = [action for action in emulate._actions if "--fault" in action.option_strings]
    assert fault.help and "docs/emulator.md" in fault.help and all(name in fault.help for name in documented)
