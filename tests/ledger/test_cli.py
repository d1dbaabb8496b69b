"""The ledger's own commands as a user runs them: db upgrade, verify (exit 0/1), events tail."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.ledger.helpers import call_events
from tests.ledger.test_bad_input import ledger_cli
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.db import open_database


def _seed(url: str, calls: int) -> None:
    async def run() -> None:
        database = open_database(url, null_pool=True)
        for index in range(calls):
            await append_events(database, call_events(index))
        await database.dispose()

    asyncio.run(run())


def test_verify_exit_codes_and_the_first_bad_position(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    assert ledger_cli("db", "upgrade", "--db", url).returncode == 0
    _seed(url, 3)
    intact = ledger_cli("verify", "--db", url)
    assert intact.returncode == 0 and "chain intact: 6 events" in intact.stdout

    import sqlite3

    with sqlite3.connect(tmp_path / "l.db") as conn:
        conn.execute("DROP TRIGGER ledger_events_no_update")
        conn.execute(
            "UPDATE ledger_events SET payload = replace(payload, '\"status\":200', '\"status\":500') WHERE position = 4"
        )
    broken = ledger_cli("verify", "--db", url, "--format", "json")
    assert broken.returncode == 1
    report = json.loads(broken.stdout)
    assert report["ok"] is False and report["first_bad_position"] == 4 and report["checked"] == 3


def test_events_tail_prints_json_lines(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    assert ledger_cli("db", "upgrade", "--db", url).returncode == 0
    _seed(url, 2)
    result = ledger_cli("events", "tail", "--db", url, "--after", "1")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["position"] for line in lines] == [2, 3, 4]
    assert lines[0]["type"] == "call.finished" and lines[0]["payload"]["status"] == 200
