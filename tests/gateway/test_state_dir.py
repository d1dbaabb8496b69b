"""`ledger serve` keeps its state in one directory (issue #39): the spool and the keys beside a SQLite ledger
(`<name>-state/`) or in `LEDGER_STATE_DIR`, nothing in the working directory, nothing at all when the port is
busy, and what an older gateway left in the working directory taken in, never orphaned."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import struct
import subprocess
import time
import zlib
from pathlib import Path

import httpx
import msgspec

from tests.gateway import processes
from tests.gateway.processes import LEDGER, free_port
from tests.ledger.helpers import call_events
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.spool import SpoolRecord

DEAD_UPSTREAM = "http://127.0.0.1:9"


def _serve(
    cwd: Path, db_url: str, port: int, env: dict[str, str] | None = None, *extra: str
) -> subprocess.Popen[bytes]:
    args = [LEDGER, "serve", "--upstream", DEAD_UPSTREAM, "--port", str(port), "--db", db_url, *extra]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_") or k.startswith("LEDGER_TEST_")}
    log = cwd.parent / f"serve-{port}.log"  # outside the directory whose files are checked
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args,
            cwd=cwd,
            env={**clean, "LEDGER_LOG_FORMAT": "json", "LEDGER_SERVER_SAMPLE_S": "0", **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    proc.log = log  # type: ignore[attr-defined]
    return proc


def _output(proc: subprocess.Popen[bytes]) -> str:
    return str(proc.log.read_text())  # type: ignore[attr-defined]


def _until_up(proc: subprocess.Popen[bytes], port: int) -> None:
    """Until the start-up line is written (the signal handlers are in place by then)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, _output(proc)
        if '"gateway_listening"' in _output(proc):
            httpx.get(f"http://127.0.0.1:{port}/_ledger/health", timeout=5)
            return
        time.sleep(0.1)
    raise AssertionError("ledger serve did not start:\n" + _output(proc))


def _stop(proc: subprocess.Popen[bytes]) -> str:
    proc.terminate()
    proc.wait(timeout=60)
    return _output(proc)


def _files(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*")}


def test_a_busy_port_stops_the_start_and_creates_nothing(tmp_path: Path) -> None:
    cwd, data = tmp_path / "cwd", tmp_path / "data"
    cwd.mkdir()
    data.mkdir()
    db_url = f"sqlite:///{data / 'ledger.db'}"
    processes.upgrade(db_url)
    before = _files(data)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _serve(cwd, db_url, port)
        proc.wait(timeout=60)
        out = _output(proc)
    assert proc.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in out, out
    assert _files(cwd) == set() and _files(data) == before  # no key, no spool, no state directory


def test_the_state_sits_beside_a_sqlite_ledger_and_the_start_line_says_where(tmp_path: Path) -> None:
    cwd, data = tmp_path / "cwd", tmp_path / "data"
    cwd.mkdir()
    data.mkdir()
    db_url = f"sqlite:///{data / 'ledger.db'}"
    processes.upgrade(db_url)
    port = free_port()
    proc = _serve(cwd, db_url, port)
    _until_up(proc, port)
    out = _stop(proc)
    state = data / "ledger-state"
    assert {"ledger-fingerprint.key", "ledger-spool.key", "spool", "spool/events.spool"} <= _files(state)
    assert _files(cwd) == set(), _files(cwd)
    listening = next(msgspec.json.decode(line) for line in out.splitlines() if '"gateway_listening"' in line)
    assert listening["state_dir"] == str(state) and listening["spool"] == str(state / "spool")
    assert listening["fingerprint_key"] == str(state / "ledger-fingerprint.key")
    for where, env in (("by-env", {"LEDGER_STATE_DIR": str(tmp_path / "by-env")}), ("by-flag", None)):
        port = free_port()
        proc = _serve(cwd, db_url, port, env, *([] if env else ["--state-dir", str(tmp_path / where)]))
        _until_up(proc, port)
        _stop(proc)
        assert (tmp_path / where / "spool" / "events.spool").exists() and _files(cwd) == set()


async def test_an_older_gateways_key_and_unreplayed_spool_are_taken_in_and_unkeyed_records_kept_aside(
    tmp_path: Path,
) -> None:
    cwd, data = tmp_path / "cwd", tmp_path / "data"
    cwd.mkdir()
    data.mkdir()
    db_url = f"sqlite:///{data / 'ledger.db'}"
    processes.upgrade(db_url)
    key = secrets.token_hex(32) + "\n"
    (cwd / "ledger-fingerprint.key").write_text(key)
    (cwd / "ledger-fingerprint.key").chmod(0o600)
    (cwd / "ledger-spool").mkdir()
    body = msgspec.msgpack.encode(SpoolRecord(events=call_events(1)))  # as older gateways wrote it: not keyed
    (cwd / "ledger-spool" / "events.spool").write_bytes(struct.pack(">II", len(body), zlib.crc32(body)) + body)
    port = free_port()
    proc = _serve(cwd, db_url, port)
    _until_up(proc, port)
    out = _stop(proc)
    state = data / "ledger-state"
    assert (state / "ledger-fingerprint.key").read_text() == key
    assert _files(cwd) == set(), _files(cwd)
    assert '"fingerprint_key_moved"' in out and '"spool_moved"' in out
    # unkeyed, as anyone could forge it without the key: quarantined on start, never replayed by the gateway
    quarantined = next(msgspec.json.decode(line) for line in out.splitlines() if '"spool_region_quarantined"' in line)
    assert "--accept-unkeyed" in quarantined["reason"] and await _streams(db_url) == set()
    (side,) = [p for p in (state / "spool").iterdir() if p.name.startswith("events.spool.quarantine-")]
    # the operator's way: the side file replayed by name (docs/operations.md)
    (tmp_path / "unkeyed" / "spool").mkdir(parents=True)
    side.rename(tmp_path / "unkeyed" / "spool" / "events.spool")
    replay = [LEDGER, "spool", "replay", "--db", db_url, "--spool-dir", str(tmp_path / "unkeyed" / "spool")]
    refused = await asyncio.to_thread(subprocess.run, replay, capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and "--accept-unkeyed" in refused.stderr and "Traceback" not in refused.stderr
    accepted = await asyncio.to_thread(
        subprocess.run, [*replay, "--accept-unkeyed"], capture_output=True, text=True, check=False
    )
    assert accepted.returncode == 0 and "2 events appended" in accepted.stdout, accepted.stderr
    assert "spool_unkeyed_records_replayed" in accepted.stdout
    assert await _streams(db_url) == {e.stream for e in call_events(1)}


async def _streams(db_url: str) -> set[str]:
    database = open_database(db_url)
    try:
        return {e.stream async for e in iter_events(database)}
    finally:
        await database.dispose()
