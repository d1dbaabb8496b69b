"""Reading vLLM's `/metrics`: the recorded real output of vLLM 0.32, and any text at all."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from usage_ledger.gateway.upstream_metrics import COUNTERS, MetricsUnreadable, parse_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"


def test_the_spec_decode_servers_counters_gauges_and_config() -> None:
    parsed = parse_metrics((FIXTURES / "spec_decode" / "metrics.txt").read_text())
    assert parsed.counters == {
        "vllm:request_success_total": 19.0,  # summed over finished_reason
        "vllm:prompt_tokens_total": 381.0,
        "vllm:generation_tokens_total": 271.0,
        "vllm:num_preemptions_total": 0.0,
        "vllm:prefix_cache_queries_total": 370.0,
        "vllm:prefix_cache_hits_total": 0.0,
        "vllm:spec_decode_num_drafts_total": 49.0,
        "vllm:spec_decode_num_draft_tokens_total": 147.0,
        "vllm:spec_decode_num_accepted_tokens_total": 97.0,
    }
    assert parsed.gauges == {
        "vllm:num_requests_running": 0.0,
        "vllm:num_requests_waiting": 0.0,
        "vllm:kv_cache_usage_perc": 0.0,
    }
    assert parsed.accepted_per_pos == [35.0, 31.0, 31.0]
    assert sum(parsed.accepted_per_pos) == parsed.counters["vllm:spec_decode_num_accepted_tokens_total"]
    assert parsed.config is not None
    assert parsed.config["cache_dtype"] == "auto" and parsed.config["enable_prefix_caching"] == "True"
    assert parsed.config["block_size"] == "128" and "engine" not in parsed.config


@pytest.mark.parametrize("config", ["defaults", "force_usage_metrics", "embeddings"])
def test_every_recorded_server_reads(config: str) -> None:
    parsed = parse_metrics((FIXTURES / config / "metrics.txt").read_text())
    assert parsed.counters["vllm:request_success_total"] > 0
    assert "vllm:spec_decode_num_drafts_total" not in parsed.counters  # no spec decoding there
    assert parsed.accepted_per_pos == []


def test_engines_are_summed_and_the_fullest_kv_cache_kept() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 4\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0"} 0.25\nvllm:kv_cache_usage_perc{engine="1"} 0.5\n'
        "# TYPE vllm:prompt_tokens counter\n"
        'vllm:prompt_tokens_total{engine="0"} 10\nvllm:prompt_tokens_total{engine="1"} 5\n'
    )
    parsed = parse_metrics(text)
    assert parsed.gauges == {"vllm:num_requests_running": 7.0, "vllm:kv_cache_usage_perc": 0.5}
    assert parsed.counters == {"vllm:prompt_tokens_total": 15.0}


@pytest.mark.parametrize(
    "text",
    ["", "<html>502 Bad Gateway</html>", "vllm:prompt_tokens_total{ 1", "process_cpu_seconds_total 3\n", "\x00\xff"],
)
def test_text_that_is_no_vllm_metrics_is_refused_clearly(text: str) -> None:
    with pytest.raises(MetricsUnreadable):
        parse_metrics(text)


@settings(max_examples=300, deadline=None)
@given(
    st.text() | st.sampled_from([(FIXTURES / "defaults" / "metrics.txt").read_text()[:n] for n in range(0, 4000, 97)])
)
def test_any_text_reads_or_is_refused_never_crashes(text: str) -> None:
    try:
        parsed = parse_metrics(text)
    except MetricsUnreadable:
        return
    assert set(parsed.counters) <= set(COUNTERS)
    assert set(parsed.gauges) <= {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}
    assert all(v == v for v in [*parsed.counters.values(), *parsed.gauges.values()])  # no NaN kept
