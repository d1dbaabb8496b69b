"""`vllm:cache_config_info`: vLLM 0.32's `CacheConfig` as labels, with the emulator's values.

The label set is the one real vLLM 0.32 exports (tests/fixtures/vllm-0.32.0/*/metrics.txt);
what the emulator models comes from its config, the rest keeps the values vLLM reports for a
plain attention model without offloading, KV connector or mamba layers.
"""

from __future__ import annotations

from usage_ledger.emulator.config import EmulatorConfig

__all__ = ("cache_config_labels",)

# vLLM's values for what the emulator does not model (as recorded from vLLM 0.32)
_FIXED = {
    "_block_size_resolved": "True",
    "cache_hit_alignment_tokens": "None",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_memory_bytes": "None",  # only set by --kv-cache-memory-bytes (or the CPU backend)
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "float32",
    "num_cpu_blocks": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
}


def cache_config_labels(config: EmulatorConfig) -> dict[str, str]:
    """The `vllm:cache_config_info` labels (without `engine`), as vLLM writes them (`str()` of each field)."""
    block_size = config.kv_block_size
    size_tokens = config.num_gpu_blocks * block_size
    return {
        **_FIXED,
        "block_size": str(block_size),
        "cache_dtype": config.cache_dtype,
        "effective_attention_block_size": str(block_size),
        "enable_prefix_caching": str(config.enable_prefix_caching),
        "gpu_memory_utilization": str(config.gpu_memory_utilization),
        "kv_cache_max_concurrency": str(size_tokens / config.max_model_len),
        "kv_cache_size_tokens": str(size_tokens),
        "num_gpu_blocks": str(config.num_gpu_blocks),
        "num_gpu_blocks_override": str(config.num_gpu_blocks_override),
        "user_specified_block_size": str(config.block_size is not None),
    }
