"""Secrets: API keys (in headers and in the query string) and bearer tokens never reach the database,
the spool or the logs; their fingerprints are keyed by the installation's key file (0600, outside
the database); the admin API refuses requests without its token and survives schemathesis with it.

Scanned: the raw bytes of the SQLite file and its WAL, every blob decompressed, the spool file
while it holds an outage's events (SQLite made immutable with `chattr +i` for that part), and the
gateway's stdout+stderr. On PostgreSQL every row of every ledger table is dumped as text. The
fingerprint key itself is among the needles: it must not be in any of them either.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
from pathlib import Path

import asyncpg
import httpx
import pytest
import zstandard
from sqlalchemy.engine import make_url

from tests.gateway import processes
from tests.gateway.processes import Process
from tests.reliability.helpers import Ledger, chat_body, raw_call, read_ledger
from usage_ledger.gateway.fingerprint_key import DEFAULT_KEY_FILE_NAME, FingerprintKey

pytestmark = pytest.mark.slow

SECRETS = {
    "authorization": "Bearer sk-live-5ecretB3arerT0ken0123456789abcdef",
    "api-key": "azure-k3y-7f3b9c1d2e4a5b6c7d8e9f00",
    "x-api-key": "anthr0pic-k3y-00aa11bb22cc33dd44ee",
}
QUERY_SECRET = "sk-qu3ry-k3y-5a4b3c2d1e0f9a8b7c6d"
QUERY = {"api_key": QUERY_SECRET, "api-version": "2024-06-01"}
"""Sent as `?api_key=…&api-version=2024-06-01` on every call."""
ADMIN_TOKEN = "adm1n-t0ken-9f8e7d6c5b4a"
NEEDLES = [s.split()[-1].encode() for s in SECRETS.values()] + [ADMIN_TOKEN.encode(), QUERY_SECRET.encode()]


def _leaks(data: bytes, *extra: bytes) -> list[bytes]:
    return [needle for needle in [*NEEDLES, *extra] if needle in data]


async def _calls(url: str, n: int, tag: str, headers: dict[str, str] | None = None) -> None:
    async with httpx.AsyncClient(timeout=30, params=QUERY) as http:
        outcomes = await asyncio.gather(
            *(
                raw_call(http, url, chat_body(f"{tag} {i}", max_tokens=8, stream=i % 2 == 0), SECRETS | (headers or {}))
                for i in range(n)
            )
        )
    assert all(o.status == 200 and o.complete for o in outcomes)


def _installation_key(directory: Path) -> tuple[FingerprintKey, list[bytes]]:
    """The key file `ledger serve` created beside its spool (checked 0600), and its forms to scan for."""
    path = directory / DEFAULT_KEY_FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_bytes().strip()
    raw = bytes.fromhex(text.decode())
    return FingerprintKey(raw), [text, raw]


def _assert_keyed(ledger: Ledger, key: FingerprintKey) -> None:
    """Every recorded secret is the installation key's fingerprint; everything else of the query is as sent."""
    expected_query = f"api_key={key.fingerprint(QUERY_SECRET.encode())}&api-version=2024-06-01"
    for started in ledger.started.values():
        assert started.query == expected_query
        recorded = dict(started.request_headers)
        assert {name: recorded[name] for name in SECRETS} == {
            name: key.fingerprint(value.encode()) for name, value in SECRETS.items()
        }


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
    # the recorded headers and query hold fingerprints under this installation's key
    key, key_forms = _installation_key(tmp_path)
    _assert_keyed(ledger, key)
    scanned = {"db": db_file.read_bytes(), "spool": spooled, "log": gw.log_path.read_bytes()}
    wal = db_file.with_name("ledger.db-wal")
    if wal.exists():
        scanned["wal"] = wal.read_bytes()
    scanned["blobs"] = b"".join(_blob_contents_sqlite(db_file))
    leaks = {name: _leaks(data, *key_forms) for name, data in scanned.items()}
    assert {name: found for name, found in leaks.items() if found} == {}
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
    key, key_forms = _installation_key(tmp_path)
    _assert_keyed(await read_ledger(fresh_pg_url), key)
    assert _leaks(dump, *key_forms) == [] and _leaks(b"".join(blobs), *key_forms) == []
    assert _leaks(gw.log_path.read_bytes(), *key_forms) == []
    print(f"\nSECRETS postgresql: tables={len(tables)} dumped bytes={len(dump)} blobs={len(blobs)} leaks=0")


async def test_admin_api_needs_the_token_and_survives_schemathesis(
    emulator: Process, backend_url: str, tmp_path: Path
) -> None:
    """Every check of schemathesis (no 5xx, status codes, content types and bodies as the schema says),
    on both backends: NUL bytes and huge numbers in parameters reach PostgreSQL only through the rule."""
    db_url = backend_url
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
                "all",
                "--generation-allow-x00",
                "true",
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


async def test_fingerprints_are_keyed_per_installation(emulator: Process, backend_url: str, tmp_path: Path) -> None:
    """One database, three gateways in turn: A and B each create their own key file; C is A's replica
    (LEDGER_FINGERPRINT_KEY_FILE = A's file). The same secrets: A and C agree, B differs. A configured
    key file that is missing stops `ledger serve` with exit 2, and nothing is created in its place."""
    processes.upgrade(backend_url)
    shared = tmp_path / "a" / DEFAULT_KEY_FILE_NAME
    logs = b""
    for name, env in (("a", {}), ("b", {}), ("c", {"LEDGER_FINGERPRINT_KEY_FILE": str(shared)})):
        (tmp_path / name).mkdir()
        gw = processes.gateway(tmp_path / name, emulator.url, backend_url, env=env)  # type: ignore[attr-defined]
        await asyncio.to_thread(gw.start)
        try:
            await _calls(gw.url, 2, name, {"x-ledger-run": name})  # type: ignore[attr-defined]
        finally:
            await asyncio.to_thread(gw.stop)
        logs += gw.log_path.read_bytes()
    assert not (tmp_path / "c" / DEFAULT_KEY_FILE_NAME).exists()  # the replica used the configured file
    ledger = await read_ledger(backend_url)
    by_run = {
        run: {
            (s.query, *(dict(s.request_headers)[h] for h in SECRETS)) for s in ledger.started.values() if s.run == run
        }
        for run in ("a", "b", "c")
    }
    assert all(len(recorded) == 1 for recorded in by_run.values()), by_run  # equal secrets, equal fingerprints
    assert by_run["a"] == by_run["c"] != by_run["b"]
    (key_a, forms_a), (key_b, forms_b) = _installation_key(tmp_path / "a"), _installation_key(tmp_path / "b")
    assert key_a.key_id != key_b.key_id
    assert _leaks(logs, *forms_a, *forms_b) == [] and key_a.key_id.encode() in logs  # logs name the key, never show it
    _assert_keyed(Ledger([], [], started={k: s for k, s in ledger.started.items() if s.run != "b"}), key_a)
    _assert_keyed(Ledger([], [], started={k: s for k, s in ledger.started.items() if s.run == "b"}), key_b)

    missing = tmp_path / "unmounted" / "fingerprint.key"
    gw = processes.gateway(tmp_path, emulator.url, backend_url)  # type: ignore[attr-defined]
    result = await asyncio.to_thread(
        subprocess.run,
        gw.args,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LEDGER_FINGERPRINT_KEY_FILE": str(missing)},
    )
    assert result.returncode == 2, result.stderr
    assert f"LEDGER_FINGERPRINT_KEY_FILE={missing}: no such file" in result.stderr
    assert "Traceback" not in result.stderr and not missing.parent.exists()
    assert not (tmp_path / DEFAULT_KEY_FILE_NAME).exists()  # no silent fallback to a default key
    print(f"\nKEYED {backend_url.split(':')[0]}: key ids a={key_a.key_id} b={key_b.key_id}; replica c agrees with a")
