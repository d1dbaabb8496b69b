"""The demo's processes: per box an emulator and a real gateway in front of it, and the batches sent through them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import httpx
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from usage_ledger.demo.plan import Box, DemoRun, Profile
from usage_ledger.processes import free_port, start_child
from usage_ledger.workload import TICKERS, run_workload

__all__ = ("Batch", "Station", "drive_all", "start_station", "wait_forever")


class Station(msgspec.Struct, frozen=True):
    """One box's emulator and the gateway that records its calls."""

    profile: Profile
    emulator_url: str
    gateway_url: str


class Batch(msgspec.Struct, frozen=True):
    """A run to send through a station: the box's tickers, and the requests' sampling seed."""

    station: Station
    box: Box
    run: str
    seed: int


async def start_station(
    url: str, work: Path, speed: float, profile: Profile, children: contextlib.AsyncExitStack, *, keep_running: bool
) -> Station:
    """The emulator (answers open with a grade line) and `ledger serve` in front of it, stopped with `children`."""
    emulator_port, gateway_port = free_port(), free_port()
    emulator_url = f"http://127.0.0.1:{emulator_port}"
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    emulator = await start_child(
        f"emulator-{profile.name}",
        [
            "-m",
            "usage_ledger.emulator",
            "--port",
            str(emulator_port),
            "--profile",
            profile.name,
            "--speed",
            f"{speed:.3f}",
            "--model",
            profile.model,
            "--grade-line",
            "--log-level",
            "warning",
        ],
        f"{emulator_url}/health",
        work,
    )
    children.push_async_callback(emulator.stop)
    gateway = await start_child(
        f"gateway-{profile.name}",
        [
            "-m",
            "usage_ledger.cli",
            "serve",
            "--upstream",
            emulator_url,
            "--port",
            str(gateway_port),
            "--db",
            url,
            "--spool-dir",
            str(work / f"spool-{profile.name}"),
            # the demo folds the events once at the end: a follower per gateway would take the CPU the
            # emulators' clocks need (left running, the dashboard wants one)
            *(() if keep_running else ("--no-projections",)),
        ],
        f"{gateway_url}/_ledger/health",
        work,
    )
    children.push_async_callback(gateway.stop)
    return Station(profile, emulator_url, gateway_url)


async def drive_all(batches: list[Batch], steps: int, console: Console) -> list[DemoRun]:
    """Send the batches at once (one per box), each at its box's concurrency, with a progress bar each."""
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        # Streams carry no usage to the client (the gateway hides the chunk it asked for): their chunks are
        # counted apart, never added to the tokens (a chunk can hold several tokens).
        TextColumn("{task.fields[tokens]:,} tokens + {task.fields[chunks]:,} stream chunks"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:

        async def drive(batch: Batch) -> DemoRun:
            station, profile = batch.station, batch.box.profile
            tickers = list(TICKERS[: batch.box.tickers])
            task = progress.add_task(
                f"{batch.run} ({profile.concurrency} in flight)", total=len(tickers) * steps, tokens=0, chunks=0
            )
            tokens = chunks = 0

            def on_call(completion_tokens: int, stream_chunks: int) -> None:
                nonlocal tokens, chunks
                tokens += completion_tokens
                chunks += stream_chunks
                progress.update(task, advance=1, tokens=tokens, chunks=chunks)

            emulated_start, real_start = await _clock(station.emulator_url), time.monotonic()
            result = await run_workload(
                station.gateway_url,
                run=batch.run,
                tickers=tickers,
                steps=steps,
                concurrency=profile.concurrency,
                model=profile.model,
                seed=batch.seed,
                on_call=on_call,
            )
            emulated_end, real_end = await _clock(station.emulator_url), time.monotonic()
            return DemoRun(
                run=batch.run,
                profile=profile,
                tickers=len(tickers),
                result=result,
                wall_s=real_end - real_start,
                emulated_s=emulated_end - emulated_start,
            )

        return list(await asyncio.gather(*(drive(batch) for batch in batches)))


async def _clock(emulator_url: str) -> float:
    async with httpx.AsyncClient() as client:
        now: float = (await client.get(f"{emulator_url}/emulator/clock")).json()["now"]
        return now


async def wait_forever() -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.Event().wait()
