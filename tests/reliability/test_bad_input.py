"""Bad input never crashes anything: X-Ledger headers, request bodies, oversized bodies, import files.

Covered elsewhere (not repeated here): the SSE scanner's hypothesis properties
(tests/gateway/test_sse.py), the importer's record-level properties (tests/projections/test_importer.py).
"""

from __future__ import annotations

import random
import re
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gateway.conftest import rigged
from tests.gateway.upstream import read_body
from tests.reliability.helpers import ledger_cli, read_blobs, read_ledger
from usage_ledger.gateway.errors import InvalidLedgerHeader
from usage_ledger.gateway.headers import MAX_HEADER_VALUE, MAX_TAGS, parse_ledger_headers
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.imports.importer import parse_file
from usage_ledger.ledger.db import Database

# -- X-Ledger-* headers ---------------------------------------------------------------------------
_tag_names = st.from_regex(r"[a-z0-9][a-z0-9_.\-]{0,63}", fullmatch=True)
_values = (
    st.text(
        st.characters(min_codepoint=0x20, exclude_categories=("Cs", "Cc", "Zl", "Zp")),
        min_size=1,
        max_size=MAX_HEADER_VALUE,
    )
    .map(str.strip)
    .filter(bool)
)


@given(run=st.none() | _values, ticker=st.none() | _values, tags=st.dictionaries(_tag_names, _values, max_size=8))
def test_valid_ledger_headers_round_trip(run: str | None, ticker: str | None, tags: dict[str, str]) -> None:
    tags.pop("ticker", None)
    headers = [(b"content-type", b"application/json"), (b"authorization", b"Bearer sk-x")]
    if run is not None:
        headers.append((b"x-ledger-run", run.encode()))
    if ticker is not None:
        headers.append((b"x-ledger-ticker", ticker.encode()))
    headers += [(b"x-ledger-tag-" + name.encode(), value.encode()) for name, value in tags.items()]
    parsed, forward = parse_ledger_headers(headers)
    assert parsed.run == run
    assert parsed.tags == {**tags, **({"ticker": ticker} if ticker is not None else {})}
    assert forward == headers[:2]  # X-Ledger-* stripped, the rest untouched and in order


@given(
    st.lists(
        st.tuples(
            st.sampled_from([b"x-ledger-run", b"x-ledger-ticker", b"x-ledger-tag-"]).flatmap(
                lambda p: st.binary(max_size=70).map(lambda b: p + b.lower()) if p.endswith(b"-") else st.just(p)
            )
            | st.binary(max_size=20).map(lambda b: b"x-ledger-" + b),
            st.binary(max_size=MAX_HEADER_VALUE + 20),
        ),
        min_size=1,
        max_size=MAX_TAGS + 3,
    )
)
@settings(max_examples=300)
def test_any_ledger_header_is_parsed_or_a_400(headers: list[tuple[bytes, bytes]]) -> None:
    try:
        parse_ledger_headers(headers)
    except InvalidLedgerHeader as exc:
        assert exc.status == 400
        error = msgspec.json.decode(exc.body())["error"]
        assert error["code"] == "invalid_ledger_header" and error["message"]


# -- import files ----------------------------------------------------------------------------------
_GOOD = b'{"started_at": 0, "elapsed_s": 1, "input_tokens": 1, "output_tokens": 2}'
_lines = st.one_of(
    st.just(_GOOD),
    st.binary(max_size=40),
    st.sampled_from([b"{", b"[]", b"null", b'{"started_at": "x"}', b"\xff\xfe", b"a,b,c", b'"', b"\x00", b"{}"]),
    st.text(max_size=30).map(str.encode),
)


@given(lines=st.lists(_lines, max_size=8), csv=st.booleans(), header=st.booleans())
@settings(max_examples=300, deadline=None)
def test_any_import_file_gives_events_or_file_line_errors(lines: list[bytes], csv: bool, header: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("in.csv" if csv else "in.jsonl")
        head = [b"started_at,elapsed_s,input_tokens,output_tokens,tag.ticker"] if csv and header else []
        path.write_bytes(b"\n".join(head + lines))
        _events, errors, _rows = parse_file(path)
    pattern = re.compile(re.escape(str(path)) + r":\d+: \S")
    assert all(pattern.match(error) for error in errors), errors


@pytest.mark.parametrize(
    ("name", "data"),
    [("bad.jsonl", b'{"started_at": 0}\n\xff\xfe\x00garbage\n[1,2]\n'), ("bad.csv", b"started_at,x\n\xff\xfe,1\n1\n")],
)
async def test_import_cli_reports_file_line_not_a_traceback(tmp_path: Path, name: str, data: bytes) -> None:
    db = f"sqlite:///{tmp_path / 'l.db'}"
    assert (await ledger_cli("db", "upgrade", "--db", db)).returncode == 0
    path = tmp_path / name
    path.write_bytes(data)
    result = await ledger_cli("import", str(path), "--db", db)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}:2:" in result.stderr and "Traceback" not in result.stderr


# -- request bodies through the gateway ------------------------------------------------------------
class Capture:
    """An upstream that records the exact request bytes and answers like vLLM does to a bad body."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.bodies.append(await read_body(receive))
        answer = b'{"error":{"message":"bad body","type":"BadRequestError","param":null,"code":400}}'
        await send({"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": answer})


LIMIT = 4096


@pytest.fixture
async def gateway(database: Database, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Capture]]:
    capture = Capture()
    settings = GatewaySettings(max_body_bytes=LIMIT)
    async with rigged(database, settings, tmp_path / "spool", upstream=capture) as rig:
        yield rig.client, capture


BAD_BODIES = [
    b"\xff\xfe\xfa not utf-8 \xc3\x28",
    b'{"model": "m", "messages": [{"role": "user", "content": "\xed\xa0\x80"}], "stream": true}',
    b'{"model": "m", "stream": true, "messages": [',
    b'{"stream": true, "stream_options": {"include_usage": false}, "model": 1e999999}',
    b"[1, 2, 3]",
    b"",
    b"\x00" * 100,
]


async def test_bad_bodies_forwarded_untouched_and_recorded(
    gateway: tuple[httpx.AsyncClient, Capture], database: Database
) -> None:
    client, capture = gateway
    rng = random.Random(5)
    bodies = BAD_BODIES + [rng.randbytes(rng.randint(1, 300)) for _ in range(20)]
    for body in bodies:
        resp = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert resp.status_code == 400 and resp.json()["error"]["message"] == "bad body"  # upstream's answer
    assert capture.bodies == bodies  # byte for byte
    ledger = await read_ledger(database.url)
    started = sorted(ledger.started.values(), key=lambda e: e.call_id)
    assert len(started) == len(bodies) and len(ledger.finished) == len(bodies)
    blobs = await read_blobs(database.url, [e.request_blob for e in started if e.request_blob])
    recorded = [blobs[e.request_blob] if e.request_blob else b"" for e in started]
    assert recorded == bodies and [e.request_bytes for e in started] == [len(b) for b in bodies]


async def test_oversized_bodies_get_413(gateway: tuple[httpx.AsyncClient, Capture], database: Database) -> None:
    client, capture = gateway
    at_limit = b"x" * LIMIT
    assert (await client.post("/v1/chat/completions", content=at_limit)).status_code == 400  # forwarded

    async def chunked() -> AsyncIterator[bytes]:  # no content-length: the limit is enforced while reading
        for _ in range(LIMIT // 1000 + 1):
            yield b"y" * 1000

    for content in (b"x" * (LIMIT + 1), chunked()):
        resp = await client.post("/v1/chat/completions", content=content)
        assert resp.status_code == 413
        error = resp.json()["error"]
        assert "LEDGER_MAX_BODY_BYTES" in error["message"] or str(LIMIT) in error["message"]
    assert capture.bodies == [at_limit]  # oversized bodies never reach the upstream
    assert len((await read_ledger(database.url)).started) == 1
