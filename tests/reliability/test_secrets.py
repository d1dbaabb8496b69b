"""Secrets: API keys and bearer tokens never reach the database, the spool or the logs; the admin API
refuses requests without its token and survives schemathesis (no 5xx) with it.

Scanned: the raw bytes of the SQLite file and its WAL, every blob decompressed, the spool file
while it holds an outage's events (SQLite made immutable with `chattr +i` for that part), and the
gateway's stdout+stderr. On PostgreSQL every row of every ledger table is dumped as text.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import asyncpg
import httpx
import pytest
import zstandard
from sqlalchemy.engine import make_url

from tests.gateway import processes
from tests.gateway.processes import Process
from tests.reliability.helpers import chat_body, raw_call, read_ledger

pytestmark = pytest.mark.slow

SECRETS = {
    "authorization": "Bearer sk-live-5ecretB3arerT0ken0123456789abcdef",
    "api-key": "azure-k3y-7f3b9c1d2e4a5b6c7d8e9f00",
    "x-api-key": "anthr0pic-k3y-00aa11bb22cc33dd44ee",
}
ADMIN_TOKEN = "adm1n-t0ken-9f8e7d6c5b4a"
NEEDLES = [s.split()[-1].encode() for s in SECRETS.values()] + [ADMIN_TOKEN.encode()]


def _leaks(data: bytes) -> list[bytes]:
    return [needle for needle in NEEDLES if needle in data]


async def _calls(url: str, n: int, tag: str) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        outcomes = await asyncio.gather(
            *(raw_call(http, url, chat_body(f"{tag} {i}", max_tokens=8, stream=i % 2 == 0), SECRETS) for i in range(n))
        )
    assert all(o.status == 200 and o.complete for o in outcomes)


def _gateway(tmp_path: Path, emulator: Process, db_url: str) -> Process:
    gw = processes.gateway(tmp_path, emulator.url, db_url)  # type: ignore[attr-defined]
    gw.env["LEDGER_ADMIN_TOKEN"] = ADMIN_TOKEN
    gw.env["LEDGER_LOG_LEVEL"] = "debug"  # the most talkative logs must not leak either
    return gw


def _chattr(flag: str, *files: Path) -> int:
    return subprocess.run(["chattr", flag, *map(str, files)], capture_output=True).returncode


async def test_no_secret_in_sqlite_spool_or_logs(emulator: Process, tmp_path: Path) -> None:
    db_file = tmp_path / "ledger.db"
    db_url = f"sqlite:///{db_file}"
    processes.upgrade(db_url)
    gw = _gateway(tmp_path, emulator, db_url)
    await asyncio.to_thread(gw.start)
    files = [db_file, db_file.with_name("ledger.db-wal")]
    spool = tmp_path / "spool" / "events.spool"
    spooled = b""
    try:
        await _calls(gw.url, 20, "before")  # type: ignore[attr-defined]
        if await asyncio.to_thread(_chattr, "+i", *files) == 0:
            try:
                await _calls(gw.url, 10, "outage")  # type: ignore[attr-defined]
                spooled = spool.read_bytes()
            finally:
                await asyncio.to_thread(_chattr, "-i", *files)
            await _calls(gw.url, 4, "after")  # type: ignore[attr-defined]
    finally:
        await asyncio.to_thread(gw.stop)
    ledger = await read_ledger(db_url)
    # a clean shutdown with the database back drains the spool (a shutdown within the writer's
    # retry interval once left the outage's events in the spool until the next start)
    assert spool.stat().st_size == 0
    assert len(ledger.finished) == (34 if spooled else 20)
    # the recorded headers hold fingerprints, and the upstream did get the real values
    started = next(iter(ledger.started.values()))
    recorded = dict(started.request_headers)
    assert all(recorded[name].startswith("sha256:") for name in SECRETS)
    scanned = {"db": db_file.read_bytes(), "spool": spooled, "log": gw.log_path.read_bytes()}
    wal = db_file.with_name("ledger.db-wal")
    if wal.exists():
        scanned["wal"] = wal.read_bytes()
    scanned["blobs"] = b"".join(_blob_contents_sqlite(db_file))
    assert {name: _leaks(data) for name, data in scanned.items() if _leaks(data)} == {}
    assert not spooled or len(spooled) > 1000, "the outage part did not spool"
    print(f"\nSECRETS sqlite: scanned bytes={ {k: len(v) for k, v in scanned.items()} } leaks=0")


def _blob_contents_sqlite(db_file: Path) -> list[bytes]:
    import sqlite3

    conn = sqlite3.connect(db_file)
    try:
        rows = conn.execute("SELECT codec, content FROM ledger_blobs WHERE content IS NOT NULL").fetchall()
    finally:
        conn.close()
    return [_decompress(codec, content) for codec, content in rows]


def _decompress(codec: str, content: bytes) -> bytes:
    if codec == "zstd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(content)
    return bytes(content)


async def test_no_secret_in_postgresql(emulator: Process, fresh_pg_url: str, tmp_path: Path) -> None:
    processes.upgrade(fresh_pg_url)
    gw = _gateway(tmp_path, emulator, fresh_pg_url)
    await asyncio.to_thread(gw.start)
    try:
        await _calls(gw.url, 20, "pg")  # type: ignore[attr-defined]
    finally:
        await asyncio.to_thread(gw.stop)
    url = make_url(fresh_pg_url)
    conn = await asyncpg.connect(
        host=url.host, port=url.port or 5432, user=url.username, password=url.password, database=url.database
    )
    try:
        tables = [r[0] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        dump = b""
        for table in tables:
            dump += b"".join(str(row[0]).encode() for row in await conn.fetch(f'SELECT t::text FROM "{table}" t'))
        blobs = [
            _decompress(r[0], r[1])
            for r in await conn.fetch("SELECT codec, content FROM ledger_blobs WHERE content IS NOT NULL")
        ]
    finally:
        await conn.close()
    assert len(dump) > 10_000 and "ledger_events" in tables
    assert _leaks(dump) == [] and _leaks(b"".join(blobs)) == [] and _leaks(gw.log_path.read_bytes()) == []
    print(f"\nSECRETS postgresql: tables={len(tables)} dumped bytes={len(dump)} blobs={len(blobs)} leaks=0")


async def test_admin_api_needs_the_token_and_survives_schemathesis(emulator: Process, tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    processes.upgrade(db_url)
    gw = _gateway(tmp_path, emulator, db_url)
    await asyncio.to_thread(gw.start)
    base: str = gw.url  # type: ignore[attr-defined]
    try:
        await _calls(base, 2, "admin")
        call_id = next(iter((await read_ledger(db_url)).started))
        guarded = ["/_ledger/metrics", "/_ledger/api/schema/openapi.json", f"/_ledger/api/calls/{call_id}/events"]
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            assert (await http.get("/_ledger/health")).status_code == 200
            for path in guarded:
                for auth in ({}, {"authorization": "Bearer wrong"}, {"authorization": ADMIN_TOKEN}):
                    resp = await http.get(path, headers=auth)
                    assert resp.status_code == 401, (path, auth, resp.status_code)
                    assert call_id not in resp.text
                resp = await http.get(path, headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
                assert resp.status_code == 200, (path, resp.status_code)
        result = await asyncio.to_thread(
            subprocess.run,
            [
                str(Path(processes.LEDGER).parent / "st"),
                "run",
                f"{base}/_ledger/api/schema/openapi.json",
                "--url",
                base,
                "-H",
                f"Authorization: Bearer {ADMIN_TOKEN}",
                "--checks",
                "not_a_server_error",
                "--max-examples",
                "25",
                "--seed",
                "1",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,  # schemathesis keeps a .schemathesis/ cache in its working directory
            env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        print("\nSCHEMATHESIS:", " ".join(result.stdout.split()[-40:]))
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            assert (await http.get("/_ledger/health")).json()["status"] == "ok"
    finally:
        await asyncio.to_thread(gw.stop)
    assert _leaks(gw.log_path.read_bytes()) == []
