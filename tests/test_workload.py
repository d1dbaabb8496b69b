"""The demo's workload: what it reports per call (the progress bar's figures) against what the server sent."""

from __future__ import annotations

from usage_ledger.emulator import PROFILES, running_emulator
from usage_ledger.workload import run_workload


async def test_a_stream_reports_chunks_never_as_tokens() -> None:
    """Streams carry no usage here, and a chunk can hold several tokens (the MoE profile drafts speculatively):
    the progress bar once added 2,443,157 chunks as tokens against 2,492,493 in the ledger (issue #54)."""
    calls: list[tuple[int, int]] = []
    async with running_emulator(PROFILES["moe"], speed=200.0) as emulator:
        result = await run_workload(
            emulator.base_url,
            run="r",
            tickers=["AAPL"],
            steps=3,
            concurrency=1,
            model=PROFILES["moe"].model,
            seed=1,
            on_call=lambda tokens, chunks: calls.append((tokens, chunks)),
        )
    assert (result.calls, result.failed, result.streamed) == (3, 0, 1)
    streamed = calls[-1]  # the last step streams
    assert streamed[0] == 0 and streamed[1] > 0
    assert all(chunks == 0 for _, chunks in calls[:-1])
    assert sum(tokens for tokens, _ in calls) == result.completion_tokens > 0
