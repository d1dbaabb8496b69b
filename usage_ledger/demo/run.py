"""`run_demo`: the stations up, the boxes' batches and their repetitions, then the reports and the decision."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from usage_ledger.answers import Decision, runs_report
from usage_ledger.demo.decision import print_decision_step, record_evidence
from usage_ledger.demo.plan import Box, DemoOptions, demo_plan, repeat_plan
from usage_ledger.demo.stations import Batch, Station, drive_all, start_station, wait_forever
from usage_ledger.demo.tables import print_command, print_reports, read_reports
from usage_ledger.ledger import open_database, upgrade_database, verify_chain
from usage_ledger.projections import catch_up_all
from usage_ledger.workload import TICKERS

__all__ = ("FIRST_SEED", "REPEAT_SEED", "run_demo")

FIRST_SEED, REPEAT_SEED = 1, 2
"""The requests' sampling seeds (the emulator's grade line follows them): the batches', the repetitions'."""


async def run_demo(
    options: DemoOptions, console: Console, *, print_decision: Callable[[Decision], None], ui_port: int
) -> int:
    """The demo (see the package); `print_decision` and `ui_port` are the CLI's `ledger decide` printer and
    `ledger ui` port, for the last step."""
    url = f"sqlite:///{options.db_path}"
    existed = await asyncio.to_thread(options.db_path.exists)
    database = open_database(url)
    await upgrade_database(database)
    before = await runs_report(database) if existed else []
    speed, boxes = demo_plan(options)
    repeats = repeat_plan(boxes)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with tempfile.TemporaryDirectory(prefix="ledger-demo-") as tmp:
        async with contextlib.AsyncExitStack() as children:
            stations = [
                await start_station(url, Path(tmp), speed, box.profile, children, keep_running=options.keep_running)
                for box in boxes
            ]
            where = (
                f"added to the existing {options.db_path.name} ({len(before)} run{'' if len(before) == 1 else 's'} "
                "in it already; nothing is deleted)"
                if existed
                else f"recorded in a new {options.db_path.name}"
            )
            console.print(
                f"Sending {_sizes(boxes, options.steps)}, both at once, through two gateways; the runs are {where}. "
                f"Both emulators' clocks run {speed:,.0f}× real time, so each batch takes ≈{options.seconds:g} s."
            )
            first = await drive_all(_batches(stations, boxes, stamp, FIRST_SEED), options.steps, console)
            console.print(
                f"Once more with another sampling seed, for the runs' self-agreement: {_sizes(repeats, options.steps)}."
            )
            again = await drive_all(_batches(stations, repeats, stamp, REPEAT_SEED), options.steps, console)
            if options.keep_running:
                for station in stations:
                    console.print(
                        f"gateway {station.gateway_url} → emulator {station.emulator_url} ({station.profile.name})"
                    )
                console.print("Left running; Ctrl-C to stop.")
                await wait_forever()
    await catch_up_all(database)
    print_reports(options, speed, first, again, await read_reports(database, first + again, options.tz), console)
    await record_evidence(database, first + again, options.steps, list(TICKERS[: options.tickers]), console)
    report = await verify_chain(database)
    if report.ok:
        console.print(f"[green]ledger verify: chain intact[/] ({report.checked} events, head {report.head_hash[:16]}…)")
    else:
        console.print(f"[red]ledger verify: BROKEN at {report.first_bad_position}: {report.problem}[/]")
    console.print(f"\nThe ledger is in [bold]{options.db_path}[/]; a demo run again adds to it. Explore it:")
    for command in (
        f"ledger report runs --db {url} --formula per_call_mean",
        f"ledger show run {first[0].run} --db {url}",
        f"ledger compare {' '.join(r.run for r in reversed(first))} --db {url}",  # B÷A = MoE ÷ dense
        f"ledger ui --db {url}",
    ):
        print_command(console, command)
    await print_decision_step(database, first, again, url, console, print_decision=print_decision, ui_port=ui_port)
    await database.dispose()
    return 0 if report.ok else 1


def _sizes(boxes: list[Box], steps: int) -> str:
    return " and ".join(f"{b.tickers} × {steps} calls on {b.profile.name}" for b in boxes)


def _batches(stations: list[Station], boxes: list[Box], stamp: str, seed: int) -> list[Batch]:
    """One run per box, named to the second (`moe-20261205-014500`); a repetition's name says its seed."""
    suffix = "" if seed == FIRST_SEED else f"-seed{seed}"
    return [
        Batch(station, box, f"{box.profile.name}-{stamp}{suffix}", seed)
        for station, box in zip(stations, boxes, strict=True)
    ]
