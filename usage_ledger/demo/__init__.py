"""`ledger demo`: the emulator, the gateway and a seed-shaped batch, then the reports and the decision.

What it runs and why both boxes share one clock speed: README.md; its decision: docs/decide.md ("In the demo").

Modules: `plan` (the boxes, the clock speed, each box's share and repetition), `stations` (the
emulator and gateway processes, the batches sent through them), `tables` (the printed reports),
`decision` (grades and returns recorded, `ledger decide`), `run` (the order of it all).
"""

from __future__ import annotations

from usage_ledger.demo.plan import DemoOptions, DemoRun, demo_plan, repeat_plan
from usage_ledger.demo.run import run_demo

__all__ = ("DemoOptions", "DemoRun", "demo_plan", "repeat_plan", "run_demo")
