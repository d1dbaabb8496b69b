"""Closed-loop simulation of the timing model in pure emulated time (for calibration)."""

from __future__ import annotations

import msgspec

from usage_ledger.emulator.config import EmulatorConfig
from usage_ledger.emulator.lengths import natural_length
from usage_ledger.emulator.scheduler import Scheduler, Sequence

__all__ = ("SimulationResult", "simulate")


class SimulationResult(msgspec.Struct, frozen=True, kw_only=True):
    calls: int
    prompt_tokens: int
    output_tokens: int
    wall_s: float
    throughput_tps: float
    mean_ttft_s: float


def simulate(
    config: EmulatorConfig, *, clients: int, calls: int, prompt_tokens: int = 10_800, mean_output_tokens: int = 1470
) -> SimulationResult:
    """`clients` workers each send calls back to back until `calls` calls are done.

    Output lengths follow the emulator's own deterministic draw (mean +- `output_spread`).
    Throughput is DESIGN's `batch_aggregate`: output tokens / (last end - first start).
    """
    sched = Scheduler(config)
    issued = 0
    t = 0.0
    done: list[Sequence] = []

    def submit(at: float) -> None:
        nonlocal issued
        n = natural_length(f"sim-{issued}".encode(), mean_output_tokens, config.output_spread)
        sched.add(Sequence(f"sim-{issued}", prompt_tokens, n, "stop", at))
        issued += 1

    for _ in range(min(clients, calls)):
        submit(0.0)
    while True:
        plan = sched.schedule()
        if plan is None:
            break
        t += plan.dt
        for seq in sched.complete(plan, t):
            seq.pending.clear()
            if seq.done:
                done.append(seq)
                if issued < calls:
                    submit(t)
    out = sum(s.generated for s in done)
    wall = max(s.finished_at or 0.0 for s in done)
    ttft = sum((s.first_token_at or 0.0) - s.arrival for s in done) / len(done)
    return SimulationResult(
        calls=len(done),
        prompt_tokens=prompt_tokens * len(done),
        output_tokens=out,
        wall_s=wall,
        throughput_tps=out / wall,
        mean_ttft_s=ttft,
    )
