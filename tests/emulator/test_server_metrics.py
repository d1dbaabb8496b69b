"""What the server did: acceptance, KV cache, preemptions, prefix cache and cache config in `/metrics`.

Parsed with prometheus_client's own parser, the way a scraper reads real vLLM; names, types,
HELP texts and label names are held to what vLLM 0.32 exported (tests/fixtures/vllm-0.32.0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from usage_ledger.emulator import EmulatorConfig, profile_config, running_emulator
from usage_ledger.emulator.cache_config import cache_config_labels
from usage_ledger.emulator.commands import add_arguments, build_config
from usage_ledger.emulator.scheduler import Scheduler, Sequence

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"
# The families this file is about, as prometheus_client names them (a counter without `_total`).
FAMILIES = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions",
    "vllm:num_preemptions_created",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_queries_created",
    "vllm:prefix_cache_hits",
    "vllm:prefix_cache_hits_created",
    "vllm:cache_config_info",
    "vllm:num_requests_waiting_by_reason",
)
# DESIGN §7, the user's measurements: MTP acceptance of the MoE and of the dense 27B model
SEED_ACCEPTANCE = {"moe": 0.501, "dense": 0.6695}


def _families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def _value(families: dict[str, Any], family: str, sample: str | None = None, **labels: str) -> float:
    """The one sample of `family` (named `sample`, default the family's name) with `labels`."""
    name = sample or family
    values = [
        s.value
        for s in families[family].samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(values) == 1, (family, name, labels, values)
    return float(values[0])


async def _scrape(h: httpx.AsyncClient) -> dict[str, Any]:
    r = await h.get("/metrics")
    assert r.status_code == 200
    return _families(r.text)


def _shape(family: Any) -> tuple[str, str, frozenset[tuple[str, frozenset[str]]]]:
    return family.type, family.documentation, frozenset((s.name, frozenset(s.labels)) for s in family.samples)


# -- names, types, HELP and labels are vLLM 0.32's -------------------------------------------------
@pytest.mark.parametrize("config", ["defaults", "spec_decode"])
async def test_families_match_real_vllm(config: str) -> None:
    real = _families((FIXTURES / config / "metrics.txt").read_text())
    async with running_emulator(profile_config("moe", speed=1000.0)) as emu, httpx.AsyncClient() as h:
        emulated = _families((await h.get(emu.base_url + "/metrics")).text)
    for name in FAMILIES:
        assert name in real, f"{name}: not in the fixture, the list is wrong"
        assert name in emulated, f"{name}: vLLM exports it, the emulator does not"
        assert _shape(emulated[name]) == _shape(real[name]), name


# -- speculative decoding: the acceptance the user measured, over a run ----------------------------
@pytest.mark.parametrize("profile", ["moe", "dense"])
async def test_acceptance_over_a_run_is_the_measured_one(profile: str) -> None:
    cfg = profile_config(profile, speed=100_000.0)
    calls, out = 300, 200
    body = {"prompt": "a ticker's filing " * 50, "max_tokens": out, "min_tokens": out}
    async with running_emulator(cfg) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=120) as h:
        queue = iter(range(calls))

        async def client() -> None:
            for _ in queue:
                r = await h.post("/v1/completions", json=body)
                assert r.json()["usage"]["completion_tokens"] == out

        await asyncio.gather(*(client() for _ in range(cfg.max_num_seqs)))
        families = await _scrape(h)
    drafted = _value(families, "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_draft_tokens_total")
    accepted = _value(families, "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_total")
    assert _value(families, "vllm:generation_tokens", "vllm:generation_tokens_total") == calls * out
    assert drafted > 30_000  # enough draws for a ±1 % band to mean something (σ ≈ 0.3 %)
    assert accepted / drafted == pytest.approx(SEED_ACCEPTANCE[profile], abs=0.01)


# -- KV cache usage --------------------------------------------------------------------------------
async def _kv_usage_while_running(h: httpx.AsyncClient, streams: int, prompt_tokens: int) -> float:
    """`vllm:kv_cache_usage_perc` once `streams` long completions all emit tokens; then they disconnect."""
    body = {"prompt": "abcd" * prompt_tokens, "max_tokens": 20_000, "min_tokens": 20_000, "stream": True}
    readers = []  # held: a dropped reader is closed when collected, which would disconnect its stream
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(streams):
            r = await stack.enter_async_context(h.stream("POST", "/v1/completions", json=body))
            readers.append(r.aiter_bytes())
            await anext(readers[-1])  # its first token arrived: prefilled and decoding
        families = await _scrape(h)
        assert _value(families, "vllm:num_requests_running") == streams
        usage = _value(families, "vllm:kv_cache_usage_perc")
    for _ in range(500):  # the disconnects abort the requests, which hand their blocks back
        families = await _scrape(h)
        if _value(families, "vllm:num_requests_running") == 0:
            break
        await asyncio.sleep(0.01)
    assert _value(families, "vllm:kv_cache_usage_perc") == 0.0
    return usage


async def test_kv_usage_rises_with_concurrency() -> None:
    cfg = profile_config("moe", speed=10.0)
    prompt_tokens = 8000
    async with running_emulator(cfg) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=60) as h:
        one = await _kv_usage_while_running(h, 1, prompt_tokens)
        eight = await _kv_usage_while_running(h, 8, prompt_tokens)
    capacity = cfg.num_gpu_blocks * cfg.kv_block_size
    assert one >= prompt_tokens / capacity
    assert eight >= 8 * prompt_tokens / capacity
    assert eight > one
    assert eight <= 1.0


def _run(sched: Scheduler) -> list[float]:
    """Step `sched` until idle; the KV usage after each step."""
    usage: list[float] = []
    t = 0.0
    while (plan := sched.schedule()) is not None:
        t += plan.dt
        for seq in sched.complete(plan, t):
            seq.pending.clear()
        usage.append(sched.kv.usage)
    return usage


def test_kv_usage_grows_with_length_in_blocks() -> None:
    cfg = profile_config("moe", block_size=16)
    sched = Scheduler(cfg)
    seq = Sequence("r", 100, 300, "length", 0.0)
    sched.add(seq)
    usage = _run(sched)
    blocks = [round(u * cfg.num_gpu_blocks) for u in usage]
    assert blocks[0] == 7  # 100 prompt tokens in blocks of 16
    assert blocks == [*sorted(blocks[:-1]), 0]  # grows while it decodes, all freed when it finishes
    assert max(blocks) == (100 + 300 + 15) // 16


# -- preemption: recompute, as vLLM's scheduler does -----------------------------------------------
def test_preemption_sends_the_youngest_back_to_wait_and_it_resumes() -> None:
    cfg = profile_config("moe", kv_cache_size_tokens=256, block_size=16, max_model_len=256, max_num_seqs=2)
    sched = Scheduler(cfg)
    older, younger = Sequence("a", 100, 150, "length", 0.0), Sequence("b", 100, 150, "length", 0.0)
    sched.add(older)
    sched.add(younger)
    t = 0.0
    while not sched.preemptions:
        plan = sched.schedule()
        assert plan is not None
        t += plan.dt
        for seq in sched.complete(plan, t):
            seq.pending.clear()
    assert sched.running == [older] and list(sched.waiting) == [younger]
    assert younger.blocks == 0 and younger.computed == 0
    assert younger.prefill_len == 100 + younger.generated  # recompute: prompt and what it generated
    first_token = younger.first_token_at
    _run(sched)
    assert older.generated == younger.generated == 150
    assert younger.first_token_at == first_token
    assert sched.kv.used == 0


async def test_preemptions_counted_and_every_token_served_once() -> None:
    n, prompt_tokens, out = 6, 700, 500  # 6 x 1200 tokens in a 4096-token cache
    body = {"prompt": "abcd" * prompt_tokens, "max_tokens": out, "min_tokens": out}
    results: dict[int, dict[str, Any]] = {}
    for capacity in (4096, profile_config("moe").kv_cache_size_tokens):
        cfg = profile_config("moe", speed=1000.0, kv_cache_size_tokens=capacity, max_model_len=2048)
        async with running_emulator(cfg) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=60) as h:
            answers = await asyncio.gather(*(h.post("/v1/completions", json=body) for _ in range(n)))
            assert all(a.json()["usage"]["completion_tokens"] == out for a in answers)
            results[capacity] = await _scrape(h)
    tight, roomy = results[4096], results[profile_config("moe").kv_cache_size_tokens]
    assert _value(tight, "vllm:num_preemptions", "vllm:num_preemptions_total") > 0
    assert _value(roomy, "vllm:num_preemptions", "vllm:num_preemptions_total") == 0
    for families in (tight, roomy):  # a recomputed prompt is not counted again
        assert _value(families, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == n * prompt_tokens
        assert _value(families, "vllm:generation_tokens", "vllm:generation_tokens_total") == n * out
        assert _value(families, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") == n
        assert _value(families, "vllm:kv_cache_usage_perc") == 0.0


async def test_waiting_by_reason_adds_up_to_waiting() -> None:
    cfg = profile_config("moe", speed=1.0, max_num_seqs=1)
    body = {"prompt": "x", "max_tokens": 20_000, "min_tokens": 20_000, "stream": True}
    async with contextlib.AsyncExitStack() as stack:
        emu = await stack.enter_async_context(running_emulator(cfg))
        h = await stack.enter_async_context(httpx.AsyncClient(base_url=emu.base_url, timeout=60))
        for _ in range(3):  # headers come once a request is submitted; one runs, two wait
            await stack.enter_async_context(h.stream("POST", "/v1/completions", json=body))
        families = await _scrape(h)
    assert _value(families, "vllm:num_requests_waiting") == 2
    assert _value(families, "vllm:num_requests_waiting_by_reason", reason="capacity") == 2
    assert _value(families, "vllm:num_requests_waiting_by_reason", reason="deferred") == 0


# -- prefix cache ----------------------------------------------------------------------------------
async def _prefix_counters(cfg: EmulatorConfig) -> tuple[float, float, float]:
    prompt = {"prompt": "abcd" * 25, "max_tokens": 3}
    bodies = [prompt, prompt, {**prompt, "n": 2}, {**prompt, "echo": True, "logprobs": 1}]
    async with running_emulator(cfg) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=60) as h:
        for body in bodies:
            assert (await h.post("/v1/completions", json=body)).status_code == 200
        families = await _scrape(h)
    return (
        _value(families, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total"),
        _value(families, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total"),
        _value(families, "vllm:prompt_tokens", "vllm:prompt_tokens_total"),
    )


async def test_prefix_cache_off_looks_nothing_up() -> None:
    queries, hits, prompt_tokens = await _prefix_counters(profile_config("moe", speed=1000.0))
    assert (queries, hits) == (0, 0)  # vLLM skips the lookup, and its count, with caching off
    assert prompt_tokens == 5 * 25


async def test_prefix_cache_on_counts_the_looked_up_tokens() -> None:
    queries, hits, prompt_tokens = await _prefix_counters(
        profile_config("moe", speed=1000.0, enable_prefix_caching=True)
    )
    assert prompt_tokens == 5 * 25
    assert queries == 4 * 25  # each engine request once (n=2 is two); prompt logprobs skip the cache
    assert hits == 0


# -- cache config ----------------------------------------------------------------------------------
def test_cache_config_labels_are_real_vllm_s_with_the_seed_s_values() -> None:
    real = _families((FIXTURES / "defaults" / "metrics.txt").read_text())["vllm:cache_config_info"]
    (real_sample,) = real.samples
    moe, dense = cache_config_labels(profile_config("moe")), cache_config_labels(profile_config("dense"))
    assert set(moe) | {"engine"} == set(real_sample.labels)
    assert moe["cache_dtype"] == dense["cache_dtype"] == "fp8"
    assert moe["enable_prefix_caching"] == dense["enable_prefix_caching"] == "False"
    assert (moe["block_size"], moe["num_gpu_blocks"], moe["kv_cache_size_tokens"]) == ("16", "16384", "262144")
    assert (dense["num_gpu_blocks"], dense["kv_cache_max_concurrency"]) == ("4096", "2.0")
    assert (moe["num_gpu_blocks_override"], moe["user_specified_block_size"]) == ("None", "False")
    assert moe["gpu_memory_utilization"] == "0.9"


async def test_cache_config_follows_vllm_s_flags() -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    argv = ["--speed", "1000", "--kv-cache-dtype", "auto", "--enable-prefix-caching", "--block-size", "32"]
    argv += ["--num-gpu-blocks-override", "3000", "--gpu-memory-utilization", "0.85"]
    cfg = build_config(p.parse_args(argv))
    async with running_emulator(cfg) as emu, httpx.AsyncClient(base_url=emu.base_url) as h:
        (sample,) = (await _scrape(h))["vllm:cache_config_info"].samples
    assert sample.value == 1.0 and sample.labels["engine"] == "0"
    assert {k: sample.labels[k] for k in ("cache_dtype", "enable_prefix_caching", "block_size")} == {
        "cache_dtype": "auto",
        "enable_prefix_caching": "True",
        "block_size": "32",
    }
    assert (sample.labels["num_gpu_blocks"], sample.labels["num_gpu_blocks_override"]) == ("3000", "3000")
    assert (sample.labels["kv_cache_size_tokens"], sample.labels["user_specified_block_size"]) == ("96000", "True")
    assert sample.labels["gpu_memory_utilization"] == "0.85"
    assert not build_config(p.parse_args(["--no-enable-prefix-caching"])).enable_prefix_caching


def test_kv_cache_too_small_for_max_model_len_is_refused() -> None:
    with pytest.raises(ValueError, match=r"max seq len \(65536\).*--num-gpu-blocks-override"):
        profile_config("moe", num_gpu_blocks_override=100)
    with pytest.raises(ValueError, match="cache_dtype must be one of"):
        profile_config("moe", cache_dtype="int3")
