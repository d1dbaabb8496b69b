"""Real vLLM (CPU) behind the real `ledger serve`, driven with the real openai SDK.

Per configuration (servers.CONFIGS) and per run (X-Ledger-Run), every case is sent once straight to
vLLM and once through the gateway, and the tier asserts:

(a) the client gets the bytes vLLM sends (ids, clocks and metrics timings aside; SSE line by line);
(b) the ledger's calls and tokens equal the deltas of vLLM's own counters over the gateway's requests
    (`vllm:request_success_total`, `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`), read
    both from the events and from `ledger report runs`;
(c) vLLM's per-request `metrics` block (with `speculative_decoding` under spec decoding) is stored
    on the call, and an aborted stream still records its output tokens.

Some of these fail against a gateway with the bugs the tier was written to catch; do not weaken them.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.processes import LEDGER
from tests.realvllm import harness, sampling
from tests.realvllm.checks import (
    Batch,
    Stack,
    assert_metrics_stored,
    assert_reconciles,
    assert_same_bytes,
    assert_usage_as_sent,
    run_batch,
    running_stack,
)
from tests.realvllm.harness import LedgerCall, Tally
from tests.realvllm.leave import LONG_STREAM_TOKENS, leave_stream
from tests.realvllm.promtext import parse_samples, total
from tests.realvllm.servers import (
    CONFIGS,
    VllmServer,
    default_vllm_python,
    missing_vllm_message,
    vllm_required,
)
from tests.realvllm.spellings import send_other_apis, send_spellings
from usage_ledger.ledger.events import CallFinished

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.serial, pytest.mark.timeout(900)]

if not default_vllm_python().exists() and not vllm_required():
    # one line under `pytest -ra`; when the tier is required, every test fails instead (conftest)
    pytest.skip(missing_vllm_message(default_vllm_python()), allow_module_level=True)

# The cases long enough for n-gram drafts (the output repeats with period 5, drafts need 2 tokens of match)
# --- the runs: one class per configuration, so each vLLM server starts once, in this order ------------

BASIC = (
    "chat",
    "chat_stream",
    "chat_stream_usage",
    "chat_stream_continuous_usage",
    "chat_logprobs",
    "chat_stop",
    "completions",
    "completions_stream",
    "completions_stream_usage",
    "completions_stream_continuous_usage",
    "completions_logprobs_echo",
)
RESPONSES = ("responses", "responses_stream")
SAMPLED = ("chat_n2", "chat_stream_n2", "completions_n2")
ABORT_ATTEMPTS = 20
ERRORS = ("error_unknown_model", "error_bad_json", "error_too_long", "error_too_long_stream")


@pytest.fixture(scope="class")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The class's configuration (its `config` attribute): vLLM and a fresh `ledger serve` on SQLite."""
    config: str = request.cls.config
    tmp = tmp_path_factory.mktemp(f"stack-{config}")
    vllm_server = request.getfixturevalue("vllm_server")
    with running_stack(vllm_server, config, tmp, f"sqlite:///{tmp / 'ledger.db'}") as running:
        yield running


@pytest.fixture(scope="class")
def basic(stack: Stack) -> Batch:
    return run_batch(stack, f"{stack.config}-basic", stack.cases(*BASIC))


@pytest.fixture(scope="class")
def responses(stack: Stack) -> Batch:
    return run_batch(stack, f"{stack.config}-responses", stack.cases(*RESPONSES))


@pytest.fixture(scope="class")
def sampled(stack: Stack) -> Batch:
    return run_batch(stack, f"{stack.config}-n2", stack.cases(*SAMPLED))


@pytest.fixture(scope="class")
def errors(stack: Stack) -> Batch:
    return run_batch(stack, f"{stack.config}-errors", stack.cases(*ERRORS))


@pytest.fixture(scope="class")
def embedded(stack: Stack) -> Batch:
    return run_batch(stack, "embeddings-basic", stack.cases("embeddings", "embeddings_batch", "embeddings_base64"))


def sent_finish_reason(body: bytes) -> str:
    """Choice 0's `finish_reason` in a chat body or stream as the client received it."""
    if not body.startswith(b"data:"):
        return str(json.loads(body)["choices"][0]["finish_reason"])
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices") or ():
                if choice.get("index") == 0 and choice.get("finish_reason") is not None:
                    return str(choice["finish_reason"])
    raise AssertionError("no finish_reason in the stream")


class GenerateTier:
    """Every generation configuration runs these; subclasses name the configuration."""

    config: str

    def test_basic_bytes(self, basic: Batch) -> None:
        assert_same_bytes(basic)

    def test_basic_reconciles(self, basic: Batch) -> None:
        assert_reconciles(basic)

    def test_basic_usage_as_sent(self, basic: Batch) -> None:
        assert_usage_as_sent(basic)

    def test_basic_finish_reasons_as_sent(self, basic: Batch) -> None:
        """Choice 0's finish reason as the gateway's client received it, non-stream and stream alike."""
        for case in ("chat", "chat_stop", "chat_stream"):
            exchange = next(e for e in basic.exchanges if e.case.name == case)
            end = basic.call(case).end
            assert isinstance(end, CallFinished)
            assert end.finish_reasons == [sent_finish_reason(exchange.gateway.body)] and end.finish_choices == [0], case

    def test_responses_bytes(self, responses: Batch) -> None:
        assert_same_bytes(responses)

    def test_responses_reconcile(self, responses: Batch) -> None:
        assert_reconciles(responses)
        assert_usage_as_sent(responses)

    def test_responses_sdk_parses(self, stack: Stack) -> None:
        """The SDK's own parsing of the Responses API through the gateway (text, and the stream's events)."""
        client = harness.sdk_client(stack.gateway_url, **{"X-Ledger-Run": f"{stack.config}-responses-sdk"})
        body = stack.case("responses").body
        assert isinstance(body, dict)
        response = client.responses.create(**body)
        assert response.output_text and response.usage is not None and response.usage.output_tokens > 0
        kinds = [event.type for event in client.responses.create(**body, stream=True)]
        assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
        assert "response.output_text.delta" in kinds

    def test_n2_bytes(self, sampled: Batch) -> None:
        # vLLM 0.32 (CPU) samples unreproducibly under n-gram speculative decoding, seed or not
        # (tokens the model gives ~e^-33 appear, and differ between two identical requests)
        assert_same_bytes(sampled, sampled_text="--speculative-config" in CONFIGS[sampled.stack.config])

    def test_n2_reconciles(self, sampled: Batch) -> None:
        assert_reconciles(sampled)
        assert_usage_as_sent(sampled)

    def test_errors_bytes(self, errors: Batch) -> None:
        assert_same_bytes(errors)

    def test_errors_reconcile(self, errors: Batch) -> None:
        """Rejected requests never reach vLLM's engine: its counters stay put; the ledger has them as failed."""
        assert errors.vllm == Tally(0, 0, 0)
        assert_reconciles(errors)

    def test_tools(self, stack: Stack) -> None:
        """Tools with `tool_choice: auto`: the hermes parser where enabled, vLLM's 400 where not."""
        batch = run_batch(stack, f"{stack.config}-tools", stack.cases("chat_tools", "chat_tools_stream"))
        assert_same_bytes(batch)
        assert_reconciles(batch)

    def test_non_inference_paths_pass_through_unrecorded(self, stack: Stack) -> None:
        """GET /v1/models, /health, /ping, /version and /metrics: proxied unchanged, and no call in the ledger."""
        run = f"{stack.config}-paths"
        before = len(harness.ledger_calls(stack.db_url))
        headers = {"X-Ledger-Run": run}
        models = stack.case("models")
        direct = harness.send_case(harness.sdk_client(stack.vllm.url), models)
        through = harness.send_case(harness.sdk_client(stack.gateway_url, **headers), models)
        assert (through.status, through.content_type, harness.comparable(through)) == (
            direct.status,
            direct.content_type,
            harness.comparable(direct),
        )
        for path in ("/health", "/ping", "/version"):
            d = httpx.get(stack.vllm.url + path, timeout=30)
            g = httpx.get(stack.gateway_url + path, headers=headers, timeout=30)
            got = (g.status_code, g.headers.get("content-type"), g.content)
            assert got == (d.status_code, d.headers.get("content-type"), d.content), path
        d = httpx.get(stack.vllm.url + "/metrics", timeout=30)
        g = httpx.get(stack.gateway_url + "/metrics", headers=headers, timeout=30)
        assert g.status_code == d.status_code == 200
        assert g.headers.get("content-type") == d.headers.get("content-type")
        # a live page (its own request counters move between two reads): compare the series, not the values
        direct_series = {(n, tuple(sorted(labels.items()))) for n, labels, _ in parse_samples(d.text)}
        gateway_series = {(n, tuple(sorted(labels.items()))) for n, labels, _ in parse_samples(g.text)}
        assert direct_series <= gateway_series, sorted(direct_series - gateway_series)[:10]
        after = harness.ledger_calls(stack.db_url)
        assert len(after) == before, [(c.started.method, c.started.path) for c in after[before:]]

    def test_server_block_reconciles(self, stack: Stack) -> None:
        """`ledger serve` samples vLLM's /metrics: a run only the gateway sent equals vLLM's counter deltas."""
        run = f"{stack.config}-sampled"
        sampling.run_through_gateway(stack, run, ("chat", "chat_stream_usage", "completions", "completions_stream"))
        server = sampling.server_block(stack, run)
        assert server["reconciled"] is True, server
        assert server["server_requests"] == server["ledger_calls"] == 4
        assert server["config"]["enable_prefix_caching"] in ("True", "False") and server["config"]["block_size"]
        if "--speculative-config" in CONFIGS[stack.config]:
            assert 0 < server["spec_decode_acceptance_rate"] <= 1, server
            assert server["spec_decode_mean_acceptance_length"] >= 1, server
        else:
            assert server["spec_decode_acceptance_rate"] is None, server
        result = subprocess.run(
            [LEDGER, "reconcile", "--run", run, "--db", stack.db_url], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stdout + result.stderr

    def test_server_block_shows_calls_that_bypassed_the_gateway(self, stack: Stack) -> None:
        """Calls sent straight to vLLM during a run: the difference is exactly their requests and tokens."""
        run = f"{stack.config}-bypassed"
        bypassed = sampling.run_through_gateway(
            stack, run, ("chat", "completions"), bypass=("chat", "completions_stream_usage")
        )
        assert all(usage is not None for usage in bypassed), bypassed
        server = sampling.server_block(stack, run)
        assert server["reconciled"] is False, server
        assert server["difference"] == {
            "requests": 2,
            "prompt_tokens": sum(u[0] for u in bypassed if u),
            "generation_tokens": sum(u[1] for u in bypassed if u),
        }, server
        result = subprocess.run(
            [LEDGER, "reconcile", "--db", stack.db_url, "--format", "json"], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 1 and run in {r["run"] for r in json.loads(result.stdout)}, result.stdout

    def test_abort_mid_stream(self, stack: Stack) -> None:
        """A client that leaves mid-stream: vLLM aborts the request; the ledger still has its output tokens.

        What vLLM counts for it: not a request (`request_success_total` counts finished requests, and
        its `finished_reason="abort"` series only engine-side aborts, not a client's), but the prompt
        and every token generated before the abort reached the engine — at least what the client
        saw. So the ledger's completion tokens (the last per-chunk usage, or the chunks it counted)
        are a lower bound of vLLM's, and its one failed call has no counterpart in vLLM's requests.

        On vLLM CPU the engine sometimes generates all of a stream before its client has the fourth
        chunk: the chunks arrive 1-2 s late while the engine runs on, with no gateway in the path, on
        two cores with one more busy process (`bench/vllm_stalls.py --busy 1`, docs/real-vllm.md).
        Such a stream tests nothing about aborting, so the client tries again, up to ABORT_ATTEMPTS
        times, in one run (a run's first call makes the gateway sample /metrics, one more stall):
        every attempt's call is held to vLLM's count, the first one vLLM did not finish to all the
        checks. A gateway that never cancelled the upstream request fails every attempt.
        """
        for attempt in range(ABORT_ATTEMPTS):
            call, vllm = _leave_mid_stream(stack, f"{stack.config}-abort", f"abort-{attempt}")
            assert call.completion_tokens > 0, f"the aborted stream recorded no output tokens: {call.end}"
            assert call.completion_tokens <= vllm.completion_tokens, (call.completion_tokens, vllm)
            if vllm.calls == 0:
                break
        else:
            pytest.fail(f"vLLM finished all {ABORT_ATTEMPTS} streams: none was aborted when its client left")
        end = call.end
        assert vllm.completion_tokens < LONG_STREAM_TOKENS, f"vLLM generated to the end, nothing aborted it: {vllm}"
        assert end.usage_source in ("partial", "counted"), f"usage_source {end.usage_source!r} for an aborted stream"
        if end.usage_source == "partial":  # the last per-chunk usage carries the prompt's tokens
            assert call.prompt_tokens == vllm.prompt_tokens, (call.prompt_tokens, vllm)


def _leave_mid_stream(stack: Stack, run: str, case: str) -> tuple[LedgerCall, Tally]:
    """One stream through the gateway that its client leaves at the fourth chunk: its ledger call, and
    vLLM's counters over it once vLLM is idle again."""
    client = harness.sdk_client(stack.gateway_url, **{"X-Ledger-Run": run, "X-Ledger-Tag-Case": case})
    before = harness.scrape_counters(stack.vllm.url)
    leave_stream(client)
    vllm = harness.scrape_counters(stack.vllm.url) - before
    calls = [c for c in harness.ledger_calls(stack.db_url, run) if c.case == case]
    assert len(calls) == 1 and calls[0].end is not None, calls
    return calls[0], vllm


class MetricsTier:
    """Configurations with --enable-per-request-metrics: the block is stored on every call that had one."""

    def test_basic_metrics(self, basic: Batch) -> None:
        assert_metrics_stored(basic)

    def test_responses_metrics(self, responses: Batch) -> None:
        assert_metrics_stored(responses)


class TestDefaults(GenerateTier):
    config = "defaults"

    @pytest.mark.pg
    def test_postgresql_ledger(
        self, vllm_server: Callable[[str], VllmServer], fresh_pg_url: str, tmp_path: Path
    ) -> None:
        """One run recorded into PostgreSQL reconciles as SQLite's do (a second gateway, the same vLLM)."""
        with running_stack(vllm_server, self.config, tmp_path, fresh_pg_url) as pg:
            cases = pg.cases("chat", "chat_stream", "completions_stream_usage", "responses_stream")
            batch = run_batch(pg, "defaults-postgresql", cases)
            assert_reconciles(batch)
            assert_usage_as_sent(batch)

    def test_every_spelling_vllm_answers_is_recorded_or_refused(self, stack: Stack) -> None:
        """Issue #52: `/v1/chat/%63ompletions`, `…completion%73` and `…completions#frag` were answered by vLLM
        (uvicorn decodes the path, httptools cuts the fragment) and relayed with no call in the ledger."""
        run = f"{self.config}-spellings"
        outcomes = send_spellings(stack, run)
        calls = {c.started.call_id: c for c in harness.ledger_calls(stack.db_url, run)}
        for o in outcomes:
            if o.refused:
                assert o.call_id is None and o.vllm == Tally(0, 0, 0), o
                continue
            if o.direct_inference or o.vllm.calls:
                assert o.status == 200 and o.call_id in calls, o  # recorded, with what vLLM counted for it
                assert harness.ledger_tally([calls[o.call_id]]) == o.vllm, (o, calls[o.call_id])
        answered = {o.target for o in outcomes if o.direct_inference}
        assert {b"/v1/chat/%63ompletions", b"/v1/chat/completion%73", b"/v1/chat/completions#frag"} <= answered
        assert len(calls) == sum(o.call_id is not None for o in outcomes)

    def test_other_inference_apis_are_recorded(self, stack: Stack) -> None:
        """`/v1/messages`, `/invocations` and `/v1/chat/completions/batch` generate too; they were relayed unrecorded."""
        run = f"{self.config}-other-apis"
        outcomes = send_other_apis(stack, run)
        calls = {c.started.call_id: c for c in harness.ledger_calls(stack.db_url, run)}
        for o in outcomes:
            assert o.direct_inference and o.vllm.calls > 0, o
            assert o.status == 200 and o.call_id in calls, o
            recorded = harness.ledger_tally([calls[o.call_id]])
            assert (recorded.prompt_tokens, recorded.completion_tokens) == (
                o.vllm.prompt_tokens,
                o.vllm.completion_tokens,
            ), (o, calls[o.call_id])


class TestForceUsageMetrics(MetricsTier, GenerateTier):
    config = "force_usage_metrics"


class TestSpecDecode(MetricsTier, GenerateTier):
    config = "spec_decode"

    def test_acceptance_from_every_calls_block_equals_vllms_counters(self, stack: Stack) -> None:
        """`--per-request-spec-decode-metrics summary`: the run's acceptance is summed from each call's own
        block, and vLLM's counters over the run, read straight from its /metrics, are the oracle."""
        counters = [f"vllm:spec_decode_num_{n}_total" for n in ("drafts", "draft_tokens", "accepted_tokens")]

        def read() -> list[float]:
            page = parse_samples(httpx.get(stack.vllm.url + "/metrics", timeout=30).text)
            return [total(page, name) for name in counters]

        run = f"{stack.config}-blocks"
        time.sleep(sampling.QUIET_S)  # earlier tests' calls are behind the first read
        before = read()
        sampling.run_through_gateway(stack, run, ("chat", "chat_stream_usage", "completions", "completions_stream"))
        server = sampling.server_block(stack, run)
        drafts, draft_tokens, accepted = (b - a for a, b in zip(before, read(), strict=True))
        assert server["sources"]["spec_decode_acceptance_rate"] == (
            "vllm per-request speculative_decoding blocks summed over 4 calls"
        ), server
        assert draft_tokens > 0 and server["spec_decode_acceptance_rate"] == pytest.approx(accepted / draft_tokens)
        assert server["spec_decode_mean_acceptance_length"] == pytest.approx(1 + accepted / drafts)


class TestEmbeddings:
    """The pooling runner: /v1/embeddings (a list input is one call, and several engine requests)."""

    config = "embeddings"

    def test_embeddings_bytes(self, embedded: Batch) -> None:
        assert_same_bytes(embedded)

    def test_embeddings_reconcile(self, embedded: Batch) -> None:
        assert_reconciles(embedded)
        assert_usage_as_sent(embedded)

    def test_embeddings_errors(self, stack: Stack) -> None:
        batch = run_batch(stack, "embeddings-errors", stack.cases("error_unknown_model", "error_too_long"))
        assert_same_bytes(batch)
        assert batch.vllm == Tally(0, 0, 0)
        assert_reconciles(batch)

    def test_generation_route_absent(self, stack: Stack) -> None:
        """A pooling server has no chat route: its 404 passes through (and is a failed call, no tokens)."""
        batch = run_batch(stack, "embeddings-chat", stack.cases("error_chat_on_pooling"))
        assert_same_bytes(batch)
        assert_reconciles(batch)
