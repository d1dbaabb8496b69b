"""`ledger demo`: the emulator, the gateway and a seed-shaped batch, then the reports and the decision.

Two runs, one per box and both at once, go through two real gateways into one embedded SQLite
ledger: `tickers × steps` calls on the `moe` profile with 14 in flight, and fewer tickers on
`dense` with 3. Both emulators' clocks run at ONE speed, the one that fits the MoE batch (scaled
from the seed's real duration) into about `--seconds`; the dense box, about 8× slower, gets
proportionally fewer tickers so it takes about as long (a run's aggregate throughput does not
depend on its size). Every rate the ledger records is then that speed × the emulated GPU's, and
ratios between the boxes are the seed's: MoE ÷ dense ≈ 7.7× aggregate, ≈ 1.7× per-call mean.

Then each box runs its batch once more with another seed, and the demo ends with `ledger decide`
on the emulators' synthetic grade lines and made-up returns (docs/decide.md, "In the demo").

An existing ledger file is never deleted: the demo's runs are added to it (run names carry the
second they started, so two demos never merge).

Modules: `plan` (the boxes, the clock speed, each box's share and repetition), `stations` (the
emulator and gateway processes, the batches sent through them), `tables` (the printed reports),
`decision` (grades and returns recorded, `ledger decide`), `run` (the order of it all).
"""

from __future__ import annotations

from usage_ledger.demo.plan import DemoOptions, DemoRun, demo_plan, repeat_plan
from usage_ledger.demo.run import run_demo

__all__ = ("DemoOptions", "DemoRun", "demo_plan", "repeat_plan", "run_demo")
