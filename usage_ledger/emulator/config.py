"""Emulator settings and the calibrated profiles (`moe`, `dense`)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = (
    "PROFILES",
    "RUNNERS",
    "SPEC_DECODE_METRICS_LEVELS",
    "EmulatorConfig",
    "Runner",
    "SpecDecodeMetricsLevel",
    "profile_config",
)

SpecDecodeMetricsLevel = Literal["none", "summary", "detailed"]
SPEC_DECODE_METRICS_LEVELS: tuple[SpecDecodeMetricsLevel, ...] = ("none", "summary", "detailed")
Runner = Literal["generate", "pooling"]
RUNNERS: tuple[Runner, ...] = ("generate", "pooling")


class EmulatorConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the emulator needs; build it with `profile_config` or directly.

    Step time (emulated seconds) of one engine step:

        step_base_s + step_per_seq_s * decoding_seqs
        + step_per_ctx_token_s * (context tokens of the decoding sequences)
        + prefill_per_token_s * (prompt tokens prefilled in this step)

    `spec_tokens > 0` is the emulated speculative decoding (MTP): each decode step drafts that
    many tokens and accepts them at `acceptance_rate`. The vLLM server flags keep vLLM's names:
    `prompt_tokens_details` (`--enable-prompt-tokens-details`), `enable_force_include_usage`,
    `enable_per_request_metrics`, `per_request_spec_decode_metrics` (`none|summary|detailed`,
    needs `spec_tokens > 0`, as vLLM needs `--speculative-config`), `enable_auto_tool_choice`
    with `tool_call_parser` (tools are accepted; the emulator answers with text, never a call).
    `runner` is vLLM's `--runner`: a `generate` server serves chat, completions and responses, a
    `pooling` one `/v1/embeddings` only (the other's paths are 404, as in vLLM).
    """

    model: str = "emulator-moe"
    runner: Runner = "generate"
    max_model_len: int = 65536
    max_num_seqs: int = 14
    max_num_batched_tokens: int = 8192
    step_base_s: float = 0.00891
    step_per_seq_s: float = 0.000416
    step_per_ctx_token_s: float = 1.188e-8
    prefill_per_token_s: float = 4.0e-5
    spec_tokens: int = 1
    acceptance_rate: float = 0.5
    mean_output_tokens: int = 1470
    output_spread: float = 0.5
    speed: float = 1.0
    seed: int = 0
    prompt_tokens_details: bool = False
    enable_force_include_usage: bool = False
    enable_per_request_metrics: bool = False
    per_request_spec_decode_metrics: SpecDecodeMetricsLevel = "none"
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    embedding_dim: int = 256
    faults: tuple[str, ...] = ()
    max_request_log: int = 100_000

    def __post_init__(self) -> None:
        if self.speed <= 0:
            raise ValueError(f"speed must be > 0, got {self.speed}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 + self.spec_tokens:
            raise ValueError("max_num_seqs must be >= 1 and max_num_batched_tokens must fit one decode step")
        if not 0.0 <= self.acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate must be within [0, 1], got {self.acceptance_rate}")
        if self.spec_tokens < 0:
            raise ValueError(f"spec_tokens must be >= 0, got {self.spec_tokens}")
        if not 0.0 <= self.output_spread < 1.0:
            raise ValueError(f"output_spread must be within [0, 1), got {self.output_spread}")
        if self.per_request_spec_decode_metrics not in SPEC_DECODE_METRICS_LEVELS:
            raise ValueError(
                f"per_request_spec_decode_metrics must be one of {', '.join(SPEC_DECODE_METRICS_LEVELS)}, "
                f"got {self.per_request_spec_decode_metrics!r}"
            )
        if self.per_request_spec_decode_metrics != "none" and self.spec_tokens == 0:
            raise ValueError(
                "--per-request-spec-decode-metrics requires speculative decoding to be enabled (spec_tokens > 0)."
            )
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {', '.join(RUNNERS)}, got {self.runner!r}")
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
        if self.embedding_dim < 1:
            raise ValueError(f"embedding_dim must be >= 1, got {self.embedding_dim}")


# Calibrated with `python bench/emulator.py calibrate` against DESIGN §7 (seed workload:
# prompt 10.8k, output 1.47k tokens per call, 1700 calls). MoE: 14 clients -> ~911 t/s,
# MTP acceptance ~50%; dense 27B: 3 clients -> ~118 t/s, acceptance ~67%.
PROFILES: dict[str, EmulatorConfig] = {
    "moe": EmulatorConfig(
        model="emulator-moe",
        max_model_len=65536,
        max_num_seqs=14,
        max_num_batched_tokens=8192,
        step_base_s=0.00891,
        step_per_seq_s=0.000416,
        step_per_ctx_token_s=1.188e-8,
        prefill_per_token_s=4.0e-5,
        spec_tokens=1,
        acceptance_rate=0.5,
    ),
    "dense": EmulatorConfig(
        model="emulator-dense",
        max_model_len=32768,
        max_num_seqs=3,
        max_num_batched_tokens=8192,
        step_base_s=0.02625,
        step_per_seq_s=0.001406,
        step_per_ctx_token_s=4.687e-8,
        prefill_per_token_s=2.8e-4,
        spec_tokens=1,
        acceptance_rate=0.67,
    ),
}


def profile_config(profile: str = "moe", **overrides: Any) -> EmulatorConfig:
    """The named profile with `overrides` applied (unknown names raise `KeyError`/`TypeError`)."""
    try:
        base = PROFILES[profile]
    except KeyError:
        raise KeyError(f"unknown emulator profile {profile!r}; choose one of {', '.join(sorted(PROFILES))}") from None
    return msgspec.structs.replace(base, **overrides)
