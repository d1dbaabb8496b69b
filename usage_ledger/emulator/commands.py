"""`ledger` subcommands contributed by the emulator package: `ledger emulate`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from usage_ledger.emulator.config import (
    CACHE_DTYPES,
    PROFILES,
    RUNNERS,
    SPEC_DECODE_METRICS_LEVELS,
    EmulatorConfig,
    profile_config,
)
from usage_ledger.emulator.faults import FaultError, parse_faults

__all__ = ("add_arguments", "build_config", "main", "register")

_OVERRIDES: tuple[tuple[str, type, str], ...] = (
    ("max_model_len", int, "context length (tokens)"),
    ("max_num_seqs", int, "most sequences running at once"),
    ("max_num_batched_tokens", int, "token budget per engine step"),
    ("step_base_s", float, "step time: fixed part (emulated s)"),
    ("step_per_seq_s", float, "step time per decoding sequence"),
    ("step_per_ctx_token_s", float, "step time per context token of decoding sequences"),
    ("prefill_per_token_s", float, "step time per prefilled prompt token"),
    ("spec_tokens", int, "speculative draft tokens per step (0 = off)"),
    ("acceptance_rate", float, "accepted / drafted tokens"),
    ("mean_output_tokens", int, "mean natural completion length"),
    ("output_spread", float, "natural length = mean * (1 +- spread), uniform"),
    ("seed", int, "seed of the acceptance draws and of --grade-line labels (a request's own `seed` wins there)"),
    ("embedding_dim", int, "length of /v1/embeddings vectors (default 256)"),
    ("kv_cache_size_tokens", int, "KV cache capacity in tokens (what vLLM sizes from GPU memory)"),
    ("block_size", int, "tokens per KV block (vLLM's flag; default 16)"),
    ("num_gpu_blocks_override", int, "KV blocks, whatever --kv-cache-size-tokens says (vLLM's flag)"),
    ("gpu_memory_utilization", float, "reported in vllm:cache_config_info (vLLM's flag; default 0.9)"),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this package's subcommands to the `ledger` parser."""
    p = sub.add_parser("emulate", help="run the vLLM emulator (OpenAI wire format, continuous-batching timing)")
    add_arguments(p)
    p.set_defaults(func=_run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8200)
    p.add_argument("--profile", choices=sorted(PROFILES), default="moe")
    p.add_argument("--speed", type=float, default=1.0, help="emulated clock runs X times faster than real time")
    p.add_argument("--model", default=None, help="served model name (default: the profile's)")
    p.add_argument(
        "--runner",
        choices=RUNNERS,
        default="generate",
        help="generate: chat/completions/responses; pooling: /v1/embeddings only (vLLM's --runner)",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        help="a fault for every request, repeatable: error-mid-stream[=N], drop-mid-stream[=N], slow-headers=SECONDS, "
        "status=CODE (docs/emulator.md, Faults)",
    )
    p.add_argument("--enable-prompt-tokens-details", action="store_true", help="usage.prompt_tokens_details")
    p.add_argument(
        "--enable-force-include-usage",
        action="store_true",
        help="usage on every streamed chunk and a usage-only chunk, whatever the client asked (vLLM's flag)",
    )
    p.add_argument(
        "--enable-per-request-metrics",
        action="store_true",
        help="a per-request timing `metrics` block in responses and the final stream chunk (vLLM's flag)",
    )
    p.add_argument(
        "--per-request-spec-decode-metrics",
        choices=SPEC_DECODE_METRICS_LEVELS,
        default="none",
        help="metrics.speculative_decoding per request: summary, or detailed with per-step arrays "
        "(needs --spec-tokens > 0, the profiles' MTP)",
    )
    p.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="accept tool_choice=auto (vLLM's flag; needs --tool-call-parser; the answer is text, never a call)",
    )
    p.add_argument("--tool-call-parser", default=None, help="accepted for vLLM parity (any name)")
    p.add_argument(
        "--kv-cache-dtype",
        dest="cache_dtype",
        choices=CACHE_DTYPES,
        default=None,
        help="reported in vllm:cache_config_info (vLLM's flag; the profiles: fp8)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="look prompts up in the prefix cache, counted in vllm:prefix_cache_queries_total; the emulator "
        "never finds a hit (vLLM's flag; the profiles: off)",
    )
    p.add_argument(
        "--grade-line",
        action="store_true",
        help="start each chat/completions answer with a synthetic 'Grade: <label>' line (Strong Sell..Strong Buy, "
        "Hold-heavy), deterministic per model, seed and prompt",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    for name, kind, help_text in _OVERRIDES:
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None, help=help_text)


def build_config(args: argparse.Namespace) -> EmulatorConfig:
    given = [*(name for name, _, _ in _OVERRIDES), "cache_dtype", "enable_prefix_caching"]  # None: the profile's
    overrides: dict[str, Any] = {name: getattr(args, name) for name in given if getattr(args, name) is not None}
    if args.model:
        overrides["model"] = args.model
    parse_faults(args.fault)
    return profile_config(
        args.profile,
        speed=args.speed,
        faults=tuple(args.fault),
        prompt_tokens_details=args.enable_prompt_tokens_details,
        enable_force_include_usage=args.enable_force_include_usage,
        enable_per_request_metrics=args.enable_per_request_metrics,
        per_request_spec_decode_metrics=args.per_request_spec_decode_metrics,
        runner=args.runner,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        grade_line=args.grade_line,
        **overrides,
    )


def _run(args: argparse.Namespace) -> int:
    from usage_ledger.emulator.server import serve

    try:
        config = build_config(args)
    except (ValueError, FaultError) as exc:
        print(f"ledger emulate: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.run(serve(config, args.host, args.port, args.log_level))
    except ImportError:  # pragma: no cover - uvloop missing (Windows)
        asyncio.run(serve(config, args.host, args.port, args.log_level))
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m usage_ledger.emulator`: the same options as `ledger emulate`."""
    parser = argparse.ArgumentParser(prog="python -m usage_ledger.emulator", description="vLLM emulator")
    add_arguments(parser)
    return _run(parser.parse_args(argv))
