"""Which requests are calls (`gateway.paths`): every spelling the upstream routes to an inference API is recorded
or refused, never relayed unrecorded (issue #52, point 1).

The live test sends each spelling byte for byte through the real gateway to the emulator, which uvicorn serves
with httptools as vLLM's server is (routing on uvicorn's decoded path, as Starlette does); tests/realvllm sends
them to real vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from urllib.parse import unquote

import httptools
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.gateway.conftest import make_settings
from tests.gateway.live import live_gateway
from tests.gateway.spellings import SPELLINGS
from tests.gateway.wire import read_response
from usage_ledger.emulator import profile_config, running_emulator
from usage_ledger.gateway.errors import NonCanonicalPath
from usage_ledger.gateway.paths import INFERENCE_PATHS, call_path
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallFinished, CallStarted
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter

REFUSED = "refused"


def classify(method: str, path: str) -> str | None:
    try:
        return call_path(method, path)
    except NonCanonicalPath:
        return REFUSED


def uvicorn_path(raw_path: str) -> str:
    """The path Starlette routes on under uvicorn's httptools protocol: the URL parser's path, decoded once."""
    parsed = httptools.parse_url(raw_path.encode("latin-1"))
    path = parsed.path.decode("ascii")
    return unquote(path) if "%" in path else path


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/completions", "/v1/completions"),
        ("/openai/deployments/x/chat/completions", "/openai/deployments/x/chat/completions"),
        ("/v1/chat/%63ompletions", "/v1/chat/completions"),  # the spellings: vLLM routes them
        ("/v1/chat/completion%73", "/v1/chat/completions"),
        ("/v1/%65mbeddings", "/v1/embeddings"),
        ("/v1/deployments/my%20model/chat/completions", "/v1/deployments/my model/chat/completions"),
        ("/v1/chat/completions#frag", REFUSED),  # httptools cuts the fragment; h11 would keep it
        ("/v1/chat%2Fcompletions", REFUSED),  # an escaped '/': Starlette decodes it, axum does not
        ("/v1/chat/completions%2523x", REFUSED),  # decoded twice by a proxy and the upstream
        ("/v1/chat/completions%3Bx", REFUSED),
        ("/v1/chat/completions%00", REFUSED),
        ("/v1/chat/completions/", REFUSED),  # a trailing slash: Starlette redirects, others strip it
        ("/v1/chat/completions//", REFUSED),
        ("/v1//chat/completions", REFUSED),  # empty segments: merged by nginx
        ("/v1/./chat/completions", REFUSED),  # dot segments: resolved by clients and proxies
        ("/v1/x/../chat/completions", REFUSED),
        ("/v1/chat/completions/x/..", REFUSED),
        ("/v1/chat/completions/x/%2e%2E", REFUSED),
        ("/v1/chat/completions/%2e%2E", None),  # resolves to /v1/chat: no reading is a call
        ("/v1/chat/completions;x=1", REFUSED),  # path parameters: dropped by servlet containers
        ("/v1/chat\\completions", REFUSED),
        ("/v1/Chat/Completions", REFUSED),  # another case: case-insensitive routers
        ("/v1/chat/%43ompletions", REFUSED),
        ("/v1/models#/chat/completions", REFUSED),
        ("/v1/messages", "/v1/messages"),  # vLLM's other generating routes
        ("/invocations", "/invocations"),
        ("/v1/chat/completions/batch", "/v1/chat/completions/batch"),
        ("/invocations/", REFUSED),
        ("/v1/messages/count_tokens", None),
        ("/v1/models", None),
        ("/v1/models/", None),  # no reading is an inference path: passed on unchanged
        ("/v1/models/org%2Fname", None),
        ("/v1/chat/completions/render", None),
        ("/tokenize", None),
        ("/", None),
    ],
)
def test_call_path(path: str, expected: str | None) -> None:
    assert classify("POST", path) == expected
    assert classify("GET", path) is None  # the inference APIs take POST only: other methods always pass


_API = st.sampled_from(INFERENCE_PATHS)
_SEGMENT = st.text(alphabet="abcxyz019-_.~", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))
_PREFIX = st.lists(_SEGMENT, max_size=3).map(lambda parts: "".join("/" + p for p in parts))


def _encode(text: str, which: list[bool], upper: list[bool]) -> str:
    out = []
    for char, encode, up in zip(text, which, upper, strict=True):
        if encode:
            escape = f"%{ord(char):02x}"
            out.append(escape.upper() if up else escape)
        else:
            out.append(char)
    return "".join(out)


@given(prefix=_PREFIX, api=_API, data=st.data())
def test_any_percent_encoding_of_an_inference_path_is_a_call_or_refused(
    prefix: str, api: str, data: st.DataObject
) -> None:
    path = prefix + api
    which = data.draw(st.lists(st.booleans(), min_size=len(path), max_size=len(path)))
    upper = data.draw(st.lists(st.booleans(), min_size=len(path), max_size=len(path)))
    spelled = _encode(path, which, upper)
    got = classify("POST", spelled)
    assert got in (path, REFUSED)
    if "/" not in unquote(spelled).replace(path, "", 1) and "%2" not in spelled.lower():
        assert got == path  # escapes of letters only: the call, recorded under the path the upstream routes


_RAW = st.text(alphabet="/abc.%2fF5e3#;?\\", max_size=14)


@given(head=_PREFIX, noise=_RAW, api=_API, tail=_RAW)
def test_no_spelling_uvicorn_routes_to_an_inference_api_passes_unrecorded(
    head: str, noise: str, api: str, tail: str
) -> None:
    """Whatever the bytes, a path that uvicorn + Starlette would route to an inference API is a call or refused."""
    for raw in (head + noise + api, head + api + tail, "/" + noise + api + tail, head + noise + api + tail):
        if not raw.startswith("/") or "?" in raw:
            continue  # a request target's path (the query is split off before)
        try:
            routed = uvicorn_path(raw)
        except (httptools.HttpParserInvalidURLError, UnicodeDecodeError):
            continue  # a target the upstream's parser refuses: no route at all
        got = classify("POST", raw)
        if routed.endswith(INFERENCE_PATHS):
            assert got in (routed, REFUSED), raw
        if got not in (None, REFUSED):
            assert got == routed, raw  # a call is recorded under the path the upstream routes


@given(prefix=_PREFIX, api=_API)
def test_canonical_spellings_are_calls_as_sent(prefix: str, api: str) -> None:
    assert classify("POST", prefix + api) == prefix + api  # nothing a client normally sends is refused


# -- live: the gateway in front of the emulator (uvicorn + httptools, as vLLM) ------------------------------------

EMULATOR = profile_config("moe", speed=1000.0)
CHAT = b'{"model":"%s","messages":[{"role":"user","content":"hi"}],"max_tokens":3}' % EMULATOR.model.encode()
COMPLETION = b'{"model":"%s","prompt":"hi","max_tokens":3}' % EMULATOR.model.encode()


async def _post_raw(port: int, target: bytes, body: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % (target, len(body)) + body)
        return await asyncio.wait_for(read_response(reader), 30)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def test_every_spelling_the_upstream_answers_is_recorded_or_refused(database: Database, tmp_path: Path) -> None:
    async with (
        running_emulator(EMULATOR) as emulator,
        EventWriter(database, Spool(tmp_path / "spool")) as writer,
        live_gateway(make_settings(), database=database, writer=writer, upstream=emulator.base_url) as gw,
    ):
        port = int(gw.url.rsplit(":", 1)[1])
        engine = emulator.app.engine
        outcomes: dict[bytes, tuple[int, str | None]] = {}
        for target in SPELLINGS:
            body = COMPLETION if b"chat" not in target.lower() and b"%63hat" not in target else CHAT
            served = len(engine.records)
            status, headers, response = await _post_raw(port, target, body)
            reached = len(engine.records) > served  # the upstream's engine answered it: an inference call
            call_id = headers.get("x-ledger-call-id")
            if status == 400 and json.loads(response)["error"]["code"] == "non_canonical_path":
                assert not reached and call_id is None, target
            if reached:
                assert status == 200 and call_id is not None, target
            outcomes[target] = (status, call_id)
        events = [stored.body() async for stored in iter_events(database)]
    started = {e.call_id: e for e in events if isinstance(e, CallStarted)}
    finished = {e.call_id: e for e in events if isinstance(e, CallFinished)}
    for target, (status, call_id) in outcomes.items():
        if call_id is not None:
            path = target.decode().split("?", 1)[0]
            assert started[call_id].path == path and finished[call_id].status == status, target
    # the three: the two that vLLM answers are calls now, the fragment is refused
    assert outcomes[b"/v1/chat/%63ompletions"][0] == outcomes[b"/v1/chat/completion%73"][0] == 200
    assert finished[outcomes[b"/v1/chat/%63ompletions"][1] or ""].usage is not None
    assert outcomes[b"/v1/chat/completions#frag"] == (400, None)
