"""The tier's assertions on one run (a batch of cases): bytes, reconciliation, stored usage and metrics.

running_stack     vLLM for a configuration and a fresh `ledger serve` in front of it
run_batch         every case straight to vLLM, then through the gateway between two counter reads
assert_*          (a) bytes, (b) reconciliation with vLLM's counters, stored usage, (c) metrics
"""

from __future__ import annotations

import contextlib
import difflib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.gateway.processes import Process, gateway, upgrade
from tests.realvllm import harness
from tests.realvllm.cases import Case, cases_for
from tests.realvllm.harness import LedgerCall, Reply, Tally
from tests.realvllm.servers import CONFIGS, VllmServer
from usage_ledger.ledger.events import CallFinished

__all__ = (
    "Batch",
    "Stack",
    "assert_metrics_stored",
    "assert_reconciles",
    "assert_same_bytes",
    "assert_usage_as_sent",
    "run_batch",
    "running_stack",
)

DRAFTING = frozenset(
    {
        "chat",
        "chat_stream",
        "chat_stream_usage",
        "chat_stream_continuous_usage",
        "completions",
        "completions_stream",
        "completions_stream_usage",
        "completions_stream_continuous_usage",
    }
)


@dataclass
class Stack:
    config: str
    vllm: VllmServer
    gateway: Process
    db_url: str

    @property
    def gateway_url(self) -> str:
        url: str = self.gateway.url  # type: ignore[attr-defined]
        return url

    def case(self, name: str) -> Case:
        return next(c for c in cases_for(self.config) if c.name == name)

    def cases(self, *names: str) -> list[Case]:
        return [self.case(name) for name in names]


@contextlib.contextmanager
def running_stack(vllm_server: Callable[[str], VllmServer], config: str, tmp: Path, db_url: str) -> Iterator[Stack]:
    """vLLM for `config` (shared, see conftest) and a fresh `ledger serve` in front of it, on `db_url`."""
    server = vllm_server(config)
    upgrade(db_url)
    # samples vLLM's /metrics every second, so that a run's opening sample is recent (tests/realvllm/sampling.py)
    proc = gateway(tmp, server.url, db_url, env={"LEDGER_SERVER_SAMPLE_S": "1"}).start()
    try:
        yield Stack(config, server, proc, db_url)
    finally:
        proc.stop()


# --- one run: direct first, then the gateway between two reads of vLLM's counters --------------------


@dataclass
class Exchange:
    case: Case
    direct: Reply
    gateway: Reply


@dataclass
class Batch:
    stack: Stack
    run: str
    exchanges: list[Exchange]
    vllm: Tally  # the counters' deltas over the gateway's requests only
    calls: list[LedgerCall]

    def call(self, case: str) -> LedgerCall:
        found = [c for c in self.calls if c.case == case]
        assert len(found) == 1, f"{self.run}: {len(found)} ledger calls tagged case={case}"
        return found[0]


def run_batch(stack: Stack, run: str, cases: list[Case]) -> Batch:
    direct = harness.sdk_client(stack.vllm.url)
    directs = [harness.send_case(direct, case) for case in cases]
    before = harness.scrape_counters(stack.vllm.url)
    client = harness.sdk_client(stack.gateway_url, **{"X-Ledger-Run": run})
    replies = [harness.send_case(client, case, **{"X-Ledger-Tag-Case": case.name}) for case in cases]
    after = harness.scrape_counters(stack.vllm.url)
    exchanges = [Exchange(c, d, g) for c, d, g in zip(cases, directs, replies, strict=True)]
    for ex in exchanges:
        assert ex.direct.status == ex.case.expected_status(stack.config), f"{ex.case.name}: {ex.direct.text[:300]}"
    return Batch(stack, run, exchanges, after - before, harness.ledger_calls(stack.db_url, run))


def _first_difference(direct: list[str], through: list[str]) -> str:
    diff = difflib.unified_diff(direct, through, "direct from vLLM", "through the gateway", n=0, lineterm="")
    return "\n".join(line[:400] for line in list(diff)[:12])


def assert_same_bytes(batch: Batch, *, sampled_text: bool = False) -> None:
    """(a) Every reply through the gateway is what vLLM sends for the same request.

    Line by line, data line for data line. Where the two differ only in how vLLM coalesced tokens
    into chunks (it does so under load, and the gateway's process is load on a two-core machine),
    the streams are compared with that merge undone (`harness.canonical`), which keeps a dropped or
    added chunk — a usage chunk, a role chunk, `[DONE]`, any Responses event — visible.

    `sampled_text`: the generated text is vLLM's to vary (sampling under speculative decoding is not
    reproducible, even seeded), so it is blanked and everything around it compared.
    """
    problems = []
    for ex in batch.exchanges:
        name, gw, direct = ex.case.name, ex.gateway, ex.direct
        if (gw.status, gw.content_type) != (direct.status, direct.content_type):
            problems.append(f"{name}: status/type {gw.status} {gw.content_type!r}, vLLM {direct.status}")
            continue
        if not sampled_text and harness.comparable(gw) == harness.comparable(direct):
            continue
        if harness.canonical(gw, blank_text=sampled_text) == harness.canonical(direct, blank_text=sampled_text):
            continue  # the same stream, chunked differently by vLLM
        counts = ""
        if gw.content_type.startswith("text/event-stream"):
            counts = f" ({len(harness.data_lines(gw))} data lines, vLLM sent {len(harness.data_lines(direct))})"
        problems.append(
            f"{name}: bytes differ{counts}\n"
            + _first_difference(
                harness.canonical(direct, blank_text=sampled_text), harness.canonical(gw, blank_text=sampled_text)
            )
        )
    assert not problems, f"{batch.run}: {len(problems)} replies differ from vLLM's:\n\n" + "\n\n".join(problems)


def engine_requests(case: Case) -> int:
    """How many requests vLLM's counters count for one call of `case`.

    vLLM fans a call out: `n` > 1 becomes n engine requests (each counted in request_success_total
    and each counting the whole prompt in prompt_tokens_total, while the response's usage counts
    the prompt once), and an embeddings input list becomes one request per input (whose usage sums them).
    """
    body = case.body if isinstance(case.body, dict) else {}
    if case.path == "/v1/embeddings" and isinstance(body.get("input"), list):
        return len(body["input"])
    return int(body.get("n", 1))


def prompt_repeats(case: Case) -> int:
    """How often vLLM's prompt_tokens_total counts the prompt of one call (n sequences: n times)."""
    body = case.body if isinstance(case.body, dict) else {}
    return int(body.get("n", 1))


def assert_reconciles(batch: Batch) -> None:
    """(b) The ledger's calls and tokens, from the events and from the report, equal vLLM's deltas."""
    inference = [ex for ex in batch.exchanges if ex.case.method == "POST"]
    call_ids = {c.started.call_id for c in batch.calls}
    missing = [ex.case.name for ex in inference if ex.gateway.call_id not in call_ids]
    assert not missing, f"{batch.run}: calls not in the ledger: {missing}"
    assert len(batch.calls) == len(inference), f"{batch.run}: {len(batch.calls)} calls for {len(inference)} requests"
    unfinished = [c.case for c in batch.calls if c.end is None]
    assert not unfinished, f"{batch.run}: calls without a final event: {unfinished}"

    by_case = {ex.case.name: ex.case for ex in inference}
    ok = [c for c in batch.calls if isinstance(c.end, CallFinished) and c.end.status < 400]
    expected = Tally(
        calls=sum(engine_requests(by_case[c.case]) for c in ok),
        prompt_tokens=sum(c.prompt_tokens * prompt_repeats(by_case[c.case]) for c in ok),
        completion_tokens=sum(c.completion_tokens for c in ok),
    )
    failed = [c for c in batch.calls if c not in ok]
    detail = {c.case: (c.prompt_tokens, c.completion_tokens, getattr(c.end, "usage_source", None)) for c in batch.calls}
    assert expected == batch.vllm, (
        f"{batch.run}: the ledger (ok calls, as engine requests) {expected} != vLLM's counters {batch.vllm}\n"
        f"per call (prompt, completion, usage_source): {detail}"
    )
    assert all(c.prompt_tokens == c.completion_tokens == 0 for c in failed), f"{batch.run}: {detail}"

    events = harness.ledger_tally(batch.calls)
    row = harness.report_row(batch.stack.db_url, batch.run)
    report = Tally(row["calls"], row["input_tokens"], row["output_tokens"])
    assert report == events, f"{batch.run}: `ledger report runs` {report} != the events {events}"
    assert row["failed_calls"] == len(failed), f"{batch.run}: failed_calls {row['failed_calls']}, events {len(failed)}"


def assert_usage_as_sent(batch: Batch) -> None:
    """Each call's stored usage is the usage vLLM put in the bytes (when the client saw any)."""
    problems = []
    for ex in batch.exchanges:
        if ex.case.method != "POST" or ex.gateway.status >= 400:
            continue
        sent = sent_usage(ex.gateway)
        if sent is None:
            continue
        call = batch.call(ex.case.name)
        if (call.prompt_tokens, call.completion_tokens) != sent:
            problems.append(f"{ex.case.name}: stored {(call.prompt_tokens, call.completion_tokens)}, vLLM sent {sent}")
    assert not problems, f"{batch.run}: " + "; ".join(problems)


def sent_usage(reply: Reply) -> tuple[int, int] | None:
    if reply.content_type.startswith("text/event-stream"):
        objects = harness.sse_json(reply)
    else:
        objects = [json.loads(reply.text)]
    for obj in reversed(objects):
        usage = obj.get("usage") or (obj.get("response") or {}).get("usage")
        if usage:
            prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
            return int(prompt), int(usage.get("completion_tokens", usage.get("output_tokens", 0)))
    return None


def metrics_expected(config: str, case: Case) -> bool:
    """vLLM computes the block with --enable-per-request-metrics, for n == 1 (it suppresses it for n > 1)."""
    body = case.body if isinstance(case.body, dict) else {}
    return "--enable-per-request-metrics" in CONFIGS[config] and int(body.get("n", 1)) == 1


def assert_metrics_stored(batch: Batch) -> None:
    """(c) vLLM's per-request metrics block is on the call, as sent; under spec decoding drafts were accepted."""
    problems = []
    for ex in batch.exchanges:
        if ex.case.method != "POST" or ex.gateway.status >= 400 or not metrics_expected(batch.stack.config, ex.case):
            continue
        end = batch.call(ex.case.name).end
        stored: dict[str, Any] | None = getattr(end, "request_metrics", None)
        sent = harness.sent_metrics(ex.gateway)
        if stored is None:
            problems.append(f"{ex.case.name}: no request_metrics stored (the client got {sent})")
            continue
        if sent is not None and stored != sent:
            problems.append(f"{ex.case.name}: stored {stored}, vLLM sent {sent}")
        if "--speculative-config" in CONFIGS[batch.stack.config] and ex.case.name in DRAFTING:
            spec = stored.get("speculative_decoding") or {}
            if not spec.get("num_accepted_draft_tokens"):
                problems.append(f"{ex.case.name}: no accepted drafts in {spec}")
    assert not problems, f"{batch.run}: " + "\n".join(problems)
