"""The composed `ledger serve`: projections follow the ledger inside the gateway and their read
API is served under `/_ledger/api` behind the admin token."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai

from tests.gateway.processes import emulator, gateway, upgrade


def test_serve_keeps_reports_current_and_serves_them(backend_url: str, tmp_path: Path) -> None:
    upgrade(backend_url)
    upstream = emulator(tmp_path, speed=500).start()
    proxy = gateway(tmp_path, upstream.url, backend_url).start()  # type: ignore[attr-defined]
    base = proxy.health_url.removesuffix("/_ledger/health")
    try:
        model = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test").models.list().data[0].id  # untagged
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test", default_headers={"X-Ledger-Run": "r1"})
        for ticker in ("AAPL", "MSFT", "AAPL"):
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "hello " * 50}],
                max_tokens=8,
                extra_headers={"X-Ledger-Ticker": ticker},
            )
        deadline = time.monotonic() + 20
        runs: list[dict[str, object]] = []
        while time.monotonic() < deadline:  # the in-process follower catches up after the commits
            response = httpx.get(f"{base}/_ledger/api/runs", params={"run": "r1"}, timeout=5)
            runs = response.json() if response.status_code == 200 else []  # 404 until the follower sees r1
            if runs and runs[0]["calls"] == 3:
                break
            time.sleep(0.2)
        assert [(r["run"], r["calls"], r["tickers"], r["output_tokens"]) for r in runs] == [("r1", 3, 2, 24)]
        tickers = httpx.get(f"{base}/_ledger/api/tickers", params={"run": "r1"}, timeout=5).json()
        assert {(t["ticker"], t["calls"]) for t in tickers} == {("AAPL", 2), ("MSFT", 1)}
        schema = httpx.get(f"{base}/_ledger/api/schema/openapi.json", timeout=5).json()
        assert {"/_ledger/api/runs", "/_ledger/api/calls/{call_id}", "/_ledger/api/calls/{call_id}/events"} <= set(
            schema["paths"]
        )
    finally:
        proxy.stop()
        upstream.stop()


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_the_follower_process_dies_with_a_killed_gateway(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    upgrade(url)
    proxy = gateway(tmp_path, "http://127.0.0.1:9", url).start()
    assert proxy.proc is not None
    try:
        deadline = time.monotonic() + 10
        while not (followers := _children(proxy.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(followers) == 1
        proxy.kill()  # SIGKILL: no shutdown code runs in the gateway
        deadline = time.monotonic() + 10
        while Path(f"/proc/{followers[0]}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (
            not Path(f"/proc/{followers[0]}").exists()
            or "Z" in Path(f"/proc/{followers[0]}/stat").read_text().split()[2]
        )
    finally:
        proxy.stop()  # a gateway a failed assertion left running (its follower goes with it); closes the log
