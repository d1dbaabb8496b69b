"""The gateway's samples of real vLLM's /metrics, read back as a run's server block (`ledger report runs`).

A run sent only through the gateway reconciles with vLLM's counters; calls sent straight to vLLM
during a run show as the difference, exactly their engine requests and tokens.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.realvllm import harness
from tests.realvllm.checks import Stack, sent_usage

QUIET_S = 2.0
"""Before a run: longer than the stack's sampling interval, so that earlier tests' traffic is behind the opening sample."""


def server_block(stack: Stack, run: str, *, settle_s: float = 30.0) -> dict[str, Any]:
    """The run's server block once its closing sample is in (taken ~1 s after the run goes idle)."""
    deadline = time.monotonic() + settle_s
    while True:
        row = harness.report_row(stack.db_url, run)
        server = row["server"]
        if server is not None and server["reconciled"] is not None:
            return {**server, "ledger_calls": row["calls"] - row["failed_calls"] - row["incomplete_calls"]}
        assert time.monotonic() < deadline, f"{run}: no reconcilable server block in {settle_s} s: {json.dumps(row)}"
        time.sleep(0.3)


def run_through_gateway(stack: Stack, run: str, names: tuple[str, ...], *, bypass: tuple[str, ...] = ()) -> list[Any]:
    """The cases through the gateway as `run`, with the `bypass` cases sent straight to vLLM in between."""
    time.sleep(QUIET_S)
    client = harness.sdk_client(stack.gateway_url, **{"X-Ledger-Run": run})
    direct = harness.sdk_client(stack.vllm.url)
    first, *rest = stack.cases(*names)
    harness.send_case(client, first)
    bypassed = [harness.send_case(direct, case) for case in stack.cases(*bypass)]
    for case in rest:
        harness.send_case(client, case)
    return [sent_usage(reply) for reply in bypassed]
