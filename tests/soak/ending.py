"""The soak's end: catching up, the upstream's own token log, `ledger verify`, the gateway's own account
of calls it could not record, and a copy of a SQLite ledger before its tmpfs goes."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from pathlib import Path

import httpx
import msgspec

from tests.projections.helpers import projection_digests, projection_lag
from tests.reliability.helpers import ledger_cli
from usage_ledger.ledger.db import open_database

__all__ = ("backup", "caught_up", "digests", "unrecorded_ends", "upstream_log", "verify")

_CATCH_UP_S = 120.0


async def caught_up(url: str, db_url: str) -> list[str]:
    """Waits until the spool is empty and every projection is at the head; what did not happen in time."""
    deadline = time.monotonic() + _CATCH_UP_S
    async with httpx.AsyncClient(timeout=5) as http:
        while (health := (await http.get(url + "/_ledger/health")).json())["spooling"] or health["spool_bytes"]:
            if time.monotonic() > deadline:
                return [f"stuck: the spool never drained ({health})"]
            await asyncio.sleep(0.5)
    database = open_database(db_url, null_pool=True)
    try:
        while True:
            head, at = await projection_lag(database)
            if all(position == head for position in at.values()):
                return []
            if time.monotonic() > deadline:
                return [f"stuck: projections at {at}, head {head}"]
            await asyncio.sleep(0.5)
    finally:
        await database.dispose()


async def digests(db_url: str) -> dict[str, str]:
    database = open_database(db_url, null_pool=True)
    try:
        return await projection_digests(database)
    finally:
        await database.dispose()


async def upstream_log(emulator_url: str) -> dict[str, tuple[int, int]]:
    async with httpx.AsyncClient(timeout=30) as http:
        records = (await http.get(emulator_url + "/emulator/requests")).json()
    # the gateway records vLLM's x-request-id: the response id without its `chatcmpl-` / `cmpl-`
    return {r["request_id"].partition("-")[2]: (r["prompt_tokens"], r["completion_tokens"]) for r in records}


async def verify(db_url: str, checkpoints: Path, pubkey: Path) -> tuple[list[str], int]:
    """`ledger verify` with the checkpoints: what failed, and the blobs no event references.

    Those are counted apart: on PostgreSQL a body is committed before its event, in its own transaction
    (docs/scaling.md), so a kill or an end durable nowhere between the two leaves one (docs/RELIABILITY.md,
    Randomized fault soak). The chain, the checkpoints and every other blob rule must hold."""
    args = ["--db", db_url, "--checkpoint", str(checkpoints), "--pubkey", str(pubkey), "--format", "json"]
    done = await ledger_cli("verify", *args)
    try:
        report = msgspec.json.decode(done.stdout)
    except msgspec.DecodeError:
        return [f"ledger verify exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}"], 0
    blobs = report.get("blobs") or {}
    failed = [f"ledger verify: checkpoint {c}" for c in report.get("checkpoints", []) if not c["ok"]]
    if not report["chain_ok"]:
        failed.append(f"ledger verify: the chain: {report.get('problem')}")
    if not report.get("checkpoints"):
        failed.append("ledger verify: no checkpoint was written")
    if blobs.get("problems_total", 0):
        failed.append(f"ledger verify: blobs {blobs}")
    return failed, int(blobs.get("unreferenced", 0))


def unrecorded_ends(work: Path) -> set[str]:
    """Calls whose final event the gateway could make durable nowhere (its `call_record_failed` log lines)."""
    found = set()
    for log in work.glob("gateway-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if '"call_record_failed"' in line and '"call_id"' in line:
                found.add(msgspec.json.decode(line)["call_id"])
    return found


def backup(source: Path, target: Path) -> None:
    with contextlib.closing(sqlite3.connect(source)) as src, contextlib.closing(sqlite3.connect(target)) as dst:
        src.backup(dst)
