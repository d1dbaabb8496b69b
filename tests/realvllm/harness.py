"""What the tier's tests do with a case: send it (openai SDK), compare bytes, read the ledger, tally vLLM.

Reply          status, headers and the body bytes a client received
send_case      one Case through the real openai SDK (httpx only for a body that is not JSON)
comparable     a body with what legitimately differs between two runs replaced (ids, times, timings)
Tally          calls / prompt tokens / completion tokens, from vLLM's counters or from the ledger
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2  # the openai SDK's HTTP client
import openai

from tests.gateway.processes import LEDGER
from tests.realvllm.cases import Case
from tests.realvllm.promtext import parse_samples, total
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.events import CallFailed, CallFinished, CallStarted
from usage_ledger.ledger.read import iter_events

__all__ = (
    "COUNTERS",
    "LedgerCall",
    "Reply",
    "Tally",
    "canonical",
    "comparable",
    "data_lines",
    "ledger_calls",
    "report_row",
    "scrape_counters",
    "sdk_client",
    "send_case",
)

COUNTERS = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes
    call_id: str | None = None  # X-Ledger-Call-Id (gateway replies only)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def sdk_client(base_url: str, **headers: str) -> openai.OpenAI:
    """The real SDK, without retries (a retry would be a second call)."""
    return openai.OpenAI(
        base_url=base_url + "/v1", api_key="sk-realvllm", default_headers=headers, max_retries=0, timeout=120
    )


def _reply(response: httpx2.Response, body: bytes) -> Reply:
    return Reply(
        status=response.status_code,
        content_type=response.headers.get("content-type", ""),
        body=body,
        call_id=response.headers.get("x-ledger-call-id"),
    )


def _sdk_headers(client: openai.OpenAI) -> dict[str, str]:
    """The headers the SDK sends with every request (its `Omit` placeholders left out)."""
    return {k: v for k, v in client.default_headers.items() if isinstance(v, str)}


def _resource(client: openai.OpenAI, path: str) -> Any:
    resources = {
        "/v1/chat/completions": client.chat.completions,
        "/v1/completions": client.completions,
        "/v1/responses": client.responses,
        "/v1/embeddings": client.embeddings,
    }
    return resources[path]


def send_case(client: openai.OpenAI, case: Case, **headers: str) -> Reply:
    """Send `case` as an SDK user would; the body is what the client read (content-decoded bytes)."""
    if case.method == "GET":
        response = client.get(case.path.removeprefix("/v1"), cast_to=httpx2.Response, options={"headers": headers})
        return _reply(response, response.content)
    if isinstance(case.body, str):  # not JSON: no SDK method sends that, so the SDK's own httpx client does
        response = client._client.post(
            str(client.base_url).rstrip("/") + case.path.removeprefix("/v1"),
            content=case.body.encode(),
            headers={**_sdk_headers(client), **headers, "content-type": "application/json"},
        )
        return _reply(response, response.content)
    assert case.body is not None
    resource = _resource(client, case.path)
    try:
        if case.stream:
            with resource.with_streaming_response.create(**case.body, extra_headers=headers) as streamed:
                return _reply(streamed.http_response, b"".join(streamed.iter_bytes()))
        raw = resource.with_raw_response.create(**case.body, extra_headers=headers)
        return _reply(raw.http_response, raw.http_response.content)
    except openai.APIStatusError as exc:
        exc.response.read()
        return _reply(exc.response, exc.response.content)


# Values that differ between two identical requests: ids, clocks, and the timings of a metrics block.
_ID = re.compile(r"\b(chatcmpl-tool|chatcmpl|cmpl|resp|msg|embd|modelperm|call|fc|rs)[-_][0-9a-zA-Z]{6,}")
_CLOCK_KEYS = frozenset({"created", "created_at", "completed_at"})


def _normalise(value: Any, key: str = "", in_metrics: bool = False) -> Any:
    if isinstance(value, dict):
        return {k: _normalise(v, k, in_metrics or k == "metrics") for k, v in value.items()}
    if isinstance(value, list):
        return [_normalise(v, key, in_metrics) for v in value]
    if isinstance(value, str):
        return _ID.sub(r"\1-<id>", value)
    if key in _CLOCK_KEYS and isinstance(value, int | float):
        return 0
    if in_metrics and isinstance(value, float) and (key.endswith("_ms") or key == "tokens_per_second"):
        return 0.0  # a timing; the speculative-decoding counts are compared as they are
    return value


def _comparable_json(text: str) -> str:
    try:
        parsed = json.loads(text)
    except ValueError:
        return _ID.sub(r"\1-<id>", text)
    return json.dumps(_normalise(parsed), sort_keys=True)


def comparable(reply: Reply) -> list[str]:
    """The body as lines to compare: SSE line by line (each data line's JSON normalised), else one JSON."""
    if _is_sse(reply):
        return [
            "data: " + _comparable_json(line[6:]) if line.startswith("data: ") and line != "data: [DONE]" else line
            for line in reply.text.split("\n")
        ]
    return [_comparable_json(reply.text)]


def _is_sse(reply: Reply) -> bool:
    return reply.content_type.startswith("text/event-stream")


# vLLM coalesces: when its engine gets a step ahead of the HTTP generator (a busy core), two token
# outputs become one chunk (" trade unchanged"), and how often depends on load, so two identical
# requests straight to vLLM already differ in chunking. `canonical` undoes exactly that merge:
# consecutive content chunks become one (text joined per choice, the last usage, finish and
# fingerprint kept; Responses text deltas joined and sequence numbers recounted). Everything else
# stays one line per event: a role chunk, a usage-only chunk, `[DONE]`, every other Responses event.


def _merge_lists(a: Any, b: Any) -> Any:
    if isinstance(a, list) and isinstance(b, list):
        return a + b
    if isinstance(a, dict) and isinstance(b, dict):
        return {
            k: _merge_lists(a.get(k), b.get(k)) if k in a and k in b else (b[k] if k in b else a[k]) for k in {**a, **b}
        }
    return b if b is not None else a


def _merge_choice(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    merged = {**a, **{k: v for k, v in b.items() if v is not None}}
    if "text" in a or "text" in b:
        merged["text"] = (a.get("text") or "") + (b.get("text") or "")
    if isinstance(a.get("delta"), dict) and isinstance(b.get("delta"), dict):
        delta = {**a["delta"], **{k: v for k, v in b["delta"].items() if v is not None}}
        if "content" in a["delta"] or "content" in b["delta"]:
            delta["content"] = (a["delta"].get("content") or "") + (b["delta"].get("content") or "")
        merged["delta"] = delta
    merged["logprobs"] = _merge_lists(a.get("logprobs"), b.get("logprobs"))
    return merged


def _is_content_chunk(obj: dict[str, Any]) -> bool:
    choices = obj.get("choices")
    if obj.get("object") not in ("chat.completion.chunk", "text_completion") or not choices:
        return False
    return not any("role" in (c.get("delta") or {}) for c in choices)


def _merge_chunks(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    merged = {**a, **{k: v for k, v in b.items() if k != "choices" and v is not None}}
    choices = {c["index"]: c for c in a["choices"]}
    for choice in b["choices"]:
        index = choice["index"]
        choices[index] = _merge_choice(choices[index], choice) if index in choices else choice
    merged["choices"] = [choices[i] for i in sorted(choices)]
    return merged


def _is_text_delta(obj: dict[str, Any]) -> bool:
    return str(obj.get("type", "")).endswith("_text.delta")


def _same_part(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("type", "item_id", "output_index", "content_index")
    return all(a.get(k) == b.get(k) for k in keys)


def _blank_text(value: Any, key: str = "") -> Any:
    """Generated text replaced by its placeholder (and logprobs, which follow the text), all else kept."""
    if isinstance(value, dict):
        return {k: _blank_text(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank_text(v, key) for v in value]
    if key in ("content", "text", "delta", "logprobs") and value is not None:
        return "<text>"
    return value


def canonical(reply: Reply, *, blank_text: bool = False) -> list[str]:
    """`comparable`, with vLLM's own chunk coalescing undone (see above): equal for equal streams.

    `blank_text`: the generated text (and its logprobs) replaced by a placeholder after merging.
    """
    if not _is_sse(reply):
        lines = comparable(reply)
        if blank_text:
            try:
                return [json.dumps(_blank_text(json.loads(lines[0])), sort_keys=True)]
            except ValueError:
                return lines
        return lines
    events: list[tuple[str, Any]] = []  # (event name, parsed data or the raw line)
    name = ""
    for line in reply.text.split("\n"):
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            parsed = _normalise(json.loads(data)) if data.startswith("{") else data
            previous = events[-1][1] if events else None
            if isinstance(parsed, dict) and isinstance(previous, dict) and events[-1][0] == name:
                if _is_content_chunk(parsed) and _is_content_chunk(previous):
                    events[-1] = (name, _merge_chunks(previous, parsed))
                    continue
                if _is_text_delta(parsed) and _is_text_delta(previous) and _same_part(previous, parsed):
                    joined = {**previous, "delta": previous.get("delta", "") + parsed.get("delta", "")}
                    joined["logprobs"] = _merge_lists(previous.get("logprobs"), parsed.get("logprobs"))
                    events[-1] = (name, joined)
                    continue
            events.append((name, parsed))
            name = ""
        elif line.strip():
            events.append(("", line))  # an SSE comment or anything else: kept as it is
    lines = []
    for position, (event, item) in enumerate(events):
        if isinstance(item, dict) and "sequence_number" in item:
            item = {**item, "sequence_number": position}
        if blank_text:
            item = _blank_text(item)
        text = json.dumps(item, sort_keys=True) if isinstance(item, dict) else str(item)
        lines.append(f"event: {event} | {text}" if event else text)
    return lines


def data_lines(reply: Reply) -> list[str]:
    return [line for line in reply.text.split("\n") if line.startswith("data:")]


def sse_json(reply: Reply) -> list[dict[str, Any]]:
    """The JSON objects of a stream's data lines (without `[DONE]`)."""
    return [json.loads(line[5:]) for line in data_lines(reply) if line[5:].strip() != "[DONE]"]


def sent_metrics(reply: Reply) -> dict[str, Any] | None:
    """vLLM's per-request `metrics` block as the client received it (a stream: the chunk carrying it)."""
    objects = sse_json(reply) if reply.content_type.startswith("text/event-stream") else [json.loads(reply.text)]
    for obj in reversed(objects):
        block = obj.get("metrics") or (obj.get("response") or {}).get("metrics")
        if block:
            return dict(block)
    return None


# --- vLLM's own counters -------------------------------------------------------------------------


@dataclass(frozen=True)
class Tally:
    calls: int
    prompt_tokens: int
    completion_tokens: int

    def __sub__(self, other: Tally) -> Tally:
        return Tally(
            self.calls - other.calls,
            self.prompt_tokens - other.prompt_tokens,
            self.completion_tokens - other.completion_tokens,
        )


def _counters(url: str) -> tuple[Tally, float]:
    samples = parse_samples(httpx.get(f"{url}/metrics", timeout=30).text)
    busy = total(samples, "vllm:num_requests_running") + total(samples, "vllm:num_requests_waiting")
    values = [int(total(samples, name)) for name in COUNTERS]
    return Tally(*values), busy


def scrape_counters(url: str, timeout_s: float = 60.0) -> Tally:
    """vLLM's counters (summed over every label set) once it is idle and two reads agree."""
    deadline = time.monotonic() + timeout_s
    previous: Tally | None = None
    while time.monotonic() < deadline:
        tally, busy = _counters(url)
        if busy == 0 and tally == previous:
            return tally
        previous = tally if busy == 0 else None
        time.sleep(0.3)
    raise AssertionError(f"vLLM at {url} did not settle in {timeout_s}s (requests still running)")


def abort_counter(url: str) -> int:
    samples = parse_samples(httpx.get(f"{url}/metrics", timeout=30).text)
    return int(total(samples, "vllm:request_success_total", finished_reason="abort"))


# --- the ledger ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerCall:
    started: CallStarted
    end: CallFinished | CallFailed | None

    @property
    def case(self) -> str:
        return self.started.tags.get("case", "")

    @property
    def prompt_tokens(self) -> int:
        usage = self.end.usage if self.end is not None else None
        return usage.prompt_tokens if usage is not None else 0

    @property
    def completion_tokens(self) -> int:
        usage = self.end.usage if self.end is not None else None
        return usage.completion_tokens if usage is not None else 0


async def _read_calls(db_url: str) -> list[LedgerCall]:
    database = open_database(db_url, null_pool=True)
    started: dict[str, CallStarted] = {}
    ends: dict[str, CallFinished | CallFailed] = {}
    try:
        async for stored in iter_events(database):
            body = stored.body()
            if isinstance(body, CallStarted):
                started[body.call_id] = body
            elif isinstance(body, CallFinished | CallFailed):
                ends[body.call_id] = body
    finally:
        await database.dispose()
    return [LedgerCall(s, ends.get(call_id)) for call_id, s in started.items()]


def ledger_calls(db_url: str, run: str | None = None, *, settle_s: float = 30.0) -> list[LedgerCall]:
    """The calls of `run` (every call when None) from the events, once each has its final event."""
    deadline = time.monotonic() + settle_s
    while True:
        calls = [c for c in asyncio.run(_read_calls(db_url)) if run is None or c.started.run == run]
        if all(c.end is not None for c in calls) or time.monotonic() > deadline:
            return calls
        time.sleep(0.2)


def ledger_tally(calls: list[LedgerCall]) -> Tally:
    return Tally(len(calls), sum(c.prompt_tokens for c in calls), sum(c.completion_tokens for c in calls))


def report_row(db_url: str, run: str) -> dict[str, Any]:
    """`ledger report runs --run R --format json` (it catches the read models up first)."""
    result = subprocess.run(
        [LEDGER, "report", "runs", "--run", run, "--format", "json", "--db", db_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"ledger report runs failed ({result.returncode}): {result.stderr}"
    rows = json.loads(result.stdout)
    assert len(rows) == 1, rows
    row: dict[str, Any] = rows[0]
    return row
