"""Load: the seed's nightly batch shape through the real gateway, compressed in time.

14 concurrent workers (vLLM max-num-seqs 14 on the MoE run), ≈ 43 KB prompts (≈ 10.8k tokens),
short completions, the emulator at a high `--speed`. Error count 0; every call recorded once;
the gateway's RSS and open file descriptors flat after warm-up (read from /proc).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway import processes
from tests.gateway.processes import Process
from tests.reliability.helpers import Outcome, chat_body, proc_figures, raw_call, read_ledger, verify_fast

pytestmark = [pytest.mark.slow, pytest.mark.serial]

WORKERS = 14
CALLS = 1150  # the seed MoE run: 1,700 calls in 46 min, so 30 min ≈ 1,110 calls
WARM_UP = 150
TICKERS = 100
PROMPT_BYTES = 43_000


@pytest.fixture(scope="module")
def fast_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    proc = processes.emulator(tmp_path_factory.mktemp("emu-load"), speed=400).start()
    try:
        yield proc
    finally:
        proc.stop()


def _prompt(rng: random.Random, ticker: int) -> str:
    words = ["revenue", "margin", "guidance", "capex", "inventory", "churn", "backlog", "FX", "buyback", "EBITDA"]
    text = f"Ticker T{ticker:03d}. Filing excerpt: "
    while len(text) < PROMPT_BYTES:
        text += " ".join(rng.choice(words) for _ in range(12)) + ". "
    return text[:PROMPT_BYTES]


async def test_nightly_batch_shape_is_flat(fast_emulator: Process, tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    processes.upgrade(db_url)
    gw = processes.gateway(tmp_path, fast_emulator.url, db_url)  # type: ignore[attr-defined]
    await asyncio.to_thread(gw.start)
    rng = random.Random(1)
    prompts = [_prompt(rng, t) for t in range(TICKERS)]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(CALLS):
        queue.put_nowait(i)
    outcomes: list[Outcome] = []
    samples: list[tuple[int, int, int]] = []  # (calls done, rss, fds)
    pid = gw.proc.pid  # type: ignore[union-attr]

    async def worker(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            ticker = i % TICKERS
            body = chat_body(
                prompts[ticker] + f" Question {i // TICKERS}.",
                max_tokens=24,
                stream=i % 4 != 0,
                include_usage=i % 2 == 0,
                temperature=0.8,
                chat_template_kwargs={"enable_thinking": False},
            )
            headers = {"X-Ledger-Run": "load", "X-Ledger-Ticker": f"T{ticker:03d}", "authorization": "Bearer sk-load"}
            outcomes.append(await raw_call(http, gw.url, body, headers))  # type: ignore[attr-defined]
            if len(outcomes) % 50 == 0:
                rss, fds = proc_figures(pid)
                samples.append((len(outcomes), rss, fds))

    started = time.monotonic()
    try:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=WORKERS)) as http:
            await asyncio.gather(*(worker(http) for _ in range(WORKERS)))
        elapsed = time.monotonic() - started
        await asyncio.sleep(0.5)
        end_rss, end_fds = proc_figures(pid)
    finally:
        await asyncio.to_thread(gw.stop)

    errors = [o for o in outcomes if o.error or o.status != 200 or not o.complete]
    assert errors == [] and len(outcomes) == CALLS
    ledger = await read_ledger(db_url)
    assert len(ledger.finished) == CALLS and not ledger.failed and not ledger.incomplete
    tokens_in = sum(e.usage.prompt_tokens for e in ledger.finished.values() if e.usage)
    await verify_fast(db_url)
    warm = next(s for s in samples if s[0] >= WARM_UP)
    peak_rss = max(s[1] for s in samples if s[0] >= WARM_UP)
    fds_after_warm = [s[2] for s in samples if s[0] >= WARM_UP]
    print(
        f"\nLOAD: calls={CALLS} workers={WORKERS} prompt_bytes={PROMPT_BYTES} input_tokens={tokens_in} "
        f"elapsed_s={elapsed:.1f} calls_per_s={CALLS / elapsed:.1f} errors=0 "
        f"rss_mib warm={warm[1] / 2**20:.1f} peak={peak_rss / 2**20:.1f} end={end_rss / 2**20:.1f} "
        f"fds warm={warm[2]} max={max(fds_after_warm)} end={end_fds}"
    )
    assert peak_rss - warm[1] < 30 * 2**20 and end_rss - warm[1] < 30 * 2**20
    assert end_fds <= warm[2] + 4 and max(fds_after_warm) <= warm[2] + WORKERS + 8
