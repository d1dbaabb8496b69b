"""vLLM 0.32's server flags in the emulator: forced usage, per-request metrics, spec-decode metrics."""

from __future__ import annotations

import argparse
from typing import Any

import httpx
import msgspec
import pytest

from tests.emulator.shapes import parse_sse
from usage_ledger.emulator import PROFILES, profile_config, running_emulator, simulate
from usage_ledger.emulator.commands import add_arguments, build_config

FAST = profile_config("moe", speed=1000.0)
TIMING_KEYS = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second"}
SPEC_KEYS = {
    "mean_acceptance_length",
    "draft_acceptance_rate",
    "acceptance_histogram",
    "num_spec_steps",
    "num_accepted_draft_tokens",
    "num_draft_tokens",
    "num_spec_tokens",
    "per_step_accepted",
    "per_step_drafted",
}
CHAT = "/v1/chat/completions"


def _chat(n: int, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hello"}], "max_tokens": n, "min_tokens": n, **extra}


def _events(text: str) -> list[Any]:
    return [e.data for e in parse_sse(text)]


async def _post(cfg: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    async with running_emulator(cfg) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=60) as h:
        r = await h.post(path, json=body)
    assert r.status_code == 200, r.text
    return r


# -- --enable-force-include-usage ------------------------------------------------------------
@pytest.mark.parametrize("path", [CHAT, "/v1/completions"])
async def test_force_include_usage_puts_usage_on_every_chunk(path: str) -> None:
    cfg = profile_config("moe", speed=1000.0, enable_force_include_usage=True)
    body = (
        _chat(12, stream=True)
        if path == CHAT
        else {"prompt": "abcd", "max_tokens": 12, "min_tokens": 12, "stream": True}
    )
    events = _events((await _post(cfg, path, body)).text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all("usage" in c for c in chunks), "forced: usage on every chunk, though the client did not ask"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    running = [c["usage"]["completion_tokens"] for c in chunks[:-1]]
    assert running == sorted(running) and running[-1] == 12
    if path == CHAT:
        assert running[0] == 0  # the role chunk
        assert chunks[0]["usage"]["completion_tokens_details"] is None
    else:
        assert "completion_tokens_details" not in chunks[0]["usage"]


async def test_without_force_an_empty_stream_options_asks_for_no_usage() -> None:
    events = _events((await _post(FAST, CHAT, _chat(4, stream=True, stream_options={}))).text)
    assert all("usage" not in e for e in events[:-1])  # vLLM: include_usage defaults to false


# -- --enable-per-request-metrics ------------------------------------------------------------
async def test_per_request_metrics_non_stream() -> None:
    cfg = profile_config("moe", speed=1000.0, enable_per_request_metrics=True)
    for path, body in ((CHAT, _chat(20)), ("/v1/completions", {"prompt": "abcd", "max_tokens": 20, "min_tokens": 20})):
        metrics = (await _post(cfg, path, body)).json()["metrics"]
        assert set(metrics) == TIMING_KEYS | {"speculative_decoding"}
        assert metrics["speculative_decoding"] is None  # no --per-request-spec-decode-metrics
        assert all(isinstance(metrics[k], float) for k in TIMING_KEYS)
        assert metrics["mean_itl_ms"] == pytest.approx(metrics["generation_time_ms"] / 19)
        assert metrics["time_to_first_token_ms"] > 0 and metrics["tokens_per_second"] > 0


async def test_per_request_metrics_null_itl_for_one_token_and_absent_when_off() -> None:
    cfg = profile_config("moe", speed=1000.0, enable_per_request_metrics=True)
    metrics = (await _post(cfg, CHAT, _chat(1))).json()["metrics"]
    assert metrics["mean_itl_ms"] is None and metrics["generation_time_ms"] == 0.0
    assert (await _post(FAST, CHAT, _chat(3))).json()["metrics"] is None


async def test_per_request_metrics_ride_on_the_final_usage_chunk_only() -> None:
    cfg = profile_config("moe", speed=1000.0, enable_per_request_metrics=True)
    events = _events((await _post(cfg, CHAT, _chat(8, stream=True, stream_options={"include_usage": True}))).text)
    final = events[-2]
    assert final["choices"] == [] and set(final["metrics"]) == TIMING_KEYS  # exclude_none: no null keys
    assert all("metrics" not in e for e in events[:-2])
    # without usage there is no usage chunk, so no metrics either (as in vLLM)
    events = _events((await _post(cfg, CHAT, _chat(8, stream=True))).text)
    assert all("metrics" not in e for e in events[:-1])


# -- --per-request-spec-decode-metrics ---------------------------------------------------------
async def test_spec_decode_summary_without_timing() -> None:
    cfg = profile_config("moe", speed=1000.0, per_request_spec_decode_metrics="summary")
    body = (await _post(cfg, CHAT, _chat(40))).json()
    metrics = body["metrics"]
    assert all(metrics[k] is None for k in TIMING_KEYS)  # the block appears for the spec part alone
    spec = metrics["speculative_decoding"]
    assert set(spec) == SPEC_KEYS and spec["per_step_accepted"] is None and spec["per_step_drafted"] is None
    assert spec["num_spec_tokens"] == 1 and len(spec["acceptance_histogram"]) == 2
    assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"]
    assert spec["num_draft_tokens"] == spec["num_spec_steps"] * 1
    assert spec["mean_acceptance_length"] == pytest.approx(
        1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"]
    )
    # each verify step emits its accepted drafts + 1; the prefill step emits the first token
    emitted = 1 + spec["num_spec_steps"] + spec["num_accepted_draft_tokens"]
    assert 40 <= emitted <= 40 + cfg.spec_tokens


async def test_spec_decode_detailed_stream() -> None:
    cfg = profile_config(
        "dense",
        speed=1000.0,
        spec_tokens=3,
        per_request_spec_decode_metrics="detailed",
        enable_per_request_metrics=True,
    )
    events = _events((await _post(cfg, "/v1/completions", {"prompt": "x", "max_tokens": 60, "stream": True,
                                                            "stream_options": {"include_usage": True}})).text)  # fmt: skip
    spec = events[-2]["metrics"]["speculative_decoding"]
    assert len(spec["per_step_accepted"]) == len(spec["per_step_drafted"]) == spec["num_spec_steps"]
    assert sum(spec["per_step_accepted"]) == spec["num_accepted_draft_tokens"]
    assert set(spec["per_step_drafted"]) == {3} and len(spec["acceptance_histogram"]) == 4
    assert set(events[-2]["metrics"]) == TIMING_KEYS | {"speculative_decoding"}


@pytest.mark.parametrize("profile", ["moe", "dense"])
async def test_spec_decode_acceptance_over_a_run_matches_the_profile(profile: str) -> None:
    cfg = profile_config(profile, speed=1000.0, per_request_spec_decode_metrics="summary")
    async with running_emulator(cfg) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=120) as h:
        accepted = drafted = 0
        for i in range(4):
            body = {"prompt": f"call {i}", "max_tokens": 1500, "min_tokens": 1500}
            spec = (await h.post("/v1/completions", json=body)).json()["metrics"]["speculative_decoding"]
            accepted += spec["num_accepted_draft_tokens"]
            drafted += spec["num_draft_tokens"]
        metrics = (await h.get("/metrics")).text
    assert accepted / drafted == pytest.approx(PROFILES[profile].acceptance_rate, abs=0.03)
    # the per-request counters add up to the server's own spec_decode counters
    assert (
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="{cfg.model}"}} {float(accepted)}'
        in metrics
    )


def test_spec_decode_counters_leave_the_timing_model_alone() -> None:
    for profile in ("moe", "dense"):
        plain = simulate(PROFILES[profile], clients=3, calls=12)
        counted = simulate(profile_config(profile, per_request_spec_decode_metrics="detailed"), clients=3, calls=12)
        assert counted == plain


def test_flag_validation_and_cli() -> None:
    with pytest.raises(ValueError, match="requires speculative decoding"):
        profile_config("moe", spec_tokens=0, per_request_spec_decode_metrics="summary")
    with pytest.raises(ValueError, match="per_request_spec_decode_metrics"):
        profile_config("moe", per_request_spec_decode_metrics="full")  # type: ignore[arg-type]
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(
        [
            "--enable-force-include-usage",
            "--enable-per-request-metrics",
            "--per-request-spec-decode-metrics",
            "detailed",
        ]
    )
    cfg = build_config(args)
    assert (cfg.enable_force_include_usage, cfg.enable_per_request_metrics) == (True, True)
    assert cfg.per_request_spec_decode_metrics == "detailed"
    default = build_config(p.parse_args([]))
    assert not default.enable_force_include_usage and default.per_request_spec_decode_metrics == "none"


# -- prompt_tokens_details (`--enable-prompt-tokens-details`) ----------------------------------
async def test_prompt_tokens_details_layout() -> None:
    cfg = profile_config("moe", speed=1000.0, prompt_tokens_details=True)
    chat = (await _post(cfg, CHAT, _chat(2))).json()["usage"]
    assert chat["prompt_tokens_details"] == {"cached_tokens": 0, "created_cache_tokens": 0, "multimodal_tokens": None}
    assert chat["completion_tokens_details"] is None
    completion = (await _post(cfg, "/v1/completions", {"prompt": "x", "max_tokens": 2})).json()["usage"]
    assert completion["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": None,
        "multimodal_tokens": None,
    }
    stream = _events((await _post(cfg, CHAT, _chat(2, stream=True, stream_options={"include_usage": True}))).text)
    assert stream[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "created_cache_tokens": 0}


def test_metrics_struct_names_follow_vllm() -> None:
    from usage_ledger.emulator.per_request import PerRequestMetrics, SpeculativeDecodingMetrics

    assert set(PerRequestMetrics.__struct_fields__) == TIMING_KEYS | {"speculative_decoding"}
    assert set(SpeculativeDecodingMetrics.__struct_fields__) == SPEC_KEYS
    assert msgspec.json.decode(msgspec.json.encode(PerRequestMetrics()))["speculative_decoding"] is None
