"""The gateway's checkpointer: when it writes (interval, run ended, shutdown), what it refuses to
sign, and that a failed write is only a warning (driven tick by tick, on both backends)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from tests.ledger.helpers import call_events
from tests.ledger.test_tamper import DROP_TRIGGERS
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.checkpoint import SigningKey, generate_key
from usage_ledger.ledger.checkpointer import Checkpointer, read_checkpoint_notes
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.errors import ConfigError
from usage_ledger.ledger.schema import events
from usage_ledger.ledger.settings import StorageSettings
from usage_ledger.ledger.verify_ledger import verify_ledger


def _checkpointer(database: Database, key: SigningKey, directory: Path, **kwargs: float) -> Checkpointer:
    """In `directory`/checkpoints (the SQLite ledger's file lives in the test's tmp_path)."""
    options = {"interval_s": 3600.0, "run_idle_s": 3600.0, **kwargs}
    (directory / "checkpoints").mkdir(exist_ok=True)
    return Checkpointer(database, key, directory / "checkpoints", **options)  # type: ignore[arg-type]


def _sizes(directory: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in (directory / "checkpoints").glob("checkpoint-*.txt"))


async def _all_verify(database: Database, key: SigningKey, directory: Path) -> bool:
    notes = read_checkpoint_notes([directory / "checkpoints"])
    report = await verify_ledger(database, checkpoints=notes, verifier=key.verifier)
    return report.ok and len(report.checkpoints) == len(notes)


async def test_a_run_that_goes_idle_gets_a_checkpoint(database: Database, tmp_path: Path) -> None:
    key = generate_key("k")
    checkpointer = _checkpointer(database, key, tmp_path, run_idle_s=0.05)
    await checkpointer.tick()  # start-up: an empty ledger, nothing to sign
    await append_events(database, call_events(0) + call_events(1))  # run r1
    await checkpointer.tick()
    assert _sizes(tmp_path) == []  # the run is still going
    await asyncio.sleep(0.1)
    await checkpointer.tick()
    assert _sizes(tmp_path) == [4]
    await checkpointer.tick()
    assert _sizes(tmp_path) == [4]  # nothing moved: nothing new
    assert await _all_verify(database, key, tmp_path)


async def test_the_interval_and_shutdown_write_only_when_the_head_moved(database: Database, tmp_path: Path) -> None:
    key = generate_key("k")
    await append_events(database, call_events(0))
    checkpointer = _checkpointer(database, key, tmp_path, interval_s=0.01)
    await asyncio.sleep(0.02)
    await checkpointer.tick()
    assert _sizes(tmp_path) == [2]
    await append_events(database, call_events(1))
    await checkpointer.close()  # never started: close still signs the final head
    assert _sizes(tmp_path) == [2, 4]
    await checkpointer.close()
    assert _sizes(tmp_path) == [2, 4]
    assert await _all_verify(database, key, tmp_path)


async def test_it_refuses_to_sign_a_ledger_that_no_longer_holds_its_checkpoint(
    database: Database, tmp_path: Path
) -> None:
    key = generate_key("k")
    await append_events(database, call_events(0) + call_events(1))
    first = _checkpointer(database, key, tmp_path)
    await first.close()
    assert _sizes(tmp_path) == [4]
    async with database.engine.begin() as conn:  # while the gateway was down: a recorded_at edited
        for drop in DROP_TRIGGERS[database.backend]:
            await conn.exec_driver_sql(drop)
        row = (await conn.execute(events.select().where(events.c.position == 2))).one()
        moved = row.recorded_at + timedelta(milliseconds=1)
        await conn.execute(update(events).where(events.c.position == 2).values(recorded_at=moved))
    await append_events(database, call_events(2))
    restarted = _checkpointer(database, key, tmp_path)
    await restarted.close()
    assert _sizes(tmp_path) == [4]  # nothing signed over the edited history


async def test_it_refuses_rows_that_do_not_chain(database: Database, tmp_path: Path) -> None:
    key = generate_key("k")
    checkpointer = _checkpointer(database, key, tmp_path)
    await checkpointer.tick()
    await append_events(database, call_events(0))
    async with database.engine.begin() as conn:
        for drop in DROP_TRIGGERS[database.backend]:
            await conn.exec_driver_sql(drop)
        await conn.exec_driver_sql("UPDATE ledger_events SET stream = 'call-forged' WHERE position = 2")
    await checkpointer.close()
    assert _sizes(tmp_path) == []


async def test_a_failed_write_is_a_warning_and_the_next_tick_writes(database: Database, tmp_path: Path) -> None:
    key = generate_key("k")
    checkpointer = _checkpointer(database, key, tmp_path, interval_s=0.01)
    await append_events(database, call_events(0))
    (tmp_path / "checkpoints").rmdir()  # the disk the checkpoints go to went away
    await asyncio.sleep(0.02)
    await checkpointer.tick()  # logs checkpoint_failed, raises nothing
    (tmp_path / "checkpoints").mkdir()
    await checkpointer.tick()
    assert _sizes(tmp_path) == [2]


def test_settings_turn_it_on_and_a_bad_key_stops_the_start(tmp_path: Path) -> None:
    from usage_ledger.ledger.checkpoint import write_key_files
    from usage_ledger.ledger.db import open_database

    database = open_database(f"sqlite:///{tmp_path / 'l.db'}")
    try:
        assert Checkpointer.from_settings(StorageSettings(), database) is None
        write_key_files(generate_key("k"), tmp_path / "key")
        on = StorageSettings(checkpoint_key=str(tmp_path / "key"), checkpoint_dir=str(tmp_path / "cps"))
        checkpointer = Checkpointer.from_settings(on, database)
        assert checkpointer is not None and (tmp_path / "cps").is_dir()
        with pytest.raises(ConfigError, match="not a checkpoint key"):
            Checkpointer.from_settings(StorageSettings(checkpoint_key=str(tmp_path / "key.pub")), database)
    finally:
        asyncio.run(database.dispose())
