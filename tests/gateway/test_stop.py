"""`ledger serve` stops gracefully on SIGTERM from the first moment it answers: an orchestrator that sends
SIGTERM as soon as `/_ledger/health` first says 200 gets the graceful stop (`gateway_stopping`, exit 0),
not the start-up path's bare exit (the signal handlers are in place before the socket answers)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import msgspec

from tests.gateway import processes
from tests.gateway.processes import LEDGER, free_port

DEAD_UPSTREAM = "http://127.0.0.1:9"


def test_sigterm_the_moment_health_first_answers_stops_gracefully(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    processes.upgrade(db_url)
    port = free_port()
    log = tmp_path / "serve.log"
    args = [LEDGER, "serve", "--upstream", DEAD_UPSTREAM, "--port", str(port), "--db", db_url]
    env = {**os.environ, "LEDGER_LOG_FORMAT": "json", "LEDGER_SERVER_SAMPLE_S": "0"}
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        # The port is bound before the gateway answers: a request sent then waits in the backlog and is
        # answered as soon as the server accepts, so the SIGTERM below follows the first answer closely.
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/_ledger/health", timeout=60).status_code
            except httpx.TransportError:
                time.sleep(0.02)
                continue
            assert status == 200, status
            proc.send_signal(signal.SIGTERM)
            break
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [msgspec.json.decode(line) for line in log.read_text().splitlines() if line.startswith("{")]
    events = [line["event"] for line in lines]
    assert proc.returncode == 0, log.read_text()
    assert "gateway_listening" in events and "gateway_stopping" in events, events
    assert events.index("gateway_listening") < events.index("gateway_stopping")
