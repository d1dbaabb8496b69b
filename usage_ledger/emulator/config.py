"""Emulator settings and the calibrated profiles (`moe`, `dense`)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = (
    "CACHE_DTYPES",
    "DEFAULT_BLOCK_SIZE",
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
# vLLM's `--kv-cache-dtype` choices (`CacheDType`); the emulator reports the dtype, it does not model its size
CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
DEFAULT_BLOCK_SIZE = 16  # what vLLM resolves `--block-size` to on CUDA when it is not given


class EmulatorConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the emulator needs; build it with `profile_config` or directly.

    Step time (emulated seconds) of one engine step:

        step_base_s + step_per_seq_s * decoding_seqs
        + step_per_ctx_token_s * (context tokens of the decoding sequences)
        + prefill_per_token_s * (prompt tokens prefilled in this step)

    `spec_tokens > 0` is the emulated speculative decoding (MTP): each decode step drafts that
    many tokens and accepts them at `acceptance_rate`. The defaults are the `moe` profile. The other
    fields are vLLM's server and KV-cache flags under vLLM's names (docs/emulator.md says what each
    changes); `kv_cache_size_tokens` is the capacity vLLM would size from GPU memory.
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
    acceptance_rate: float = 0.501
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
    kv_cache_size_tokens: int = 262_144
    block_size: int | None = None
    num_gpu_blocks_override: int | None = None
    cache_dtype: str = "fp8"
    enable_prefix_caching: bool = False
    gpu_memory_utilization: float = 0.9
    grade_line: bool = False

    @property
    def kv_block_size(self) -> int:
        """Tokens per KV block (`block_size`, or vLLM's default when not given)."""
        return self.block_size if self.block_size is not None else DEFAULT_BLOCK_SIZE

    @property
    def num_gpu_blocks(self) -> int:
        """KV blocks the engine may hand out (vLLM's `num_gpu_blocks`)."""
        if self.num_gpu_blocks_override is not None:
            return self.num_gpu_blocks_override
        return self.kv_cache_size_tokens // self.kv_block_size

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
        self._check_kv_cache()

    def _check_kv_cache(self) -> None:
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.kv_cache_size_tokens < 1:
            raise ValueError(f"kv_cache_size_tokens must be >= 1, got {self.kv_cache_size_tokens}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError(f"num_gpu_blocks_override must be >= 1, got {self.num_gpu_blocks_override}")
        if self.cache_dtype not in CACHE_DTYPES:
            raise ValueError(f"cache_dtype must be one of {', '.join(CACHE_DTYPES)}, got {self.cache_dtype!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be within (0, 1], got {self.gpu_memory_utilization}")
        capacity = self.num_gpu_blocks * self.kv_block_size
        if capacity < self.max_model_len:  # vLLM refuses to start in this case too
            raise ValueError(
                f"To serve at least one request with the model's max seq len ({self.max_model_len}), "
                f"{self.max_model_len} tokens of KV cache are needed, which is more than the available "
                f"KV cache ({self.num_gpu_blocks} blocks of {self.kv_block_size} = {capacity} tokens). "
                "Increase --kv-cache-size-tokens or --num-gpu-blocks-override, or decrease --max-model-len."
            )


# Calibrated with `python bench/emulator.py calibrate` against DESIGN §7 (seed workload:
# prompt 10.8k, output 1.47k tokens per call, 1700 calls). MoE: 14 clients -> ~911 t/s,
# MTP acceptance 50.1 %; dense 27B: 3 clients -> ~118 t/s, acceptance 66.95 %.
# KV capacity is not in the measurements: a plausible value for a 32 GB RTX 5090 with an fp8 KV
# cache, large enough that the seed's max-num-seqs calls (10.8k + 1.47k tokens each) fit without
# preemption (moe: 14 x ~12.3k = ~172k of 262k tokens; dense: 3 x ~12.3k = ~37k of 64k).
# The seed serves with `--kv-cache-dtype fp8` and prefix caching off.
PROFILES: dict[str, EmulatorConfig] = {
    "moe": EmulatorConfig(),  # the defaults are the moe profile
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
        acceptance_rate=0.6695,
        kv_cache_size_tokens=65_536,
        cache_dtype="fp8",
        enable_prefix_caching=False,
    ),
}


def profile_config(profile: str = "moe", **overrides: Any) -> EmulatorConfig:
    """The named profile with `overrides` applied (unknown names raise `KeyError`/`TypeError`)."""
    try:
        base = PROFILES[profile]
    except KeyError:
        raise KeyError(f"unknown emulator profile {profile!r}; choose one of {', '.join(sorted(PROFILES))}") from None
    return msgspec.structs.replace(base, **overrides)
