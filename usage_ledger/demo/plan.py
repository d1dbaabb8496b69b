"""The demo's plan: the two boxes (DESIGN §7), one clock speed for both, each box's share of tickers, the repetition."""

from __future__ import annotations

from pathlib import Path

import msgspec

from usage_ledger.workload import WorkloadResult

__all__ = (
    "PLAN",
    "REPEAT_SHARE",
    "SEED_CALLS",
    "Box",
    "DemoOptions",
    "DemoRun",
    "Profile",
    "demo_plan",
    "repeat_plan",
)


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
REPEAT_SHARE = 1 / 3
"""The repetition's share of each box's tickers, in whole rounds: 28 MoE and 3 dense tickers by default, so the
repetitions take ≈ 27 s after a 90 s batch and the demo stays under three minutes (a half, 56 and 6, took 171 s)."""


class Box(msgspec.Struct, frozen=True, kw_only=True):
    """A profile with the tickers it runs in this demo."""

    profile: Profile
    tickers: int


def _whole_rounds(tickers: float, profile: Profile, most: int) -> int:
    """`tickers` rounded to whole rounds of the box's concurrency (at least one, at most `most`): a last
    partial round would run with fewer calls in flight and lower the run's aggregate."""
    rounds = max(1, round(tickers / profile.concurrency))
    return min(most, rounds * profile.concurrency)


def demo_plan(options: DemoOptions) -> tuple[float, list[Box]]:
    """(clock speed of both emulators, the boxes): the MoE batch takes about `seconds`, the others as long.

    A slower box gets fewer tickers in proportion to its time per call, in whole rounds of its concurrency.
    """
    fastest = PLAN[0]
    batch_s = options.tickers * options.steps * fastest.seconds_per_call
    speed = max(1.0, batch_s / options.seconds)
    boxes = [Box(profile=fastest, tickers=options.tickers)]
    for profile in PLAN[1:]:
        share = options.tickers * fastest.seed_seconds / profile.seed_seconds
        boxes.append(Box(profile=profile, tickers=_whole_rounds(share, profile, options.tickers)))
    return speed, boxes


def repeat_plan(boxes: list[Box]) -> list[Box]:
    """Each box once more on the first `REPEAT_SHARE` of its tickers (whole rounds), for `ledger decide`'s
    self-agreement: the boxes' repetitions take about `REPEAT_SHARE` of the first batch's time."""
    return [
        Box(profile=box.profile, tickers=_whole_rounds(box.tickers * REPEAT_SHARE, box.profile, box.tickers))
        for box in boxes
    ]


class DemoRun(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    profile: Profile
    tickers: int
    result: WorkloadResult
    wall_s: float
    emulated_s: float

    @property
    def effective_speed(self) -> float:
        """How fast the emulator's clock really ran (below the set speed when this machine could not keep up)."""
        return self.emulated_s / self.wall_s if self.wall_s > 0 else 1.0
