"""A vLLM 0.32 stand-in: OpenAI wire format plus a continuous-batching timing model, no GPU.

Run it: ``ledger emulate [--host 127.0.0.1] [--port 8200] [--profile moe|dense] [--speed X]
[--model NAME] [--fault SPEC]...`` (or ``python -m usage_ledger.emulator`` with the same options). Every
profile parameter has a flag (``--max-num-seqs``, ``--acceptance-rate``, ``--step-base-s`` ...).
vLLM's own server flags keep their names: ``--runner generate|pooling``,
``--enable-prompt-tokens-details``, ``--enable-force-include-usage``,
``--enable-per-request-metrics``, ``--per-request-spec-decode-metrics none|summary|detailed``,
``--enable-auto-tool-choice`` with ``--tool-call-parser``; the KV cache's ``--kv-cache-dtype``,
``--[no-]enable-prefix-caching``, ``--block-size``, ``--num-gpu-blocks-override``,
``--gpu-memory-utilization`` (and the emulator's ``--kv-cache-size-tokens``). See docs/emulator.md.

The wire shapes are vLLM 0.32's, checked against transcripts recorded from the real server
(tests/emulator/test_shape.py): when the two disagree, the real server wins.

Public API::

    EmulatorConfig, PROFILES, profile_config(profile="moe", **overrides) -> EmulatorConfig
    create_app(config) -> EmulatorApp              # raw ASGI app; .engine has records/metrics
    await serve(config, host="127.0.0.1", port=8200, log_level="info")
    async with running_emulator(config=None, **overrides) as emu:   # loopback, free port
        emu.base_url  # "http://127.0.0.1:PORT"; emu.records() -> list[RequestRecord]
    simulate(config, clients=14, calls=1700, ...) -> SimulationResult   # pure emulated time

Endpoints (``--runner generate``, the default): ``POST /v1/chat/completions``,
``POST /v1/completions``, ``POST /v1/responses`` (stream and not); with ``--runner pooling``
``POST /v1/embeddings`` instead (the other kind's paths are 404 ``{"detail": "Not Found"}``, as
in vLLM). Always: ``GET /v1/models`` (with ``max_model_len``), ``POST /tokenize``,
``POST /detokenize``, ``GET /health``, ``/version``, ``/metrics`` (vLLM's Prometheus names and
text format: ``x_total`` counters with ``x_created``, labels ``engine="0"``, ``model_name``; KV
cache usage, preemptions, prefix-cache counters and ``vllm:cache_config_info`` with behaviour
behind them, see `emulator.scheduler`).
Extras: ``GET /emulator/requests`` (finished requests with emulated arrival, first-token and
finish times) and ``GET /emulator/clock``.

Generation: ``max_tokens``/``max_completion_tokens`` are honoured (clamped to the room the
context leaves, as vLLM 0.32 does); ``min_tokens`` raises the natural length (so
``min_tokens == max_tokens`` gives an exact length, finish ``length``); ``ignore_eos``
generates up to the limit. Otherwise the length is drawn deterministically from the prompt:
``mean_output_tokens * (1 +- output_spread)``, finish ``stop`` (with ``stop`` strings or
``stop_token_ids`` the first one is reported as ``stop_reason``). ``n > 1`` runs n engine
sequences (vLLM's parallel sampling: n requests in ``/metrics``, the prompt counted n times
there, once in ``usage``). ``logprobs``/``top_logprobs``, ``prompt_logprobs`` and completions'
``echo`` give vLLM's layouts with made-up values. ``X-Request-Id`` sets the id
(``chatcmpl-<id>`` / ``cmpl-<id>``) and is echoed.

Tokenizer: one token per 4 UTF-8 bytes (see `emulator.tokenizer`); chat messages are rendered
as ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` ... ``<|im_start|>assistant\\n`` first.

Timing: see `emulator.scheduler` (step loop) and `emulator.engine` (virtual clock). With
``--speed X`` the emulated clock runs X times real time; ``created``, ``/metrics`` histograms,
the per-request ``metrics`` block and ``/emulator/requests`` are in emulated time. If the CPU
cannot keep up, emulated time slows down instead of skipping, so reported timings stay
consistent with the model.

Grade line (``--grade-line``, off by default): every chat/completions answer starts with
``Grade: <label>`` on ``GRADE_SCALE`` (Strong Sell … Strong Buy), a synthetic seeded draw, Hold-heavy,
deterministic per model, seed (the request's ``seed``, else ``--seed``) and prompt; see `emulator.grades`.

Faults (header ``X-Emulator-Fault`` per request, or ``--fault`` for every request;
comma-separated)::

    error-mid-stream[=N]   after N content chunks (default 3): an in-stream error event
                           `data: {"error": {...}}` then `data: [DONE]` (non-stream: a 500;
                           Responses API: an `event: error`)
    drop-mid-stream[=N]    after N content chunks, close the connection (non-stream: half the body)
    slow-headers=SECONDS   wait SECONDS of real time before answering
    status=CODE            answer CODE (400-599) at once with a vLLM-shaped error body

Errors use vLLM's shape ``{"error": {"message", "type", "param", "code"}}``: unknown model
404, a prompt over ``max_model_len`` 400 (``param: "input_tokens"``), ``stream_options``
without ``stream`` 400, greedy ``n > 1`` 400; a body that is not JSON, fails validation or has
another content type is FastAPI's ``"type": "Bad Request"`` with ``param: "body.<where>"``.
"""

from __future__ import annotations

from usage_ledger.emulator.app import EmulatorApp, create_app
from usage_ledger.emulator.commands import register as register_commands
from usage_ledger.emulator.config import PROFILES, EmulatorConfig, profile_config
from usage_ledger.emulator.engine import Engine, RequestRecord
from usage_ledger.emulator.faults import Faults, parse_faults
from usage_ledger.emulator.grades import GRADE_SCALE
from usage_ledger.emulator.server import RunningEmulator, running_emulator, serve
from usage_ledger.emulator.simulate import SimulationResult, simulate

__all__ = (
    "GRADE_SCALE",
    "PROFILES",
    "EmulatorApp",
    "EmulatorConfig",
    "Engine",
    "Faults",
    "RequestRecord",
    "RunningEmulator",
    "SimulationResult",
    "create_app",
    "parse_faults",
    "profile_config",
    "register_commands",
    "running_emulator",
    "serve",
    "simulate",
)
