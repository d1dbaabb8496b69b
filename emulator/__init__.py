"""A vLLM stand-in: OpenAI wire format plus a continuous-batching timing model, no GPU.

Run it: ``ledger emulate [--host 127.0.0.1] [--port 8200] [--profile moe|dense] [--speed X]
[--model NAME] [--fault SPEC]...`` (or ``python -m emulator`` with the same options). Every
profile parameter has a flag (``--max-num-seqs``, ``--acceptance-rate``, ``--step-base-s`` ...).

Public API::

    EmulatorConfig, PROFILES, profile_config(profile="moe", **overrides) -> EmulatorConfig
    create_app(config) -> EmulatorApp              # raw ASGI app; .engine has records/metrics
    await serve(config, host="127.0.0.1", port=8200, log_level="info")
    async with running_emulator(config=None, **overrides) as emu:   # loopback, free port
        emu.base_url  # "http://127.0.0.1:PORT"; emu.records() -> list[RequestRecord]
    simulate(config, clients=14, calls=1700, ...) -> SimulationResult   # pure emulated time

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (stream and not),
``GET /v1/models`` (with ``max_model_len``), ``POST /tokenize``, ``POST /detokenize``,
``GET /health``, ``/version``, ``/metrics`` (vLLM's Prometheus names, labels ``model_name``,
``engine="0"``). Extras: ``GET /emulator/requests`` (finished requests with emulated arrival,
first-token and finish times) and ``GET /emulator/clock``.

Generation: ``max_tokens``/``max_completion_tokens`` are honoured; ``min_tokens`` raises the
natural length (so ``min_tokens == max_tokens`` gives an exact length, finish ``length``);
``ignore_eos`` generates up to the limit. Otherwise the length is drawn deterministically from
the prompt: ``mean_output_tokens * (1 +- output_spread)``, finish ``stop``. ``X-Request-Id``
sets the id (``chatcmpl-<id>`` / ``cmpl-<id>``) and is echoed. Only ``n=1`` is supported.

Tokenizer: one token per 4 UTF-8 bytes (see `emulator.tokenizer`); chat messages are rendered
as ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` ... ``<|im_start|>assistant\\n`` first.

Timing: see `emulator.scheduler` (step loop) and `emulator.engine` (virtual clock). With
``--speed X`` the emulated clock runs X times real time; ``created``, ``/metrics`` histograms
and ``/emulator/requests`` are in emulated time. If the CPU cannot keep up, emulated time
slows down instead of skipping, so reported timings stay consistent with the model.

Faults (header ``X-Emulator-Fault`` per request, or ``--fault`` for every request;
comma-separated)::

    error-mid-stream[=N]   after N content chunks (default 3): an in-stream error event
                           `data: {"error": {...}}` then `data: [DONE]` (non-stream: a 500)
    drop-mid-stream[=N]    after N content chunks, close the connection (non-stream: half the body)
    slow-headers=SECONDS   wait SECONDS of real time before answering
    status=CODE            answer CODE (400-599) at once with a vLLM-shaped error body

Errors use vLLM's shape ``{"error": {"message", "type", "param", "code"}}``: unknown model
404, prompt + max_tokens over ``max_model_len`` 400, ``stream_options`` without ``stream`` 400,
non-JSON content type 400, invalid body 400.
"""

from __future__ import annotations

from emulator.app import EmulatorApp, create_app
from emulator.config import PROFILES, EmulatorConfig, profile_config
from emulator.engine import Engine, RequestRecord
from emulator.faults import Faults, parse_faults
from emulator.server import RunningEmulator, running_emulator, serve
from emulator.simulate import SimulationResult, simulate

__all__ = (
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
    "running_emulator",
    "serve",
    "simulate",
)
