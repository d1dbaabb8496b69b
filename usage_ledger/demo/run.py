"""`ledger demo`: the emulator, the gateway and a seed-shaped batch, then the reports.

Two runs, one per box and both at once, go through two real gateways into one embedded SQLite
ledger: `tickers × steps` calls on the `moe` profile with 14 in flight, and fewer tickers on
`dense` with 3. Both emulators' clocks run at ONE speed, the one that fits the MoE batch (scaled
from the seed's real duration) into about `--seconds`; the dense box, about 8× slower, gets
proportionally fewer tickers so it takes about as long (a run's aggregate throughput does not
depend on its size). Every rate the ledger records is then that speed × the emulated GPU's, and
ratios between the boxes are the seed's: MoE ÷ dense ≈ 7.7× aggregate, ≈ 1.7× per-call mean.

An existing ledger file is never deleted: the demo's runs are added to it (run names carry the
second they started, so two demos never merge).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import tempfile
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import msgspec
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.migrate import upgrade_database
from usage_ledger.ledger.verify import verify_chain
from usage_ledger.processes import free_port, start_child
from usage_ledger.projections.engine import catch_up_all
from usage_ledger.projections.eras import EraRow, eras_report
from usage_ledger.projections.reports import daily_report, runs_report, tickers_report
from usage_ledger.projections.rows import DailyRow, RunRow, TickerRow
from usage_ledger.workload import TICKERS, WorkloadResult, run_workload

__all__ = ("DemoOptions", "DemoRun", "demo_plan", "run_demo")


class DemoOptions(msgspec.Struct, frozen=True, kw_only=True):
    db_path: Path
    tickers: int = 100
    steps: int = 17
    seconds: float = 90.0
    tz: str = "Asia/Seoul"
    keep_running: bool = False


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    """One of the user's two boxes (DESIGN §7): the emulator profile and the seed's measurement."""

    name: str
    model: str
    concurrency: int
    seed_seconds: float  # the seed's 1,700-call run took this long on the real GPU
    seed_tps: float  # its aggregate throughput

    @property
    def seconds_per_call(self) -> float:
        """The GPU's time per call at full concurrency (the seed's run ÷ its calls)."""
        return self.seed_seconds / SEED_CALLS


SEED_CALLS = 1700
PLAN = (  # the fast box first: it sets the clock speed
    Profile(name="moe", model="qwen3-30b-a3b-moe", concurrency=14, seed_seconds=2741.0, seed_tps=911.0),
    Profile(name="dense", model="qwen3-27b-dense", concurrency=3, seed_seconds=22680.0, seed_tps=118.0),
)


class Box(msgspec.Struct, frozen=True, kw_only=True):
    """A profile with the tickers it runs in this demo."""

    profile: Profile
    tickers: int


def demo_plan(options: DemoOptions) -> tuple[float, list[Box]]:
    """(clock speed of both emulators, the boxes): the MoE batch takes about `seconds`, the others as long.

    A slower box gets fewer tickers in proportion to its time per call, in whole rounds of its
    concurrency (a last partial round would run with fewer calls in flight and lower its aggregate).
    """
    fastest = PLAN[0]
    batch_s = options.tickers * options.steps * fastest.seconds_per_call
    speed = max(1.0, batch_s / options.seconds)
    boxes = [Box(profile=fastest, tickers=options.tickers)]
    for profile in PLAN[1:]:
        rounds = round(options.tickers * fastest.seed_seconds / profile.seed_seconds / profile.concurrency)
        boxes.append(Box(profile=profile, tickers=min(options.tickers, max(1, rounds) * profile.concurrency)))
    return speed, boxes


class DemoRun(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    profile: Profile
    result: WorkloadResult
    wall_s: float
    emulated_s: float

    @property
    def effective_speed(self) -> float:
        """How fast the emulator's clock really ran (below the set speed when this machine could not keep up)."""
        return self.emulated_s / self.wall_s if self.wall_s > 0 else 1.0


class _Station(msgspec.Struct, frozen=True):
    box: Box
    run: str
    emulator_url: str
    gateway_url: str


async def run_demo(options: DemoOptions, console: Console) -> int:
    url = f"sqlite:///{options.db_path}"
    existed = await asyncio.to_thread(options.db_path.exists)
    database = open_database(url)
    await upgrade_database(database)
    before = await runs_report(database) if existed else []
    speed, boxes = demo_plan(options)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with tempfile.TemporaryDirectory(prefix="ledger-demo-") as tmp:
        async with contextlib.AsyncExitStack() as children:
            stations = [
                await _start_station(
                    url,
                    Path(tmp),
                    speed,
                    box,
                    f"{box.profile.name}-{stamp}",
                    children,
                    keep_running=options.keep_running,
                )
                for box in boxes
            ]
            where = (
                f"added to the existing {options.db_path.name} ({len(before)} run{'' if len(before) == 1 else 's'} "
                "in it already; nothing is deleted)"
                if existed
                else f"recorded in a new {options.db_path.name}"
            )
            sizes = " and ".join(f"{b.tickers} × {options.steps} calls on {b.profile.name}" for b in boxes)
            console.print(
                f"Sending {sizes}, both at once, through two gateways; the runs are {where}. Both emulators' "
                f"clocks run {speed:,.0f}× real time, so each batch takes ≈{options.seconds:g} s."
            )
            runs = await _drive_all(options, stations, console)
            if options.keep_running:
                for station in stations:
                    console.print(
                        f"gateway {station.gateway_url} → emulator {station.emulator_url} ({station.box.profile.name})"
                    )
                console.print("Left running; Ctrl-C to stop.")
                await _wait_forever()
    await catch_up_all(database)
    _print_reports(options, speed, runs, await _reports(database, runs, options.tz), console)
    report = await verify_chain(database)
    await database.dispose()
    if report.ok:
        console.print(f"[green]ledger verify: chain intact[/] ({report.checked} events, head {report.head_hash[:16]}…)")
    else:
        console.print(f"[red]ledger verify: BROKEN at {report.first_bad_position}: {report.problem}[/]")
    console.print(f"\nThe ledger is in [bold]{options.db_path}[/]; a demo run again adds to it. Explore it:")
    for command in (
        f"ledger report runs --db {url} --formula per_call_mean",
        f"ledger show run {runs[0].run} --db {url}",
        f"ledger compare {' '.join(r.run for r in reversed(runs))} --db {url}",  # B÷A = MoE ÷ dense
        f"ledger ui --db {url}",
    ):
        _print_command(console, command)
    return 0 if report.ok else 1


async def _start_station(
    url: str, work: Path, speed: float, box: Box, run: str, children: contextlib.AsyncExitStack, *, keep_running: bool
) -> _Station:
    profile = box.profile
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
    return _Station(box, run, emulator_url, gateway_url)


async def _drive_all(options: DemoOptions, stations: list[_Station], console: Console) -> list[DemoRun]:
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tokens]:,} output tokens"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:

        async def drive(station: _Station) -> DemoRun:
            profile = station.box.profile
            tickers = list(TICKERS[: station.box.tickers])
            task = progress.add_task(
                f"{station.run} ({profile.concurrency} in flight)", total=len(tickers) * options.steps, tokens=0
            )
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
    """This demo's runs, under each formula."""
    tickers: list[TickerRow]
    daily: list[DailyRow]
    daily_utc: list[DailyRow]
    eras: list[EraRow]
    eras_per_call: list[EraRow]
    """The whole ledger's (earlier demos' runs too)."""


async def _reports(database: Database, runs: list[DemoRun], tz: str) -> _Reports:
    async def of_runs(formula: str) -> list[RunRow]:
        return [row for run in runs for row in await runs_report(database, formula=formula, run=run.run)]

    return _Reports(
        await of_runs("batch_aggregate"),
        await of_runs("per_call_mean"),
        [row for run in runs for row in await tickers_report(database, run=run.run)],
        await daily_report(database, tz=tz),
        await daily_report(database, tz="UTC"),
        await eras_report(database, by="model", formula="batch_aggregate", zone=ZoneInfo(tz)),
        await eras_report(database, by="model", formula="per_call_mean", zone=ZoneInfo(tz)),
    )


def _table(title: str, columns: tuple[str, ...], *, left: int = 1) -> Table:
    """A table in `report`'s style; the first `left` columns are text, the rest numbers."""
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i < left else "right", no_wrap=i < left)
    return table


def _show(console: Console, table: Table) -> None:
    """The title on a line of its own, as `report` prints it (rich would wrap it to the table's width)."""
    title, table.title = table.title, None
    console.print(Text(str(title), style="bold"))
    console.print(table)


def _print_reports(
    options: DemoOptions, speed: float, runs: list[DemoRun], reports: _Reports, console: Console
) -> None:
    recorded = _table(
        "This demo's runs as the ledger recorded them (t/s: output tokens per second)",
        ("run", "calls", "tickers", "input tok", "output tok", "wall s", "aggregate", "per-call"),
    )
    for aggregate, per_call in zip(reports.aggregate, reports.per_call, strict=True):
        recorded.add_row(
            aggregate.run,
            f"{aggregate.calls:,}",
            f"{aggregate.tickers:,}",
            _tokens(aggregate.input_tokens),
            _tokens(aggregate.output_tokens),
            _num(aggregate.wall_s, 1),
            _num(aggregate.throughput_tps, 0),
            _num(per_call.throughput_tps, 0),
        )
    _show(console, recorded)
    failed = sum(row.failed_calls for row in reports.aggregate)
    if failed:
        console.print(f"[red]{failed} calls failed[/] (ledger show run RUN lists them)")
    _show(console, _story(speed, runs, reports))
    console.print(
        "aggregate = Σ output tokens ÷ (last call end − first call start): what the box delivered\n"
        "  (batch_aggregate, the default formula). per-call = mean over calls of output tokens ÷ the\n"
        "  call's own duration (per_call_mean): under continuous batching calls share the GPU, so it\n"
        "  is one request's speed, not the box's throughput. Both: ledger report runs --formula NAME."
    )
    if any(run.effective_speed < 0.9 * speed for run in runs):
        kept = " and ".join(f"{run.profile.name} {run.effective_speed:,.0f}×" for run in runs)
        skew = runs[0].effective_speed / runs[-1].effective_speed
        console.print(
            f"[yellow]This machine could not keep the clocks at {speed:,.0f}× (they averaged {kept}):[/] the "
            f"ledger's rates are below the GPU's × {speed:,.0f}, and its ratios off by about {skew:.2f}×. A larger "
            "--seconds runs the clocks slower; fewer other jobs on the machine let them keep up."
        )
    top = _table("Top tickers by output tokens", ("run", "ticker", "calls", "input tok", "output tok"), left=2)
    for row in sorted(reports.tickers, key=lambda r: -r.output_tokens)[:8]:
        top.add_row(row.run, row.ticker, str(row.calls), _tokens(row.input_tokens), _tokens(row.output_tokens))
    _show(console, top)
    for title, rows in ((f"Daily totals ({options.tz})", reports.daily), ("Daily totals (UTC)", reports.daily_utc)):
        daily = _table(f"{title}, the whole ledger", ("day", "calls", "failed", "input tok", "output tok"))
        for day in rows:
            daily.add_row(
                day.day,
                f"{day.calls:,}",
                f"{day.failed_calls:,}",
                _tokens(day.input_tokens),
                _tokens(day.output_tokens),
            )
        _show(console, daily)
    eras = _table(
        "Eras by model, every run in the ledger (ledger report eras --by model)",
        ("model", "runs", "days", "aggregate t/s", "per-call t/s", "mean wall"),
    )
    per_call_eras = {row.group: row for row in reports.eras_per_call}
    for era in reports.eras:
        other = per_call_eras.get(era.group)
        eras.add_row(
            era.group or "—",
            str(era.runs),
            str(era.days),
            _num(era.mean_throughput_tps, 0),
            _num(other.mean_throughput_tps if other else None, 0),
            _duration(era.mean_wall_s) if era.mean_wall_s is not None else "—",
        )
    _show(console, eras)
    console.print(
        "Agreement between the two runs (ledger agreement) needs a label in each answer, such as a\n"
        "model's \"Grade: Buy\"; the emulator's answers are filler text, so the demo computes none:"
    )
    runs_named = " ".join(run.run for run in runs)
    _print_command(console, f"ledger agreement {runs_named} --extract 'Grade: (\\w+)' --scale Sell,Hold,Buy")


def _print_command(console: Console, command: str) -> None:
    """A command to copy, indented, continued with `\\` before an option when it is wider than the console."""
    lines = [""]
    for part in re.split(r" (?=--)", command):
        if lines[-1] and len(lines[-1]) + 1 + len(part) > console.width - 8:
            lines.append(part)
        else:
            lines[-1] = f"{lines[-1]} {part}".lstrip()
    console.print(
        " \\\n      ".join(f"  {lines[0]}" if i == 0 else line for i, line in enumerate(lines)),
        soft_wrap=True,
        markup=False,
        highlight=False,
    )


def _story(speed: float, runs: list[DemoRun], reports: _Reports) -> Table:
    """The README's point from the ledger's own figures: MoE ÷ dense under each formula, beside the seed's."""
    fast, slow = reports.aggregate[0], reports.aggregate[-1]
    fast_call, slow_call = reports.per_call[0], reports.per_call[-1]
    a, b = runs[0].profile, runs[-1].profile
    story = _table(
        f"{a.name} ÷ {b.name}, from the ledger (both clocks at {speed:,.0f}× real time: ratios are the GPU's)",
        ("formula", a.name, b.name, f"{a.name} ÷ {b.name}", "seed, one 5090"),
    )
    seed_aggregate = f"{a.seed_tps:,.0f} ÷ {b.seed_tps:,.0f} = {a.seed_tps / b.seed_tps:.1f}×"
    per_a, per_b = a.seed_tps / a.concurrency, b.seed_tps / b.concurrency
    seed_per_call = f"{per_a:,.0f} ÷ {per_b:,.0f} ≈ {per_a / per_b:.1f}×"
    for name, x, y, seed in (
        ("aggregate t/s", fast.throughput_tps, slow.throughput_tps, seed_aggregate),
        ("per-call t/s", fast_call.throughput_tps, slow_call.throughput_tps, seed_per_call),
    ):
        story.add_row(name, _num(x, 0), _num(y, 0), _ratio(x, y), seed)
    x, y = fast.throughput_tps, slow.throughput_tps
    story.add_row(
        f"aggregate ÷ {speed:,.0f}",
        _num(x / speed if x is not None else None, 0),
        _num(y / speed if y is not None else None, 0),
        "",
        f"{a.seed_tps:,.0f} and {b.seed_tps:,.0f} t/s",
    )
    return story


def _ratio(x: float | None, y: float | None) -> str:
    return "—" if x is None or not y else f"{x / y:.1f}×"


def _tokens(count: int) -> str:
    return f"{count / 1e6:,.2f}M" if count >= 1_000_000 else f"{count:,}"


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60:02d} min" if hours else f"{rest // 60} min {rest % 60:02d} s"


def _num(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"
