"""Record real vLLM's answers as fixtures: `tests/fixtures/vllm-<version>/<config>/<case>.json`.

Run from the repository root with the project's python (vLLM runs in its own venv, `make vllm-venv`):

    .venv/bin/python -m tests.realvllm.record                          # every configuration, one server at a time
    .venv/bin/python -m tests.realvllm.record --config spec_decode     # only some
    .venv/bin/python -m tests.realvllm.record --config defaults --url http://127.0.0.1:8200   # a running server

Requests go straight to vLLM (no gateway). Each file holds the request and the raw response (status,
headers, body text with SSE verbatim); `metrics.txt` beside them is vLLM's `/metrics` after the cases.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.realvllm.cases import Case, cases_for
from tests.realvllm.servers import (
    CONFIGS,
    REPO,
    VLLM_VERSION,
    build_model,
    default_vllm_python,
    server_args,
    start_vllm,
    wait_idle,
)

FIXTURES = REPO / "tests" / "fixtures" / f"vllm-{VLLM_VERSION}"


def send(client: httpx.Client, base_url: str, case: Case) -> tuple[int, list[list[str]], bytes]:
    """One request as a client sends it; the body exactly as it came off the wire (nothing decoded)."""
    headers = {}
    content: bytes | None = None
    if case.body is not None:
        headers["content-type"] = "application/json"
        content = case.body.encode() if isinstance(case.body, str) else json.dumps(case.body).encode()
    with client.stream(case.method, base_url + case.path, content=content, headers=headers) as response:
        body = b"".join(response.iter_raw())
        raw_headers = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in response.headers.raw]
        return response.status_code, raw_headers, body


def record_case(client: httpx.Client, base_url: str, config: str, case: Case) -> dict[str, Any]:
    status, headers, body = send(client, base_url, case)
    if status != case.expected_status(config):
        expected = case.expected_status(config)
        print(f"  note: {config}/{case.name} answered {status}, the case expects {expected}", file=sys.stderr)
    return {
        "vllm_version": VLLM_VERSION,
        "config": config,
        "server_args": server_args(config),
        "request": {"method": case.method, "path": case.path, "body": case.body},
        "response": {"status": status, "headers": headers, "body": body.decode("utf-8")},
    }


def record_config(base_url: str, config: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.json"):
        old.unlink()
    with httpx.Client(timeout=120) as client:
        version = client.get(f"{base_url}/version").json().get("version")
        if version != VLLM_VERSION:
            raise SystemExit(f"{base_url} runs vLLM {version}, these fixtures are for {VLLM_VERSION}")
        for case in cases_for(config):
            transcript = record_case(client, base_url, config, case)
            (out / f"{case.name}.json").write_text(json.dumps(transcript, indent=2, ensure_ascii=False) + "\n")
            print(f"  {config}/{case.name}: {transcript['response']['status']}")
        wait_idle(base_url)
        (out / "metrics.txt").write_text(client.get(f"{base_url}/metrics").text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", choices=sorted(CONFIGS), help="default: every configuration")
    parser.add_argument("--url", help="record from this running vLLM instead of starting one (one --config)")
    parser.add_argument("--out", type=Path, default=FIXTURES, help=f"default: {FIXTURES.relative_to(REPO)}")
    args = parser.parse_args(argv)
    configs = args.config or list(CONFIGS)
    if args.url:
        if len(configs) != 1:
            parser.error("--url records one configuration: name it with --config")
        record_config(args.url.rstrip("/"), configs[0], args.out / configs[0])
        return 0
    python = default_vllm_python()
    if not python.exists():
        parser.error(f"no vLLM interpreter at {python}: run `make vllm-venv` (or set LEDGER_TEST_VLLM_PYTHON)")
    with tempfile.TemporaryDirectory(prefix="realvllm-") as tmp:
        work = Path(tmp)
        model = build_model(python, work / "model")
        for config in configs:
            began = time.monotonic()
            server = start_vllm(python, model, config, work)
            print(f"{config}: vLLM up in {server.started_in_s:.0f}s at {server.url}")
            try:
                record_config(server.url, config, args.out / config)
            finally:
                server.stop()
            print(f"{config}: recorded in {time.monotonic() - began:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
