"""Issue #55: `ledger redact --run RUN | --before DATE` erases the selected calls' bodies, records why first,
keeps a body a call outside the selection shares (unless `--include-shared`), resumes an interrupted erase,
and leaves verify, the reports and the other runs' bodies as they were; on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest

from tests.ledger.helpers import build_ledger, head_of
from tests.retention_seed import DAY0, Seeded, bodies_gone
from usage_ledger.answers import BodySelection
from usage_ledger.cli import main
from usage_ledger.commands.retention import erase_selected
from usage_ledger.ledger import (
    BlobRedacted,
    CallStarted,
    append_events,
    blob_erasures,
    blob_stream,
    new_event,
    open_database,
)
from usage_ledger.projections import catch_up_all


@pytest.fixture
def seeded(backend_url: str) -> tuple[str, Seeded]:
    seed = Seeded()
    asyncio.run(build_ledger(backend_url, seed))
    return backend_url, seed


def _redactions(url: str, digests: list[str]) -> int:
    async def run() -> int:
        database = open_database(url, null_pool=True)
        try:
            async with database.engine.connect() as conn:
                return len(await blob_erasures(conn, digests))
        finally:
            await database.dispose()

    return asyncio.run(run())


def _report(url: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["report", "runs", "--format", "json", "--db", url]) == 0
    return capsys.readouterr().out


def test_a_runs_bodies_go_and_everything_else_stays(
    seeded: tuple[str, Seeded], capsys: pytest.CaptureFixture[str]
) -> None:
    url, seed = seeded
    report = _report(url, capsys)
    head = head_of(url)
    assert main(["redact", "--run", "old", "--reason", "customer asked", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "erased 11 bodies of 6 calls" in out
    assert "kept 1 bodies a call outside the selection also references (--include-shared" in out
    assert head_of(url) == head + 11  # one blob.redacted per erased body, appended before the bytes went
    assert all(bodies_gone(url, seed.bodies["old"]))
    assert not any(bodies_gone(url, [*seed.bodies["new"], seed.shared]))
    assert main(["verify", "--db", url]) == 0
    capsys.readouterr()
    assert _report(url, capsys) == report  # usage is not in the bodies: the reports are byte-identical

    assert main(["show", "call", "old-3", "--db", url]) == 0
    shown = capsys.readouterr().out
    assert "was erased on" in shown and "customer asked" in shown

    # the shared body goes only when asked, and once: the others are counted as erased before
    assert main(["redact", "--run", "old", "--reason", "customer asked", "--include-shared", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "erased 1 bodies of 6 calls" in out and "11 bodies were erased before" in out
    assert bodies_gone(url, [seed.shared]) == [True]
    assert main(["verify", "--db", url]) == 0
    capsys.readouterr()
    assert _report(url, capsys) == report


def test_dry_run_counts_and_changes_nothing(seeded: tuple[str, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, seed = seeded
    head = head_of(url)
    assert main(["redact", "--before", "2026-06-05", "--reason", "90 days", "--dry-run", "--db", url]) == 0
    out = capsys.readouterr().out
    assert out.startswith("would erase 11 bodies of 6 calls (") and "uncompressed" in out and "kept 1 bodies" in out
    assert head_of(url) == head and not any(bodies_gone(url, seed.bodies["old"]))


def test_before_a_date_selects_the_older_calls(seeded: tuple[str, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, seed = seeded
    assert main(["redact", "--before", "2026-06-11T09:01:00+00:00", "--reason", "90 days", "--db", url]) == 0
    # all of `old`, and the two calls of `new` before 09:01:00 (its first three bodies): the shared body too,
    # since every call that references it is selected
    assert "erased 15 bodies of 8 calls" in capsys.readouterr().out
    assert all(bodies_gone(url, [*seed.bodies["old"], seed.shared, *seed.bodies["new"][:3]]))
    assert not any(bodies_gone(url, seed.bodies["new"][3:]))
    assert main(["verify", "--db", url]) == 0


def test_bad_selections_are_refused(seeded: tuple[str, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, seed = seeded
    head = head_of(url)
    assert main(["redact", "--before", "June", "--reason", "x", "--db", url]) == 2
    assert "expected a date YYYY-MM-DD" in capsys.readouterr().err
    assert main(["redact", seed.shared, "--run", "old", "--reason", "x", "--db", url]) == 2
    assert main(["redact", "--reason", "x", "--db", url]) == 2
    assert main(["redact", "--run", "old", "--reason", " ", "--db", url]) == 2
    assert head_of(url) == head


class _Cut(Exception):
    pass


def test_an_interrupted_erase_is_finished_by_running_it_again(
    seeded: tuple[str, Seeded], capsys: pytest.CaptureFixture[str]
) -> None:
    url, seed = seeded

    def cut(_erased: int) -> None:
        raise _Cut

    async def interrupted() -> None:
        database = open_database(url, null_pool=True)
        try:
            with pytest.raises(_Cut):  # killed after its first batch of 4
                await erase_selected(database, BodySelection(run="old"), "gdpr", batch=4, after_batch=cut)
        finally:
            await database.dispose()

    async def events_only(digests: list[str]) -> None:
        # a second kill between a batch's events and its erasure: events appended, bytes still there
        database = open_database(url, null_pool=True)
        try:
            batch = [new_event(BlobRedacted(blob_hash=d, reason="gdpr"), stream=blob_stream(d)) for d in digests]
            await append_events(database, batch)
        finally:
            await database.dispose()

    asyncio.run(interrupted())
    remaining = [
        d for d, gone in zip(seed.bodies["old"], bodies_gone(url, seed.bodies["old"]), strict=True) if not gone
    ]
    asyncio.run(events_only(remaining[:3]))
    assert bodies_gone(url, seed.bodies["old"]).count(True) == 4
    head = head_of(url)
    assert main(["redact", "--run", "old", "--reason", "gdpr", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "erased 7 bodies" in out and "4 bodies were erased before" in out
    assert "3 bodies finished whose blob.redacted an interrupted erase had appended" in out
    assert head_of(url) == head + 4  # only the 4 bodies without an event got one
    assert all(bodies_gone(url, seed.bodies["old"])) and _redactions(url, seed.bodies["old"]) == 11
    assert main(["verify", "--db", url]) == 0


def test_vacuum_gives_the_space_back(seeded: tuple[str, Seeded], capsys: pytest.CaptureFixture[str]) -> None:
    url, seed = seeded
    assert main(["redact", "--run", "old", "--reason", "gdpr", "--vacuum", "--db", url]) == 0
    assert "space given back (VACUUM)" in capsys.readouterr().out
    assert all(bodies_gone(url, seed.bodies["old"])) and not any(bodies_gone(url, seed.bodies["new"]))
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            assert conn.execute("PRAGMA freelist_count").fetchone() == (0,)  # no free page left in the file
    assert main(["verify", "--db", url]) == 0


def test_a_checkpoint_signed_before_the_erasure_still_verifies(
    seeded: tuple[str, Seeded], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = seeded
    key, checkpoint = tmp_path / "key", tmp_path / "checkpoint.txt"
    assert main(["keygen", "--out", str(key)]) == 0
    assert main(["checkpoint", "--key", str(key), "--out", str(checkpoint), "--db", url]) == 0
    assert main(["redact", "--before", "2026-07-01", "--reason", "90 days", "--include-shared", "--db", url]) == 0
    capsys.readouterr()
    assert main(["verify", "--checkpoint", str(checkpoint), "--pubkey", f"{key}.pub", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "checkpoint" in out and "the ledger contains its head" in out and "blobs intact" in out


def test_a_body_a_call_not_yet_folded_reuses_is_kept(seeded: tuple[str, Seeded]) -> None:
    """The gateway's pass reads the read model as its follower left it: a call recorded since, reusing an old
    prompt (a replay), is outside the selection, so the body stays."""
    url, seed = seeded
    reused = seed.bodies["old"][0]  # old-1's request

    async def run() -> int:
        database = open_database(url, null_pool=True)
        try:
            await catch_up_all(database)
            started = CallStarted(
                call_id="replayed-1",
                received_at=DAY0 + timedelta(days=200),
                method="POST",
                path="/v1/chat/completions",
                run="replay",
                request_blob=reused,
            )
            await append_events(database, [new_event(started, stream="call-replayed-1")])
            done = await erase_selected(database, BodySelection(run="old"), "gdpr", refresh=False)
            return done.kept_shared
        finally:
            await database.dispose()

    assert asyncio.run(run()) == 2  # the body both runs share, and the one the new call reuses
    assert bodies_gone(url, seed.bodies["old"]) == [False] + [True] * 10
