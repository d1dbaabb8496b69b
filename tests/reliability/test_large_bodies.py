"""Large bodies against the real `ledger serve`: memory stays bounded, the client still gets every byte.

Issue #18: 8 concurrent 50 MB responses took the gateway to 1.32 GB (each buffered whole for its
blob), 12 stalled 30 MB request bodies from 91 to 448 MB. Now a response over
`LEDGER_MAX_STORED_BODY_BYTES` is relayed byte for byte but not stored (the event says so, and its
usage is still read from the body's end); request bodies held at once are bounded by
`LEDGER_MAX_REQUEST_BYTES_IN_FLIGHT` (beyond it: 503). The bound on the gateway's peak RSS is the
one docs/operations.md documents: idle RSS + the request-body budget + the stored-body budget +
`SLACK` (buffers and allocator). Peak RSS is read from /proc (VmHWM, reset with clear_refs).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.gateway import processes
from tests.gateway.processes import Process
from tests.reliability.big_upstream import big_body, big_usage
from tests.reliability.helpers import chat_body, read_blobs, read_ledger
from tests.reliability.slow_clients import answer, stalled_body
from usage_ledger.gateway.settings import GatewaySettings

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
BIG = 50_000_000
CONCURRENT = 8
STALLED = 12
STALLED_BYTES = 30_000_000
SLACK = 64 * MIB
"""Buffers (upstream high-water, transports), the allocator's slack, the writer's work: the documented margin."""
DEFAULTS = GatewaySettings()


def _status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def _reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := VmRSS


async def _big_call(http: httpx.AsyncClient, url: str, size: int, framing: str) -> tuple[int, str, str | None]:
    """(status, sha256 of the body received, call id), read as it comes (the test holds none of it)."""
    digest = hashlib.sha256()
    headers = {"x-test-body-bytes": str(size), "x-test-framing": framing, "content-type": "application/json"}
    body = chat_body("big", max_tokens=1, stream=False)
    async with http.stream("POST", url + "/v1/chat/completions", content=body, headers=headers) as response:
        async for chunk in response.aiter_raw():
            digest.update(chunk)
    return response.status_code, digest.hexdigest(), response.headers.get("x-ledger-call-id")


async def test_big_responses_and_stalled_bodies_stay_under_the_memory_bound(
    big_upstream: Process, tmp_path: Path
) -> None:
    db_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    processes.upgrade(db_url)
    gw = processes.gateway(tmp_path, big_upstream.url, db_url, env={"LEDGER_BODY_TIMEOUT_S": "5"})  # type: ignore[attr-defined]
    await asyncio.to_thread(gw.start)
    pid = gw.proc.pid  # type: ignore[union-attr]
    url = gw.url  # type: ignore[attr-defined]
    bound = DEFAULTS.max_request_bytes_in_flight + DEFAULTS.max_stored_bytes_in_flight + SLACK
    try:
        async with httpx.AsyncClient(timeout=120) as http:
            small = await _big_call(http, url, 1_000_000, "length")  # under the cap: stored whole
            idle = _status(pid, "VmRSS")
            _reset_peak(pid)
            framings = ["length", "chunked"] * (CONCURRENT // 2)
            big = await asyncio.gather(*(_big_call(http, url, BIG, f) for f in framings))
            responses_peak = _status(pid, "VmHWM")
        expected = hashlib.sha256(big_body(BIG)).hexdigest()
        assert all(status == 200 and digest == expected for status, digest, _ in big)  # byte for byte

        _reset_peak(pid)
        stalled = [await stalled_body(gw.port, STALLED_BYTES, STALLED_BYTES - MIB) for _ in range(STALLED)]  # type: ignore[attr-defined]
        held_peak = _status(pid, "VmHWM")
        outcomes = Counter(await asyncio.gather(*(answer(conn, 60) for conn in stalled)))
    finally:
        gw.stop()
    print(
        f"\nidle RSS {idle / MIB:.0f} MiB; peak with {CONCURRENT} x {BIG / 1e6:.0f} MB responses "
        f"{responses_peak / MIB:.0f} MiB; peak with {STALLED} stalled {STALLED_BYTES / 1e6:.0f} MB bodies "
        f"{held_peak / MIB:.0f} MiB; bound {(idle + bound) / MIB:.0f} MiB; stalled outcomes {dict(outcomes)}"
    )
    assert responses_peak - idle < bound and held_peak - idle < bound
    fits = DEFAULTS.max_request_bytes_in_flight // (STALLED_BYTES - MIB)
    assert outcomes == {"408": fits, "503": STALLED - fits}  # over the budget: refused at once; the rest time out

    ledger = await read_ledger(db_url)
    stored = ledger.finished[str(small[2])]
    assert stored.response_blob is not None and stored.response_blob_omitted == ""
    assert (await read_blobs(db_url, [stored.response_blob]))[stored.response_blob] == big_body(1_000_000)
    prompt, completion = big_usage(BIG)
    for _, _, call_id in big:
        event = ledger.finished[str(call_id)]
        assert event.response_blob is None and event.response_blob_omitted == "too_large"
        assert event.response_bytes == BIG
        assert event.usage is not None and event.usage_source == "reported"
        assert (event.usage.prompt_tokens, event.usage.completion_tokens) == (prompt, completion)
    assert len(ledger.started) == 1 + CONCURRENT  # stalled bodies never became calls
