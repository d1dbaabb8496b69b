"""`ledger annotate` refuses a run no call carries (exit 2, nothing appended) unless `--force`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

from tests.ledger.helpers import head_of
from tests.projections.helpers import finished, started
from usage_ledger.cli import main
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.db import open_database


@pytest.fixture
def ledger_url(backend_url: str, tmp_path: Path) -> str:
    """A ledger holding a gateway run `night-1`, one untagged (auto-…) call and an imported run `old-1`."""
    assert main(["db", "upgrade", "--db", backend_url]) == 0

    async def seed() -> None:
        database = open_database(backend_url, null_pool=True)
        try:
            await append_events(
                database,
                [started("g1", 0, run="night-1"), finished("g1", 0, 5), started("u1", 100), finished("u1", 100, 101)],
            )
        finally:
            await database.dispose()

    asyncio.run(seed())
    row = {"started_at": 1772373600, "elapsed_s": 3, "input_tokens": 10, "output_tokens": 2, "run": "old-1"}
    path = tmp_path / "old.jsonl"
    path.write_bytes(msgspec.json.encode(row) + b"\n")
    assert main(["import", str(path), "--db", backend_url]) == 0
    return backend_url


def test_an_unknown_run_is_refused_and_nothing_is_appended(ledger_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = head_of(ledger_url)
    capsys.readouterr()
    assert main(["annotate", "--run", "nosuchrun", "--hardware", "rtx5090", "--db", ledger_url]) == 2
    err = capsys.readouterr().err
    assert "'nosuchrun'" in err and "nothing appended" in err and "ledger report runs" in err and "--force" in err
    assert head_of(ledger_url) == before


def test_gateway_imported_and_auto_runs_are_known(ledger_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "runs", "--db", ledger_url, "--format", "json"]) == 0
    names = sorted(run["run"] for run in json.loads(capsys.readouterr().out))
    (auto,) = [name for name in names if name.startswith("auto-")]
    assert names == sorted(["night-1", "old-1", auto])
    before = head_of(ledger_url)
    for name in names:
        assert main(["annotate", "--run", name, "--kind", "nightly", "--db", ledger_url]) == 0
    assert head_of(ledger_url) == before + 3


def test_force_labels_a_run_not_recorded_yet(ledger_url: str) -> None:
    before = head_of(ledger_url)
    assert main(["annotate", "--run", "tomorrow", "--hardware", "h100", "--force", "--db", ledger_url]) == 0
    assert head_of(ledger_url) == before + 1
