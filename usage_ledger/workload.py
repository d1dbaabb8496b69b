"""A seed-shaped batch (DESIGN §7), sent through the real `openai` SDK like the user's nightly job.

Each worker takes the next ticker and runs its analysis steps one after the other; `concurrency`
workers run at once (14 on the MoE box, 3 on the dense one). A prompt is ≈10.8k tokens (≈43 KB:
a shared system prompt plus the ticker's price history); the last step of every ticker streams.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable

import msgspec

__all__ = ("TICKERS", "WorkloadResult", "prompt_messages", "run_workload")

TICKERS = (
    "AAPL MSFT NVDA AMZN GOOGL META BRK.B LLY AVGO TSLA JPM V UNH XOM MA JNJ PG HD COST MRK ABBV CVX ADBE CRM "
    "PEP KO BAC AMD NFLX TMO WMT MCD ACN CSCO LIN ABT ORCL DHR INTC DIS WFC TXN PM VZ CMCSA AMGN NEE COP "
    "IBM UNP INTU QCOM CAT HON LOW SPGI GE BA AMAT RTX GS ISRG PLD MS BKNG ELV SBUX NOW BLK MDT DE T LMT GILD "
    "SYK ADI TJX MDLZ MMC AXP ADP CVS VRTX C REGN SCHW CB ZTS MO PGR SO CI LRCX BDX DUK ETN EOG BSX SLB NKE"
).split()
PROMPT_BYTES = 43_000  # ≈10.8k tokens at the emulator's 4 bytes per token
SYSTEM = (
    "You are a careful equity analyst. Read the price history and the previous notes, then answer the step's "
    "question with numbers from the data. Be concise and say what would change your view. "
) * 6


class WorkloadResult(msgspec.Struct, frozen=True, kw_only=True):
    calls: int
    failed: int
    streamed: int
    prompt_tokens: int
    completion_tokens: int


def prompt_messages(ticker: str, step: int, steps: int) -> list[dict[str, str]]:
    """The messages of one call: the ticker's price history (shared by its steps) and the step's question."""
    question = f"Step {step + 1} of {steps} for {ticker}: assess trend, risk and valuation."
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question + "\n" + _history(ticker)}]


@functools.lru_cache(maxsize=128)
def _history(ticker: str) -> str:
    """≈43 KB of deterministic daily prices for `ticker`."""
    rng = random.Random(ticker)
    rows = ["date,open,high,low,close,volume"]
    size = len(rows[0])
    price = 20 + rng.random() * 500
    budget = PROMPT_BYTES - len(SYSTEM) - 200
    while size < budget:
        price *= 1 + rng.gauss(0, 0.018)
        row = f"d{len(rows):04d},{price:.2f},{price * 1.012:.2f},{price * 0.988:.2f},{price:.2f},{rng.randint(10**5, 10**8)}"
        rows.append(row)
        size += len(row) + 1
    return "\n".join(rows)


async def run_workload(
    base_url: str,
    *,
    run: str,
    tickers: list[str],
    steps: int,
    concurrency: int,
    model: str,
    seed: int | None = None,
    on_call: Callable[[int, int], None] = lambda _tokens, _chunks: None,
) -> WorkloadResult:
    """Send every ticker's steps through the gateway at `base_url`; tags go in X-Ledger-* headers.

    `seed`: the requests' sampling seed (vLLM's per-request `seed`), none by default. `on_call(tokens, chunks)`
    after each call: its output tokens as the server reported them, or, for a stream (which carries no usage
    here), 0 and its chunks: a chunk can hold several tokens (speculative decoding), so chunks are not tokens."""
    import openai  # here, not at the top: half a second every `ledger` command would pay for the demo's client

    client = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1",
        api_key="sk-demo-not-a-real-key",
        default_headers={"X-Ledger-Run": run},
        max_retries=0,
        timeout=600,
    )
    queue: asyncio.Queue[str] = asyncio.Queue()
    for ticker in tickers:
        queue.put_nowait(ticker)
    totals = {"calls": 0, "failed": 0, "streamed": 0, "prompt": 0, "completion": 0}

    async def one_call(ticker: str, step: int) -> None:
        headers = {"X-Ledger-Ticker": ticker, "X-Ledger-Tag-Step": str(step + 1)}
        common = {
            "model": model,
            "messages": prompt_messages(ticker, step, steps),
            "temperature": 0.8,
            "extra_headers": headers,
            "extra_body": {"chat_template_kwargs": {"enable_thinking": False}},
        }
        if seed is not None:
            common["seed"] = seed
        if step == steps - 1:
            # The summary step streams, without asking for usage (the gateway asks upstream and hides
            # the usage chunk). Raw lines: the SDK's per-chunk model building would dominate the demo.
            async with client.chat.completions.with_streaming_response.create(stream=True, **common) as response:  # type: ignore[call-overload]
                chunks = 0
                async for line in response.iter_lines():
                    if line.startswith("data: {"):
                        chunks += 1
            totals["streamed"] += 1
            on_call(0, chunks)
            return
        completion = await client.chat.completions.create(**common)  # type: ignore[call-overload]
        usage = completion.usage
        if usage is not None:
            totals["prompt"] += usage.prompt_tokens
            totals["completion"] += usage.completion_tokens
        on_call(usage.completion_tokens if usage is not None else 0, 0)

    async def worker() -> None:
        while not queue.empty():
            ticker = queue.get_nowait()
            for step in range(steps):
                totals["calls"] += 1
                try:
                    await one_call(ticker, step)
                except openai.APIError:
                    totals["failed"] += 1
                    on_call(0, 0)

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    return WorkloadResult(
        calls=totals["calls"],
        failed=totals["failed"],
        streamed=totals["streamed"],
        prompt_tokens=totals["prompt"],
        completion_tokens=totals["completion"],
    )
