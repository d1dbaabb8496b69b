"""`ledger demo`: the emulator, the gateway and a seed-shaped batch, then the reports.

Two runs of `tickers × steps` calls, one per box and both at once, go through two real gateways
into one embedded SQLite ledger: the `moe` profile with 14 calls in flight, `dense` with 3. Each
emulator's clock runs fast enough that its batch (scaled from the seed's real duration) takes
about `--seconds`, so the ledger records compressed wall-clock time; the demo reads the
emulators' clocks to show what the same runs took in emulated GPU time.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.migrate import upgrade_database
from usage_ledger.ledger.verify import verify_chain
from usage_ledger.processes import free_port, start_child
from usage_ledger.projections.engine import catch_up_all
from usage_ledger.projections.eras import EraRow, eras_report
from usage_ledger.projections.reports import daily_report, runs_report, tickers_report
from usage_ledger.projections.rows import DailyRow, RunRow, TickerRow
from usage_ledger.workload import TICKERS, WorkloadResult, run_workload

__all__ = ("DemoOptions", "DemoRun", "run_demo")


class DemoOptions(msgspec.Struct, frozen=True, kw_only=True):
    db_path: Path
    tickers: int = 100
    steps: int = 17
    seconds: float = 45.0
    tz: str = "Asia/Seoul"
    keep_running: bool = False


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    """One of the user's two boxes (DESIGN §7): the emulator profile and the seed's measurement."""

    name: str
    model: str
    concurrency: int
    seed_seconds: float  # the seed's 1,700-call run took this long on the real GPU
    seed_result: str


SEED_CALLS = 1700
PLAN = (
    Profile(name="moe", model="qwen3-30b-a3b-moe", concurrency=14, seed_seconds=2741.0, seed_result="911 t/s, 46 min"),
    Profile(
        name="dense", model="qwen3-27b-dense", concurrency=3, seed_seconds=22680.0, seed_result="118 t/s, 6 h 18 min"
    ),
)


class DemoRun(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    profile: Profile
    result: WorkloadResult
    wall_s: float
    emulated_s: float

    @property
    def effective_speed(self) -> float:
        return self.emulated_s / self.wall_s if self.wall_s > 0 else 1.0


class _Station(msgspec.Struct, frozen=True):
    profile: Profile
    run: str
    emulator_url: str
    gateway_url: str


async def run_demo(options: DemoOptions, console: Console) -> int:
    for suffix in ("", "-wal", "-shm"):  # a fresh demo ledger each time
        await asyncio.to_thread(Path(f"{options.db_path}{suffix}").unlink, missing_ok=True)
    url = f"sqlite:///{options.db_path}"
    database = open_database(url)
    await upgrade_database(database)
    tickers = list(TICKERS[: options.tickers])
    stamp = time.strftime("%Y%m%d-%H%M")
    with tempfile.TemporaryDirectory(prefix="ledger-demo-") as tmp:
        async with contextlib.AsyncExitStack() as children:
            stations = [
                await _start_station(options, url, Path(tmp), profile, f"{profile.name}-{stamp}", children)
                for profile in PLAN
            ]
            console.print(
                f"Replaying {len(tickers)} tickers × {options.steps} calls on each box, both at once, through two "
                f"gateways into {options.db_path.name}; the emulators run ≈{options.seconds:g} s per batch."
            )
            runs = await _drive_all(options, stations, tickers, console)
            if options.keep_running:
                for station in stations:
                    console.print(
                        f"gateway {station.gateway_url} → emulator {station.emulator_url} ({station.profile.name})"
                    )
                console.print("Left running; Ctrl-C to stop.")
                await _wait_forever()
    await catch_up_all(database)
    _print_reports(options, runs, await _reports(database, options.tz), console)
    report = await verify_chain(database)
    await database.dispose()
    if report.ok:
        console.print(f"[green]ledger verify: chain intact[/] ({report.checked} events, head {report.head_hash[:16]}…)")
    else:
        console.print(f"[red]ledger verify: BROKEN at {report.first_bad_position}: {report.problem}[/]")
    console.print(f"\nThe ledger is in [bold]{options.db_path}[/]. Explore it:")
    console.print(
        f"  ledger report runs --db {url} --formula per_call_mean\n  ledger show run {runs[0].run} --db {url}\n"
        f"  ledger compare {' '.join(r.run for r in runs)} --db {url}\n  ledger ui --db {url}"
    )
    return 0 if report.ok else 1


def _speed(options: DemoOptions, profile: Profile, calls: int) -> float:
    """Clock speed-up so the batch's emulated duration (scaled from the seed) takes `seconds`."""
    return max(1.0, profile.seed_seconds * calls / SEED_CALLS / options.seconds)


async def _start_station(
    options: DemoOptions, url: str, work: Path, profile: Profile, run: str, children: contextlib.AsyncExitStack
) -> _Station:
    emulator_port, gateway_port = free_port(), free_port()
    emulator_url = f"http://127.0.0.1:{emulator_port}"
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    speed = _speed(options, profile, options.tickers * options.steps)
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
        ],
        f"{gateway_url}/_ledger/health",
        work,
    )
    children.push_async_callback(gateway.stop)
    return _Station(profile, run, emulator_url, gateway_url)


async def _drive_all(
    options: DemoOptions, stations: list[_Station], tickers: list[str], console: Console
) -> list[DemoRun]:
    total = len(tickers) * options.steps
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tokens]:,} output tokens"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:

        async def drive(station: _Station) -> DemoRun:
            profile = station.profile
            task = progress.add_task(f"{station.run} ({profile.concurrency} in flight)", total=total, tokens=0)
            tokens = 0

            def on_call(completion_tokens: int) -> None:
                nonlocal tokens
                tokens += completion_tokens
                progress.update(task, advance=1, tokens=tokens)

            emulated_start, real_start = await _clock(station.emulator_url), time.monotonic()
            result = await run_workload(
                station.gateway_url,
                run=station.run,
                tickers=tickers,
                steps=options.steps,
                concurrency=profile.concurrency,
                model=profile.model,
                on_call=on_call,
            )
            emulated_end, real_end = await _clock(station.emulator_url), time.monotonic()
            return DemoRun(
                run=station.run,
                profile=profile,
                result=result,
                wall_s=real_end - real_start,
                emulated_s=emulated_end - emulated_start,
            )

        return list(await asyncio.gather(*(drive(station) for station in stations)))


async def _clock(emulator_url: str) -> float:
    async with httpx.AsyncClient() as client:
        now: float = (await client.get(f"{emulator_url}/emulator/clock")).json()["now"]
        return now


async def _wait_forever() -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.Event().wait()


class _Reports(msgspec.Struct, frozen=True):
    aggregate: list[RunRow]
    per_call: list[RunRow]
    tickers: list[TickerRow]
    daily: list[DailyRow]
    daily_utc: list[DailyRow]
    eras: list[EraRow]
    eras_per_call: list[EraRow]


async def _reports(database: Database, tz: str) -> _Reports:
    return _Reports(
        await runs_report(database, formula="batch_aggregate"),
        await runs_report(database, formula="per_call_mean"),
        await tickers_report(database),
        await daily_report(database, tz=tz),
        await daily_report(database, tz="UTC"),
        await eras_report(database, by="model", formula="batch_aggregate", zone=ZoneInfo(tz)),
        await eras_report(database, by="model", formula="per_call_mean", zone=ZoneInfo(tz)),
    )


def _print_reports(options: DemoOptions, runs: list[DemoRun], reports: _Reports, console: Console) -> None:
    by_run = {run.run: run for run in runs}
    recorded = Table(title="Runs, as the ledger recorded them")
    for column in (
        "run",
        "calls",
        "failed",
        "tickers",
        "input tok",
        "output tok",
        "wall s",
        "aggregate t/s",
        "per-call t/s",
    ):
        recorded.add_column(column, justify="left" if column == "run" else "right")
    emulated = Table(title="The same runs in emulated GPU time (the emulators' clocks ran faster than real time)")
    for column in ("run", "clock speed", "wall", "aggregate t/s", "per-call t/s", "seed (real GPU)"):
        emulated.add_column(column, justify="left" if column == "run" else "right")
    for aggregate, per_call in zip(reports.aggregate, reports.per_call, strict=True):
        recorded.add_row(
            aggregate.run,
            f"{aggregate.calls:,}",
            f"{aggregate.failed_calls:,}",
            f"{aggregate.tickers:,}",
            _tokens(aggregate.input_tokens),
            _tokens(aggregate.output_tokens),
            _num(aggregate.wall_s, 1),
            _num(aggregate.throughput_tps, 0),
            _num(per_call.throughput_tps, 0),
        )
        demo = by_run.get(aggregate.run)
        if demo is None or aggregate.wall_s is None:
            continue
        speed = demo.effective_speed
        emulated.add_row(
            aggregate.run,
            f"{speed:,.0f}×",
            _duration(aggregate.wall_s * speed),
            _num(_scaled(aggregate.throughput_tps, speed), 0),
            _num(_scaled(per_call.throughput_tps, speed), 1),
            demo.profile.seed_result,
        )
    console.print(recorded)
    console.print(emulated)
    console.print(
        "Emulated-time numbers fall short of the seed when this machine could not keep the emulators busy:\n"
        "the client's and the gateway's work per call happen in real time while the GPU's is compressed."
    )
    console.print(
        "aggregate = Σ output tokens ÷ (last call end − first call start): what the server delivered.\n"
        "per-call = mean of each call's tokens ÷ its own duration: under continuous batching calls share the GPU,\n"
        "so it describes one request's speed, not the box's throughput (ledger report runs --formula NAME)."
    )
    top = Table(title="Top tickers by output tokens")
    for column in ("run", "ticker", "calls", "input tok", "output tok"):
        top.add_column(column, justify="left" if column in ("run", "ticker") else "right")
    for row in sorted(reports.tickers, key=lambda r: -r.output_tokens)[:8]:
        top.add_row(row.run, row.ticker, str(row.calls), _tokens(row.input_tokens), _tokens(row.output_tokens))
    console.print(top)
    for title, rows in ((f"Daily totals ({options.tz})", reports.daily), ("Daily totals (UTC)", reports.daily_utc)):
        daily = Table(title=title)
        for column in ("day", "calls", "failed", "input tok", "output tok"):
            daily.add_column(column, justify="left" if column == "day" else "right")
        for day in rows:
            daily.add_row(
                day.day,
                f"{day.calls:,}",
                f"{day.failed_calls:,}",
                _tokens(day.input_tokens),
                _tokens(day.output_tokens),
            )
        console.print(daily)
    eras = Table(title="Eras by model (ledger report eras --by model; real time, not scaled)")
    for column in ("model", "runs", "days", "aggregate tok/s", "per-call tok/s", "mean wall"):
        eras.add_column(column, justify="left" if column == "model" else "right")
    per_call_eras = {row.group: row for row in reports.eras_per_call}
    for era in reports.eras:
        other = per_call_eras.get(era.group)
        eras.add_row(
            era.group or "—",
            str(era.runs),
            str(era.days),
            _num(era.mean_throughput_tps, 0),
            _num(other.mean_throughput_tps if other else None, 1),
            _duration(era.mean_wall_s) if era.mean_wall_s is not None else "—",
        )
    console.print(eras)
    console.print(
        "Agreement between the two runs (ledger agreement) needs a label in each answer, such as a model's\n"
        '"Grade: Buy"; the emulator\'s answers are filler text, so the demo computes none rather than invent one:\n'
        f"  ledger agreement {' '.join(run.run for run in runs)} --extract 'Grade: (\\w+)' --scale Sell,Hold,Buy"
    )


def _scaled(tps: float | None, speed: float) -> float | None:
    return None if tps is None or speed <= 0 else tps / speed


def _tokens(count: int) -> str:
    return f"{count / 1e6:,.2f}M" if count >= 1_000_000 else f"{count:,}"


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60:02d} min" if hours else f"{rest // 60} min {rest % 60:02d} s"


def _num(value: float | None, digits: int, suffix: str = "") -> str:
    return "—" if value is None else f"{value:,.{digits}f}{suffix}"
