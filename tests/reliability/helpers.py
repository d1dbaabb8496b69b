"""Shared helpers of the reliability suite: ledger contents, process figures, raw streaming calls.

Process starters and the PostgreSQL relay are reused from `tests.gateway` (processes.py, test_faults.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec

from tests._required import unavailable
from tests.gateway import processes
from usage_ledger.ledger.blobs import read_blob
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.events import CallFailed, CallFinished, CallStarted, Event
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.verify import verify_chain

MODEL = "emulator-moe"


@dataclass
class Ledger:
    """What one database holds, by call id."""

    events: list[Event]
    event_ids: list[str]
    started: dict[str, CallStarted] = field(default_factory=dict)
    finished: dict[str, CallFinished] = field(default_factory=dict)
    failed: dict[str, CallFailed] = field(default_factory=dict)

    @property
    def incomplete(self) -> set[str]:
        return set(self.started) - set(self.finished) - set(self.failed)


async def read_ledger(db_url: str) -> Ledger:
    database = open_database(db_url, null_pool=True)
    try:
        stored = [e async for e in iter_events(database)]
    finally:
        await database.dispose()
    ledger = Ledger(events=[s.body() for s in stored], event_ids=[str(s.event_id) for s in stored])
    for event in ledger.events:
        if isinstance(event, CallStarted):
            assert event.call_id not in ledger.started, f"call.started twice for {event.call_id}"
            ledger.started[event.call_id] = event
        elif isinstance(event, CallFinished):
            assert event.call_id not in ledger.finished, f"call.finished twice for {event.call_id}"
            ledger.finished[event.call_id] = event
        elif isinstance(event, CallFailed):
            assert event.call_id not in ledger.failed, f"call.failed twice for {event.call_id}"
            ledger.failed[event.call_id] = event
    return ledger


async def read_blobs(db_url: str, digests: list[str]) -> dict[str, bytes]:
    database = open_database(db_url, null_pool=True)
    try:
        async with database.engine.connect() as conn:
            return {d: await read_blob(conn, d) for d in digests}
    finally:
        await database.dispose()


async def ledger_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, [processes.LEDGER, *args], capture_output=True, text=True)


async def verify_fast(db_url: str) -> int:
    """The check of `ledger verify`, in-process (no interpreter start-up); returns the number of events checked."""
    database = open_database(db_url, null_pool=True)
    try:
        report = await verify_chain(database)
    finally:
        await database.dispose()
    assert report.ok, report
    return report.checked


async def runs_report(db_url: str, run: str) -> list[dict[str, object]]:
    result = await ledger_cli("report", "runs", "--db", db_url, "--run", run, "--format", "json")
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, object]] = msgspec.json.decode(result.stdout)
    return rows


def proc_figures(pid: int) -> tuple[int, int]:
    """(resident set size in bytes, open file descriptors) of a live process, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        rss_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return rss_kb * 1024, len(os.listdir(f"/proc/{pid}/fd"))


def chat_body(content: str, *, max_tokens: int, stream: bool, include_usage: bool = True, **extra: object) -> bytes:
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }
    if stream and include_usage:
        body["stream_options"] = {"include_usage": True}
    return msgspec.json.encode(body)


@dataclass
class Outcome:
    """What the client saw of one call."""

    call_id: str | None = None
    status: int | None = None
    body: bytes = b""
    complete: bool = False
    error: str | None = None


async def raw_call(http: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str] | None = None) -> Outcome:
    """POST and read the whole response; `complete` only if every byte arrived (a stream up to `[DONE]`)."""
    outcome = Outcome()
    try:
        async with http.stream(
            "POST",
            url + "/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json", **(headers or {})},
        ) as response:
            outcome.status = response.status_code
            outcome.call_id = response.headers.get("x-ledger-call-id")
            async for chunk in response.aiter_raw():
                outcome.body += chunk
        stream = b'"stream":true' in body
        outcome.complete = outcome.body.rstrip().endswith(b"data: [DONE]") if stream else True
    except httpx.HTTPError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    return outcome


class CannotMount(RuntimeError):
    """A tmpfs could not be mounted here (not root, no CAP_SYS_ADMIN, a sandbox)."""


@contextlib.contextmanager
def mounted_tmpfs(directory: Path, size: str) -> Iterator[Path]:
    """A `size` tmpfs mounted at `directory` (a disk that fills up), unmounted on exit; raises `CannotMount`."""
    directory.mkdir(exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True
    )
    if mounted.returncode != 0:
        raise CannotMount(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip() or mounted.returncode}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True)


@contextlib.contextmanager
def tmpfs(directory: Path, size: str) -> Iterator[Path]:
    """`mounted_tmpfs` for a test: where mounting is not permitted it skips, or fails under CI."""
    try:
        with mounted_tmpfs(directory, size) as mounted:
            yield mounted
    except CannotMount as exc:
        unavailable(str(exc))
