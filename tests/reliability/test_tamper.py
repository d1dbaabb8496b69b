"""Tampering with a real ledger, caught by the real `ledger verify` CLI (exit code 1), on SQLite and
PostgreSQL.

A real `ledger serve` (with LEDGER_CHECKPOINT_KEY) records calls of a run in front of the emulator
and signs a checkpoint at shutdown; `ledger redact` erases one body the honest way. Each attack
then works on a copy of that ledger, with the triggers dropped where it needs to. Edits of bodies,
sizes and `recorded_at` are caught by `ledger verify` alone, and so is a cut tail with `ledger_head` left
naming the old last event; the attacks that leave a shorter or re-chained but self-consistent ledger (cut
tail with the head moved back, every event deleted, re-chain after an edit) pass it — they are caught by the
signed checkpoint the gateway wrote outside the database.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import msgspec
import pytest
import zstandard
from sqlalchemy import text, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.conftest import _pg_admin, _pg_admin_url
from tests.gateway import processes
from tests.gateway.processes import Process
from tests.ledger.test_tamper import DROP_TRIGGERS
from tests.ledger.test_verify_ledger import DROP_BLOB_TRIGGERS
from tests.reliability.helpers import chat_body
from usage_ledger.ledger.chain import chain_hash
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.events import decode_event, encode_event
from usage_ledger.ledger.schema import blobs, events
from usage_ledger.ledger.verify_ledger import verify_ledger

pytestmark = pytest.mark.slow

RUN = "tamper-run"


@dataclass(frozen=True)
class Recorded:
    backend: str
    url: str
    pubkey: Path
    checkpoints: Path
    tmp: Path


def _ledger(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([processes.LEDGER, *args], capture_output=True, text=True)


@pytest.fixture(scope="module", params=("sqlite", "postgresql"))
def recorded(
    request: pytest.FixtureRequest, emulator: Process, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Recorded]:
    backend: str = request.param
    tmp = tmp_path_factory.mktemp(f"tamper-{backend}")
    admin = _pg_admin_url() if backend == "postgresql" else None
    url = f"sqlite:///{tmp / 'ledger.db'}"
    if admin is not None:
        url = _create_pg(admin)
    try:
        processes.upgrade(url)
        assert _ledger("keygen", "--out", str(tmp / "ledger.key")).returncode == 0
        checkpoints = tmp / "checkpoints"
        env = {
            "LEDGER_CHECKPOINT_KEY": str(tmp / "ledger.key"),
            "LEDGER_CHECKPOINT_DIR": str(checkpoints),
            "LEDGER_CHECKPOINT_INTERVAL_S": "3600",
        }
        gateway = processes.gateway(tmp, emulator.url, url, env=env).start()  # type: ignore[attr-defined]
        try:
            with httpx.Client(timeout=60) as http:
                for index in range(4):
                    if index == 2:  # mid-run, one body erased the honest way (blob.redacted first)
                        blob = asyncio.run(_first_request_blob(url))
                        redact = _ledger("redact", "--db", url, blob, "--reason", "test: erased honestly")
                        assert redact.returncode == 0, redact.stderr
                    body = chat_body(f"ticker {index:06d} news", max_tokens=24, stream=index % 2 == 1)
                    response = http.post(
                        gateway.url + "/v1/chat/completions",  # type: ignore[attr-defined]
                        content=body,
                        headers={"content-type": "application/json", "x-ledger-run": RUN},
                    )
                    assert response.status_code == 200
        finally:
            gateway.stop()  # SIGTERM: drains the writer, then signs the final checkpoint
        assert len(list(checkpoints.glob("checkpoint-*.txt"))) == 1, tmp / "gateway.log"
        manual = _ledger(
            "checkpoint",
            "--db",
            url,
            "--key",
            str(tmp / "ledger.key"),
            "--out",
            str(checkpoints / "checkpoint-cli.txt"),
        )
        assert manual.returncode == 0, manual.stderr
        yield Recorded(backend, url, tmp / "ledger.key.pub", checkpoints, tmp)
    finally:
        if admin is not None:
            _drop_pg(admin, url)


@pytest.fixture
def copy(recorded: Recorded, tmp_path: Path) -> Iterator[str]:
    """A copy of the recorded ledger for one attack."""
    if recorded.backend == "sqlite":
        target = tmp_path / "copy.db"
        with sqlite3.connect(make_url(recorded.url).database or "") as source, sqlite3.connect(target) as out:
            source.backup(out)
        yield f"sqlite:///{target}"
        return
    admin = _pg_admin_url()
    assert admin is not None
    url = _create_pg(admin, template=make_url(recorded.url).database)
    try:
        yield url
    finally:
        _drop_pg(admin, url)


def _verify(url: str, recorded: Recorded, *, checkpoints: bool) -> subprocess.CompletedProcess[str]:
    extra = ["--checkpoint", str(recorded.checkpoints), "--pubkey", str(recorded.pubkey)] if checkpoints else []
    return _ledger("verify", "--db", url, *extra)


def test_the_recorded_ledger_verifies_with_its_checkpoints(recorded: Recorded) -> None:
    result = _verify(recorded.url, recorded, checkpoints=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "blobs intact" in result.stdout and result.stdout.count("the ledger contains its head") == 2


Attack = Callable[[AsyncConnection, str], Awaitable[None]]


async def edit_a_body(conn: AsyncConnection, backend: str) -> None:
    """One byte of a stored body changed, stored back in its codec with its stored size: a tidy forgery."""
    query = "SELECT hash, codec, content FROM ledger_blobs WHERE content IS NOT NULL ORDER BY hash LIMIT 1"
    digest, codec, content = (await conn.execute(text(query))).one()
    body = zstandard.ZstdDecompressor().decompress(bytes(content)) if codec == "zstd" else bytes(content)
    body = body[:-1] + (b"X" if body[-1:] != b"X" else b"Y")
    forged = zstandard.ZstdCompressor().compress(body) if codec == "zstd" else body
    await conn.execute(update(blobs).where(blobs.c.hash == digest).values(content=forged, stored_size=len(forged)))


async def delete_a_blob(conn: AsyncConnection, backend: str) -> None:
    await conn.execute(
        text("DELETE FROM ledger_blobs WHERE hash = (SELECT min(hash) FROM ledger_blobs WHERE content IS NOT NULL)")
    )


async def blank_a_body(conn: AsyncConnection, backend: str) -> None:
    # the one update the triggers allow, without the blob.redacted event `ledger redact` appends first
    await conn.execute(
        text(
            "UPDATE ledger_blobs SET content = NULL, stored_size = 0, redacted_at = created_at "
            "WHERE hash = (SELECT min(hash) FROM ledger_blobs WHERE content IS NOT NULL)"
        )
    )


async def edit_a_size(conn: AsyncConnection, backend: str) -> None:
    await conn.execute(
        text(
            "UPDATE ledger_blobs SET size = size - 1 WHERE hash = (SELECT min(hash) FROM ledger_blobs WHERE content IS NOT NULL)"
        )
    )


async def edit_a_recorded_at(conn: AsyncConnection, backend: str) -> None:
    row = (await conn.execute(events.select().where(events.c.position == 3))).one()
    await conn.execute(
        update(events).where(events.c.position == 3).values(recorded_at=row.recorded_at - timedelta(hours=3))
    )


async def nudge_a_recorded_at(conn: AsyncConnection, backend: str) -> None:
    """Within the clock skew `ledger verify` allows: only the checkpoint's recorded-at digest tells."""
    row = (await conn.execute(events.select().where(events.c.position == 3))).one()
    await conn.execute(
        update(events).where(events.c.position == 3).values(recorded_at=row.recorded_at + timedelta(seconds=1))
    )


async def cut_the_tail_leaving_the_head(conn: AsyncConnection, backend: str) -> None:
    """The last call's events go; `ledger_head` still names the old last event (the next append would leave a gap)."""
    await conn.execute(text("DELETE FROM ledger_events WHERE position > (SELECT max(position) - 2 FROM ledger_events)"))


async def cut_the_tail(conn: AsyncConnection, backend: str) -> None:
    """The last call's events go, and with them the bodies only they referenced, and the head row is moved back
    onto the new last event: a shorter, tidy ledger."""
    await cut_the_tail_leaving_the_head(conn, backend)
    await _delete_unreferenced_blobs(conn)
    await _head_onto_the_tail(conn)


async def delete_every_event(conn: AsyncConnection, backend: str) -> None:
    await conn.execute(text("DELETE FROM ledger_events"))
    await conn.execute(text("DELETE FROM ledger_blobs"))
    await _head_onto_the_tail(conn)


async def _head_onto_the_tail(conn: AsyncConnection) -> None:
    await conn.execute(
        text(
            "UPDATE ledger_head SET position = COALESCE((SELECT max(position) FROM ledger_events), 0), "
            "hash = COALESCE((SELECT hash FROM ledger_events ORDER BY position DESC LIMIT 1), :genesis) WHERE id = 1"
        ),
        {"genesis": "0" * 64},
    )


async def rechain_after_an_edit(conn: AsyncConnection, backend: str) -> None:
    """Halve a call's completion tokens, then recompute every hash from there on, and the head row's."""
    rows = (await conn.execute(events.select().order_by(events.c.position))).all()
    target = next(r for r in rows if r.type == "call.finished")
    payload = msgspec.json.decode(target.payload)
    payload["usage"]["completion_tokens"] //= 2
    previous = next((r.hash for r in rows if r.position == target.position - 1), "0" * 64)
    for row in rows[target.position - 1 :]:
        new_payload = _canonical(payload) if row.position == target.position else row.payload
        digest = chain_hash(previous, row.position, row.event_id, row.occurred_at, row.type, row.stream, new_payload)
        await conn.execute(
            update(events).where(events.c.position == row.position).values(payload=new_payload, hash=digest)
        )
        previous = digest
    await _head_onto_the_tail(conn)  # the head row names the new last hash too


def _canonical(payload: dict[str, object]) -> str:
    """The payload as the ledger would have stored it (canonical JSON), so it still decodes."""
    return encode_event(decode_event(msgspec.json.encode(payload))).decode()


async def _delete_unreferenced_blobs(conn: AsyncConnection) -> None:
    referenced: set[str] = set()
    for (payload,) in await conn.execute(text("SELECT payload FROM ledger_events")):
        body = msgspec.json.decode(payload)
        referenced |= {
            body[k] for k in ("request_blob", "response_blob", "chunk_gaps_blob", "blob_hash") if body.get(k)
        }
    for (digest,) in (await conn.execute(text("SELECT hash FROM ledger_blobs"))).all():
        if digest not in referenced:
            await conn.execute(blobs.delete().where(blobs.c.hash == digest))


@pytest.mark.parametrize(
    ("attack", "caught_alone", "message"),
    [
        (edit_a_body, True, "does not hash to the blob's name"),
        (delete_a_blob, True, "not stored"),
        (blank_a_body, True, "erased without a verified blob.redacted event"),
        (edit_a_size, True, "size says"),
        (edit_a_recorded_at, True, "recorded_at"),
        (nudge_a_recorded_at, False, "a recorded_at at or before position"),
        (cut_the_tail_leaving_the_head, True, "events were cut from the end"),
        (cut_the_tail, False, "rows were cut from the end"),
        (delete_every_event, False, "rows were cut from the end"),
        (rechain_after_an_edit, False, "re-chained"),
    ],
)
def test_tampering_is_caught(recorded: Recorded, copy: str, attack: Attack, caught_alone: bool, message: str) -> None:
    asyncio.run(_tamper(copy, recorded.backend, attack))
    alone = _verify(copy, recorded, checkpoints=False)
    anchored = _verify(copy, recorded, checkpoints=True)
    assert alone.returncode == (1 if caught_alone else 0), alone.stdout + alone.stderr
    assert anchored.returncode == 1, anchored.stdout + anchored.stderr
    assert message in (alone.stdout if caught_alone else anchored.stdout), anchored.stdout


def test_a_forged_or_foreign_checkpoint_fails_and_a_malformed_one_is_bad_input(
    recorded: Recorded, tmp_path: Path
) -> None:
    note = sorted(recorded.checkpoints.glob("checkpoint-0*.txt"))[0].read_text()
    lines = note.split("\n")
    forged = tmp_path / "forged.txt"
    forged.write_text("\n".join([lines[0], str(int(lines[1]) - 1), *lines[2:]]))
    result = _ledger("verify", "--db", recorded.url, "--checkpoint", str(forged), "--pubkey", str(recorded.pubkey))
    assert result.returncode == 1 and "does not verify" in result.stdout
    assert _ledger("keygen", "--out", str(tmp_path / "other.key")).returncode == 0
    foreign = _ledger(
        "verify",
        "--db",
        recorded.url,
        "--checkpoint",
        str(recorded.checkpoints),
        "--pubkey",
        str(tmp_path / "other.key.pub"),
    )
    assert foreign.returncode == 1 and "not signed by the key" in foreign.stdout
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("not a checkpoint\n")
    bad = _ledger("verify", "--db", recorded.url, "--checkpoint", str(garbage), "--pubkey", str(recorded.pubkey))
    assert bad.returncode == 2 and "blank line" in bad.stderr
    assert _ledger("verify", "--db", recorded.url, "--checkpoint", str(garbage)).returncode == 2  # no --pubkey


async def _tamper(url: str, backend: str, attack: Attack) -> None:
    database = open_database(url, null_pool=True)
    try:
        async with database.engine.begin() as conn:
            for drop in DROP_TRIGGERS[backend] + DROP_BLOB_TRIGGERS[backend]:
                await conn.exec_driver_sql(drop)
            await attack(conn, backend)
    finally:
        await database.dispose()


async def _first_request_blob(url: str) -> str:
    database = open_database(url, null_pool=True)
    try:
        report = await verify_ledger(database)
        assert report.ok, report
        async with database.engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT payload FROM ledger_events WHERE type = 'call.started' ORDER BY position")
            )
            digest: str = next(msgspec.json.decode(p)["request_blob"] for (p,) in rows)
            return digest
    finally:
        await database.dispose()


def _create_pg(admin: str, template: str | None = None) -> str:
    name = f"ledger_t_{uuid.uuid4().hex[:12]}"
    clause = f' TEMPLATE "{template}"' if template else ""
    asyncio.run(_pg_admin(f'CREATE DATABASE "{name}"{clause}', admin))
    return make_url(admin).set(database=name).render_as_string(hide_password=False)


def _drop_pg(admin: str, url: str) -> None:
    asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)', admin))
