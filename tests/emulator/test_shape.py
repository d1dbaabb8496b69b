"""The emulator answers with real vLLM 0.32's shapes (DESIGN §8: the real server is the reference).

Each transcript recorded from real vLLM (`tests/fixtures/vllm-0.32.0/<config>/<case>.json`)
is replayed against an emulator started with the same server flags; the two answers must have
the same shape (keys at every level, JSON types, null versus absent; for a stream, the sequence
of event shapes and the event names). Values — text, ids, timings, token counts — are not
compared. The emulator is told the recorded outcome (how many tokens, why it stopped) so that
shapes which depend on it (`incomplete_details`, `mean_itl_ms`) are compared like for like.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from tests.emulator.shapes import differences, parse_sse, skeleton, stream_differences
from usage_ledger.emulator import EmulatorConfig, profile_config, running_emulator

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"
SERVED = {
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models"),
    ("GET", "/version"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
}


# objects keyed by data (token text, token id), not by field names
MAPS = frozenset(
    {
        "$.choices[].logprobs.top_logprobs[]",  # completions: {token: logprob}
        "$.choices[].prompt_logprobs[]",  # completions: {token_id: {logprob, rank, decoded_token}}
        "$.prompt_logprobs[]",  # chat
    }
)


class RecordedRequest(msgspec.Struct):
    method: str
    path: str
    body: Any = None


class RecordedResponse(msgspec.Struct):
    status: int
    body: str
    headers: Any = None


class Transcript(msgspec.Struct):
    vllm_version: str
    config: str
    request: RecordedRequest
    response: RecordedResponse
    server_args: list[str] | str = msgspec.field(default_factory=list)


def _cases() -> list[Any]:
    if not FIXTURES.is_dir():
        reason = f"no real-vLLM transcripts yet: {FIXTURES} does not exist (they are recorded by the real-vLLM tier)"
        return [pytest.param("", marks=pytest.mark.skip(reason=reason), id="no-fixtures")]
    cases: list[Any] = []
    for path in sorted(FIXTURES.glob("*/*.json")):
        case_id = f"{path.parent.name}/{path.stem}"
        try:
            transcript = msgspec.json.decode(path.read_bytes(), type=Transcript)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            transcript = f"{path}: not a transcript: {exc}"  # the test fails with this
        if isinstance(transcript, Transcript):
            endpoint = (transcript.request.method.upper(), transcript.request.path.split("?")[0])
            if endpoint not in SERVED:
                reason = f"{endpoint[0]} {endpoint[1]} is not served by the emulator"
                cases.append(pytest.param(transcript, marks=pytest.mark.skip(reason=reason), id=case_id))
                continue
        cases.append(pytest.param(transcript, id=case_id))
    return cases or [pytest.param(f"{FIXTURES} exists but holds no <config>/<case>.json transcript", id="empty")]


def _request_body(transcript: Transcript) -> Any:
    """The decoded request body (None without one; a string when it is not JSON, sent as is)."""
    body = transcript.request.body
    if isinstance(body, str):
        try:
            return msgspec.json.decode(body)
        except msgspec.DecodeError:
            return body
    return body


def _request_bytes(body: Any) -> bytes | None:
    if body is None:
        return None
    return body.encode() if isinstance(body, str) else json.dumps(body).encode()


def _server_flags(server_args: list[str] | str) -> argparse.Namespace:
    argv = shlex.split(server_args) if isinstance(server_args, str) else list(server_args)
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--enable-force-include-usage", action="store_true")
    p.add_argument("--enable-per-request-metrics", action="store_true")
    p.add_argument("--enable-prompt-tokens-details", action="store_true")
    p.add_argument("--per-request-spec-decode-metrics", default="none")
    p.add_argument("--speculative-config", default=None)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--runner", default="generate")
    return p.parse_known_args(argv)[0]


def _outcome(transcript: Transcript, body: Any) -> tuple[int | None, str | None]:
    """(completion tokens, finish reason) of the recorded answer, as far as it says."""
    text = transcript.response.body
    tokens: int | None = None
    finish: str | None = None
    docs: list[Any] = []
    if text.lstrip().startswith("{"):
        docs.append(msgspec.json.decode(text))
    else:
        docs.extend(e.data for e in parse_sse(text) if isinstance(e.data, dict))
    for doc in docs:
        doc = doc.get("response", doc) if isinstance(doc, dict) else doc
        if not isinstance(doc, dict):
            continue
        usage = doc.get("usage")
        if isinstance(usage, dict):
            count = usage.get("completion_tokens", usage.get("output_tokens"))
            tokens = count if isinstance(count, int) else tokens
        for choice in doc.get("choices") or []:
            if isinstance(choice, dict) and choice.get("finish_reason"):
                finish = choice["finish_reason"]
        if doc.get("status") in ("completed", "incomplete"):
            finish = "length" if doc["status"] == "incomplete" else "stop"
    return tokens, finish


def emulator_config(transcript: Transcript) -> EmulatorConfig:
    """An emulator with the recorded server's flags, serving the model the request names."""
    flags = _server_flags(transcript.server_args)
    body = _request_body(transcript)
    spec_tokens = 0
    if flags.speculative_config:
        spec_tokens = int(json.loads(flags.speculative_config).get("num_speculative_tokens", 1))
    model = flags.served_model_name[0] if flags.served_model_name else None
    if model is None and isinstance(body, dict):
        model = body.get("model")  # a server without --served-model-name serves what the request names
    tokens, finish = _outcome(transcript, body)
    limit = None
    if isinstance(body, dict):
        limit = body.get("max_tokens") or body.get("max_completion_tokens") or body.get("max_output_tokens")
    if tokens is None:
        tokens = limit if finish == "length" and limit else max(1, (limit or 16) // 2)
    elif isinstance(body, dict) and isinstance(body.get("n"), int) and body["n"] > 1:
        tokens //= body["n"]  # usage adds up the choices
    extra: dict[str, Any] = {}
    if flags.max_model_len:
        extra["max_model_len"] = flags.max_model_len
    return profile_config(
        "moe",
        **extra,
        model=model or "emulator-moe",
        speed=1000.0,
        spec_tokens=spec_tokens,
        enable_force_include_usage=flags.enable_force_include_usage,
        enable_per_request_metrics=flags.enable_per_request_metrics,
        prompt_tokens_details=flags.enable_prompt_tokens_details,
        per_request_spec_decode_metrics=flags.per_request_spec_decode_metrics,
        enable_auto_tool_choice=flags.enable_auto_tool_choice,
        tool_call_parser=flags.tool_call_parser,
        runner="pooling" if flags.runner == "pooling" else "generate",
        mean_output_tokens=max(1, tokens),
        output_spread=0.0,
    )


def _media_type(headers: Any) -> str | None:
    pairs = headers.items() if isinstance(headers, dict) else headers or []
    for key, value in pairs:
        if str(key).lower() == "content-type":
            return str(value).split(";")[0].strip()
    return None


@pytest.mark.parametrize("transcript", _cases())
async def test_emulator_answers_with_vllm_shape(transcript: Transcript | str) -> None:
    assert isinstance(transcript, Transcript), transcript
    request, recorded = transcript.request, transcript.response
    body = _request_body(transcript)
    async with running_emulator(emulator_config(transcript)) as emu, httpx.AsyncClient(timeout=60) as h:
        answer = await h.request(
            request.method.upper(),
            emu.base_url + request.path,
            content=_request_bytes(body),
            headers={"content-type": "application/json"} if body is not None else None,
        )
    where = f"{transcript.config}: {request.method} {request.path}, server args {transcript.server_args}"
    assert answer.status_code == recorded.status, f"{where}: status {answer.status_code} != vLLM's {recorded.status}"
    real_type, emu_type = _media_type(recorded.headers), answer.headers.get("content-type", "").split(";")[0]
    if real_type is not None:
        assert emu_type == real_type, f"{where}: content-type {emu_type} != vLLM's {real_type}"
    if (real_type or emu_type) == "text/event-stream":
        diffs = stream_differences(parse_sse(recorded.body), parse_sse(answer.text), MAPS)
    elif recorded.body.strip() and (real_type or emu_type) == "application/json":
        diffs = differences(skeleton(msgspec.json.decode(recorded.body), MAPS), skeleton(answer.json(), MAPS))
    else:
        diffs = [] if answer.text == recorded.body else [f"body {answer.text[:80]!r} vs vLLM's {recorded.body[:80]!r}"]
    assert not diffs, f"{where}: the emulator's shape differs from vLLM's:\n  " + "\n  ".join(diffs)


# -- /metrics: every family and label set the emulator exports, vLLM exports the same way --------
def _metrics_cases() -> list[Any]:
    if not FIXTURES.is_dir():
        reason = f"no real-vLLM transcripts yet: {FIXTURES} does not exist"
        return [pytest.param("", "", marks=pytest.mark.skip(reason=reason), id="no-fixtures")]
    cases: list[Any] = []
    for path in sorted(FIXTURES.glob("*/metrics.txt")):
        transcripts = sorted(path.parent.glob("*.json"))
        cases.append(
            pytest.param(path.read_text(), transcripts[0].read_bytes() if transcripts else b"", id=path.parent.name)
        )
    return cases or [pytest.param("", "", marks=pytest.mark.skip(reason="no metrics.txt recorded"), id="none")]


def _exposition(text: str) -> tuple[dict[str, str], set[tuple[str, frozenset[str]]], dict[str, set[str]]]:
    """(family -> TYPE, {(sample name, label names)}, label name -> values) of a Prometheus text page."""
    kinds: dict[str, str] = {}
    samples: set[tuple[str, frozenset[str]]] = set()
    values: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            kinds[name] = kind
        elif line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            pairs = [p.split("=", 1) for p in rest.rsplit("}", 1)[0].split(",")] if rest else []
            for key, value in pairs:
                values.setdefault(key, set()).add(value.strip('"'))
            samples.add((name.split(" ")[0], frozenset(key for key, _ in pairs)))
    return kinds, samples, values


@pytest.mark.parametrize(("real_text", "transcript_bytes"), _metrics_cases())
async def test_emulator_metrics_are_named_and_typed_as_vllm_does(real_text: str, transcript_bytes: bytes) -> None:
    transcript = msgspec.json.decode(transcript_bytes, type=Transcript)
    async with running_emulator(emulator_config(transcript)) as emu, httpx.AsyncClient() as h:
        emulated = (await h.get(emu.base_url + "/metrics")).text
    real_kinds, real_samples, real_values = _exposition(real_text)
    kinds, samples, values = _exposition(emulated)
    wrong = [
        f"# TYPE {n} {k} (vLLM: {real_kinds.get(n, 'absent')})" for n, k in kinds.items() if real_kinds.get(n) != k
    ]
    wrong += [
        f"sample {n} with labels {sorted(labels)}: vLLM has no such series" for n, labels in samples - real_samples
    ]
    for label in ("finished_reason", "position"):
        wrong += [
            f'{label}="{v}": vLLM has no such value' for v in values.get(label, set()) - real_values.get(label, set())
        ]
    assert not wrong, f"{transcript.config}: the emulator's /metrics differs from vLLM's:\n  " + "\n  ".join(
        sorted(wrong)
    )
