"""Upstream faults through the real gateway, against the emulator's fault options, repeated.

For each fault the client gets what it would get talking to the emulator directly (same status,
same events up to the fault, same end: an error event, or a dropped connection), or a clear
OpenAI-shaped 502 (refused) / 504 (slow headers past the read timeout). The gateway stays healthy
and its memory and open file descriptors stay flat over the repetitions.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import msgspec
import pytest

from tests.gateway import processes
from tests.gateway.processes import Process
from tests.reliability.helpers import Outcome, chat_body, proc_figures, raw_call, read_ledger, verify_fast

pytestmark = [pytest.mark.slow, pytest.mark.serial]

ROUNDS = 8
READ_TIMEOUT_S = 0.6


def _events(body: bytes) -> tuple[list[str], str]:
    """The shape of an SSE body: one word per data event (token / usage / error / done), and the text.

    Ids and times differ per request; how tokens are grouped into chunks varies with speculative
    decoding, so complete streams are compared by their text, cut ones by their event kinds.
    """
    shapes: list[str] = []
    text = ""
    for line in body.split(b"\n"):
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            shapes.append("done")
            continue
        obj = msgspec.json.decode(data)
        if "error" in obj:
            shapes.append("error")
        elif obj.get("choices"):
            shapes.append("token")
            text += obj["choices"][0]["delta"].get("content") or ""
        else:
            shapes.append("usage")
    return shapes, text


def _same(direct: Outcome, via: Outcome, stream: bool) -> None:
    assert via.status == direct.status
    assert (via.error is None) == (direct.error is None), (direct.error, via.error)
    assert via.complete == direct.complete
    if stream:
        (kinds_direct, text_direct), (kinds_via, text_via) = _events(direct.body), _events(via.body)
        if direct.complete and "error" not in kinds_direct:
            assert text_via == text_direct and kinds_via[-2:] == kinds_direct[-2:] == ["usage", "done"]
        else:
            assert kinds_via == kinds_direct
    elif via.error is None:
        if via.status == 200:
            a, b = msgspec.json.decode(direct.body), msgspec.json.decode(via.body)
            assert a["choices"] == b["choices"] and a["usage"] == b["usage"]
        else:
            assert via.body == direct.body  # error bodies pass through byte for byte


FAULTS = [
    ("status=503", False),
    ("status=500", True),
    ("error-mid-stream=2", True),
    ("drop-mid-stream=2", True),
    ("drop-mid-stream", False),
    ("slow-headers=0.2", True),
]


async def test_faults_match_direct_and_gateway_stays_flat(emulator: Process, tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    processes.upgrade(db_url)
    gw = processes.gateway(tmp_path, emulator.url, db_url)  # type: ignore[attr-defined]
    gw.env["LEDGER_UPSTREAM_READ_TIMEOUT_S"] = str(READ_TIMEOUT_S)
    (tmp_path / "dead").mkdir()
    dead = processes.gateway(tmp_path / "dead", f"http://127.0.0.1:{processes.free_port()}", db_url)
    figures: list[tuple[int, int]] = []
    await asyncio.to_thread(gw.start)
    try:
        await asyncio.to_thread(dead.start)
        async with httpx.AsyncClient(timeout=10) as http:
            for round_ in range(ROUNDS):
                for fault, stream in FAULTS:
                    body = chat_body(f"fault {fault}", max_tokens=12, stream=stream)
                    headers = {"X-Emulator-Fault": fault}
                    direct, via = await asyncio.gather(
                        raw_call(http, emulator.url, body, headers),  # type: ignore[attr-defined]
                        raw_call(http, gw.url, body, headers),  # type: ignore[attr-defined]
                    )
                    _same(direct, via, stream)
                # slow headers past the gateway's read timeout: a clear 504
                slow = await raw_call(
                    http,
                    gw.url,
                    chat_body("slow", max_tokens=3, stream=True),
                    {"X-Emulator-Fault": "slow-headers=1.2"},  # type: ignore[attr-defined]
                )
                assert slow.status == 504 and msgspec.json.decode(slow.body)["error"]["code"] == "upstream_timeout"
                # connection refused: a clear 502
                refused = await raw_call(http, dead.url, chat_body("refused", max_tokens=3, stream=False))  # type: ignore[attr-defined]
                assert refused.status == 502
                assert msgspec.json.decode(refused.body)["error"]["code"] == "upstream_unreachable"
                health = (await http.get(gw.url + "/_ledger/health")).json()  # type: ignore[attr-defined]
                assert health["status"] == "ok" and health["in_flight"] == 0
                if round_ in (1, ROUNDS - 1):  # after warm-up, and at the end
                    await asyncio.sleep(0.3)
                    figures.append(proc_figures(gw.proc.pid))  # type: ignore[union-attr]
            # healthy afterwards: a plain call still works end to end
            ok = await raw_call(http, gw.url, chat_body("after", max_tokens=3, stream=True))  # type: ignore[attr-defined]
            assert ok.status == 200 and ok.complete
    finally:
        await asyncio.to_thread(gw.stop)
        if dead.proc is not None:
            await asyncio.to_thread(dead.stop)

    (rss0, fds0), (rss1, fds1) = figures
    assert rss1 - rss0 < 20 * 2**20, f"RSS grew {(rss1 - rss0) / 2**20:.1f} MiB over {ROUNDS - 2} fault rounds"
    assert fds1 <= fds0 + 4, f"open fds {fds0} -> {fds1}"
    ledger = await read_ledger(db_url)
    reasons: dict[str, int] = {}
    for failed in ledger.failed.values():
        reasons[failed.reason] = reasons.get(failed.reason, 0) + 1
    assert reasons == {
        "upstream_error_in_stream": ROUNDS,
        "upstream_reset": 2 * ROUNDS,
        "upstream_timeout": ROUNDS,
        "upstream_unreachable": ROUNDS,
    }
    statuses = sorted(f.status for f in ledger.finished.values())
    assert statuses.count(503) == statuses.count(500) == ROUNDS and not ledger.incomplete
    await verify_fast(db_url)
    print(
        f"\nFAULTS: rounds={ROUNDS} calls={len(ledger.started)} failed={reasons} "
        f"rss_mib={rss0 / 2**20:.1f}->{rss1 / 2**20:.1f} fds={fds0}->{fds1}"
    )
