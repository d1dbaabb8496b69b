"""`ledger serve` stops gracefully on SIGTERM from the first moment it answers: an orchestrator that sends
SIGTERM as soon as `/_ledger/health` first says 200 gets the graceful stop (`gateway_stopping`, exit 0),
not the start-up path's bare exit or a hang (the signal handlers are in place before the socket answers).

A race, so a probabilistic test: before the fix it failed 5 runs in 6 here (an exit without `gateway_stopping`,
or a hang); the window was the few ms between the server accepting and its start-up poll noticing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

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
        # The port is bound before the gateway answers: a request sent then waits in the backlog and is answered
        # as soon as the server accepts. Raw bytes, so the SIGTERM follows the answer's first bytes at once.
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=60)
            except OSError:  # not bound yet
                time.sleep(0.02)
                continue
            with conn:
                conn.sendall(b"GET /_ledger/health HTTP/1.1\r\nhost: t\r\n\r\n")
                first = conn.recv(12)
                assert first == b"HTTP/1.1 200", first
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
