"""`ledger audit`: sampling that varies within a run, the server restarting or changing config, two runs apart."""

from __future__ import annotations

import subprocess
from pathlib import Path

import msgspec
import pytest

from tests.gateway.processes import LEDGER, upgrade
from tests.projections.helpers import append, at, finished
from usage_ledger.answers.audit import audit_run
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import CallStarted, NewEvent, Sampling, ServerSampled, new_event
from usage_ledger.projections.errors import NotFound

CONFIG = {"cache_dtype": "fp8", "enable_prefix_caching": "False", "block_size": "16"}


def call(
    call_id: str,
    t: float,
    run: str,
    *,
    temperature: float = 0.8,
    model: str = "moe",
    thinking: bool = False,
    fingerprint: str | None = None,
) -> list[NewEvent]:
    body = CallStarted(
        call_id=call_id,
        received_at=at(t),
        method="POST",
        path="/v1/chat/completions",
        run=run,
        model=model,
        sampling=Sampling(temperature=temperature, max_tokens=2048, enable_thinking=thinking),
    )
    end = finished(call_id, t, t + 5)
    if fingerprint is not None:  # what vLLM stamps on a non-streamed response
        end = msgspec.structs.replace(end, body=msgspec.structs.replace(end.body, system_fingerprint=fingerprint))
    return [new_event(body, stream=f"call-{call_id}", occurred_at=at(t)), end]


def sampled(t: float, requests: float, config: dict[str, str] | None = None) -> NewEvent:
    body = ServerSampled(
        upstream="http://gpu:8200",
        sampled_at=at(t),
        counters={"vllm:request_success_total": requests},
        config=config,
    )
    return new_event(body, stream="server", occurred_at=at(t))


async def test_a_steady_run_has_nothing_to_report(database: Database) -> None:
    await append(database, sampled(-1, 0, CONFIG), *call("a", 0, "r1"), *call("b", 1, "r1"), sampled(7, 2))
    report = await audit_run(database, "r1")
    assert report.findings == []


async def test_what_varies_inside_a_run(database: Database) -> None:
    await append(
        database,
        sampled(-1, 0, CONFIG),
        *call("a", 0, "r1"),
        *call("b", 1, "r1", temperature=0.7, thinking=True),
        *call("c", 2, "r1", model="dense"),
        sampled(4, 5, {**CONFIG, "cache_dtype": "auto"}),  # config changed mid-run
        sampled(5, 1),  # counters went down: the server restarted
        sampled(9, 2),
    )
    kinds = {(f.kind, f.detail.split(":")[0]) for f in (await audit_run(database, "r1")).findings}
    assert ("sampling_varies", "temperature") in kinds and ("sampling_varies", "enable_thinking") in kinds
    assert ("model_varies", "model") in kinds
    assert any(k == "server_config_changed" for k, _ in kinds)
    assert ("server_restarted", "1× (its counters went down)") in kinds
    assert not any(d.startswith("max_tokens") for _, d in kinds)  # the same in every call


async def test_two_runs_apart(database: Database) -> None:
    await append(
        database,
        sampled(-1, 0, CONFIG),
        *call("a", 0, "moe-run"),
        sampled(7, 1),
        sampled(99, 1, {**CONFIG, "enable_prefix_caching": "True"}),
        *call("b", 100, "dense-run", temperature=0.6, model="dense"),
        sampled(107, 2),
    )
    report = await audit_run(database, "moe-run", against="dense-run")
    details = [f.detail for f in report.findings if f.kind == "differs_from_other_run"]
    assert any(d.startswith("temperature:") for d in details)
    assert 'model: moe-run "moe" vs dense-run "dense"' in details  # the names as sent, not a Python list
    assert "server enable_prefix_caching: moe-run False vs dense-run True" in details
    with pytest.raises(NotFound):
        await audit_run(database, "moe-run", against="no-such-run")


async def test_the_server_fingerprint_within_a_run_and_against_another(database: Database) -> None:
    await append(
        database,
        *call("a", 0, "r1", fingerprint="vllm-0.32.0-24ca3cec"),
        *call("b", 1, "r1"),  # a stream: vLLM sends no fingerprint there
        *call("c", 2, "r1", fingerprint="vllm-0.32.0-24ca3cec"),
        *call("d", 100, "r2", fingerprint="vllm-0.32.0-24ca3cec"),
        *call("e", 101, "r2", fingerprint="vllm-0.32.0-85e7044d"),  # restarted with another engine config
    )
    assert (await audit_run(database, "r1")).findings == []
    (changed,) = (await audit_run(database, "r2")).findings
    assert changed.kind == "server_fingerprint_changed"
    assert changed.detail == "system_fingerprint: vllm-0.32.0-24ca3cec (1 calls), vllm-0.32.0-85e7044d (1 calls)"
    apart = [f.detail for f in (await audit_run(database, "r1", against="r2")).findings]
    assert apart[-1] == ("system_fingerprint: r1 vllm-0.32.0-24ca3cec vs r2 vllm-0.32.0-24ca3cec, vllm-0.32.0-85e7044d")


def test_the_command_exits_0_1_or_2(tmp_path: Path) -> None:
    import asyncio

    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(db)

    async def fill() -> None:
        database = open_database(db, null_pool=True)
        try:
            await append(database, *call("a", 0, "same"), *call("b", 1, "same"))
            await append(database, *call("c", 50, "mixed"), *call("d", 51, "mixed", temperature=0.2))
        finally:
            await database.dispose()

    asyncio.run(fill())

    def audit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([LEDGER, "audit", *args, "--db", db], capture_output=True, text=True, timeout=60)

    assert audit("same").returncode == 0
    mixed = audit("mixed", "--format", "json")
    assert mixed.returncode == 1 and '"sampling_varies"' in mixed.stdout
    missing = audit("nope")
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr
