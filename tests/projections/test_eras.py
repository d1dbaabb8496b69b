"""`ledger report eras --by LABEL`: the user's GPU-era table (DESIGN §7's write-up), from annotated runs."""

from __future__ import annotations

import asyncio
import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from tests.gateway.processes import LEDGER, upgrade
from usage_ledger.answers.eras import eras_report
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import CallFinished, CallStarted, NewEvent, RunAnnotated, Timings, Usage, new_event

SEOUL = ZoneInfo("Asia/Seoul")
FIRST_NIGHT = datetime(2026, 1, 5, 21, 0, tzinfo=SEOUL)
WALL_S = 2700.0  # a 45-minute nightly run


def _offsets(n: int) -> list[float]:
    """n throughputs deviations that sum to zero (so the era's mean is exact)."""
    half = [0.5 * (i + 1) for i in range(n // 2)]
    return [*half, *(-d for d in half), *([0.0] if n % 2 else [])]


def _run(name: str, start: datetime, tps: float, labels: dict[str, str]) -> list[NewEvent]:
    """Two calls side by side for the whole wall: the aggregate is `tps`, each call's own rate half of it."""
    end = start + timedelta(seconds=WALL_S)
    events: list[NewEvent] = []
    for i in range(2):
        call_id = f"{name}-{i}"
        output = round(tps * WALL_S / 2)
        started = CallStarted(
            call_id=call_id, received_at=start, method="POST", path="/v1/chat/completions", run=name, model="moe"
        )
        finished = CallFinished(
            call_id=call_id,
            status=200,
            usage=Usage(prompt_tokens=10_800, completion_tokens=output, total_tokens=10_800 + output),
            usage_source="reported",
            timings=Timings(received=start, first_token=start + timedelta(seconds=1), finished=end),
        )
        events += [
            new_event(started, stream=f"call-{call_id}", occurred_at=start),
            new_event(finished, stream=f"call-{call_id}", occurred_at=end),
        ]
    events.append(new_event(RunAnnotated(labels=labels, run=name), stream=f"run-{name}", occurred_at=end))
    return events


def user_runs() -> list[NewEvent]:
    """Nightly MoE runs: 33 nights on "4070 Ti Super ×2" averaging 62.4 t/s, then 10 on "RX 7900 XTX" averaging 71.6."""
    events: list[NewEvent] = []
    night = 0
    for hardware, nights, mean in (("4070 Ti Super ×2", 33, 62.4), ("RX 7900 XTX", 10, 71.6)):
        for offset in _offsets(nights):
            start = (FIRST_NIGHT + timedelta(days=night)).astimezone(UTC)
            labels = {"hardware": hardware, "kind": "nightly", "model": "moe"}
            events += _run(f"nightly-{night:02d}", start, mean + offset, labels)
            night += 1
    comparison = (FIRST_NIGHT + timedelta(days=night, hours=2)).astimezone(UTC)
    events += _run("dense-trial", comparison, 118.0, {"hardware": "RX 7900 XTX", "kind": "comparison"})
    return events


async def test_the_users_gpu_eras(database: Database) -> None:
    await append_events(database, user_runs())
    eras = await eras_report(database, by="hardware", kind="nightly", zone=SEOUL)
    table = [(e.group, e.runs, e.days, round(e.mean_throughput_tps or 0, 1), e.formula) for e in eras]
    assert table == [
        ("4070 Ti Super ×2", 33, 33, 62.4, "batch_aggregate"),
        ("RX 7900 XTX", 10, 10, 71.6, "batch_aggregate"),
    ]
    first = eras[0]
    assert first.median_throughput_tps == pytest.approx(62.4)
    assert (first.min_throughput_tps, first.max_throughput_tps) == (pytest.approx(62.4 - 8), pytest.approx(62.4 + 8))
    assert first.mean_wall_s == pytest.approx(WALL_S)
    per_call = await eras_report(database, by="hardware", kind="nightly", zone=SEOUL, formula="per_call_mean")
    assert [round(e.mean_throughput_tps or 0, 1) for e in per_call] == [31.2, 35.8]  # each call ran beside another
    assert {e.formula for e in per_call} == {"per_call_mean"}


async def test_groups_without_kind_and_the_model_fallback(database: Database) -> None:
    await append_events(database, user_runs())
    by_hardware = {e.group: e.runs for e in await eras_report(database, by="hardware", zone=SEOUL)}
    assert by_hardware == {"4070 Ti Super ×2": 33, "RX 7900 XTX": 11}  # the comparison run counts without --kind
    by_model = {e.group: e.runs for e in await eras_report(database, by="model", zone=SEOUL)}
    assert by_model == {"moe": 44}  # dense-trial has no model label: its calls' model
    by_gpu_count = {e.group: e.runs for e in await eras_report(database, by="gpus", zone=SEOUL)}
    assert by_gpu_count == {None: 44}


def test_the_command(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(db)

    async def fill() -> None:
        database = open_database(db, null_pool=True)
        try:
            await append_events(database, user_runs())
        finally:
            await database.dispose()

    asyncio.run(fill())
    base = [LEDGER, "report", "eras", "--db", db, "--tz", "Asia/Seoul"]
    out = subprocess.run(
        [*base, "--by", "hardware", "--kind", "nightly", "--format", "json"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["group"], r["days"], round(r["mean_throughput_tps"], 1)) for r in rows] == [
        ("4070 Ti Super ×2", 33, 62.4),
        ("RX 7900 XTX", 10, 71.6),
    ]
    table = subprocess.run([*base, "--by", "hardware"], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "RX 7900 XTX" in table.stdout
    missing = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "--by LABEL" in missing.stderr
