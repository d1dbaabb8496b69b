"""Secrets in query strings and the installation's fingerprint key (`gateway.secrets`, `gateway.fingerprint_key`).

The stored query keeps every byte that is not a secret value; secret values become keyed
fingerprints; the request upstream is unchanged. Property tests for the query, unit tests for the
key file, and the real server + raw upstream client path on both backends.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import re
import stat
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from tests.gateway.conftest import Rig
from tests.gateway.upstream import completion_body
from tests.gateway.wire import read_response
from usage_ledger.gateway import Upstream, listening
from usage_ledger.gateway.app import create_app
from usage_ledger.gateway.fingerprint_key import DEFAULT_KEY_FILE_NAME, FingerprintKey, load_fingerprint_key
from usage_ledger.gateway.headers import recorded_headers
from usage_ledger.gateway.secrets import is_secret_name, recorded_query
from usage_ledger.gateway.serve import bind_socket
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.errors import ConfigError
from usage_ledger.ledger.events import CallFinished, CallStarted
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter

KEY = FingerprintKey(bytes(range(32)))
FINGERPRINT = re.compile(r"hmac-sha256:[0-9a-f]{8}:[0-9a-f]{16}")

SECRET_NAMES = [
    "api_key",
    "API_KEY",
    "api-key",
    "apikey",
    "ApiKey",
    "key",
    "KEY",
    "token",
    "access_token",
    "auth",
    "password",
    "secret",
    "client_secret",
    "sig",
    "SIG",
    "signature",
    "X-Amz-Signature",
    "x-sig",
    "pwd",
]
PLAIN_NAMES = ["api-version", "model", "stream", "limit", "after", "order", "design", "signal", "q", ""]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_plain_names(name: str) -> None:
    assert not is_secret_name(name)


def test_header_and_query_share_the_rule_and_the_fingerprint() -> None:
    stored = dict(recorded_headers([(b"api-key", b"sk-abc"), (b"x-sig", b"s1"), (b"accept", b"*/*")], KEY))
    assert stored["api-key"] == KEY.fingerprint(b"sk-abc") == recorded_query("api-key=sk-abc", KEY).split("=", 1)[1]
    assert stored["x-sig"] == KEY.fingerprint(b"s1") and stored["accept"] == "*/*"


@pytest.mark.parametrize(
    ("query", "stored"),
    [
        ("", ""),
        ("api-version=2024-06-01", "api-version=2024-06-01"),
        ("api_key=sk-1&api-version=2024", f"api_key={KEY.fingerprint(b'sk-1')}&api-version=2024"),
        ("a=1&KEY=sk-1&b=2", f"a=1&KEY={KEY.fingerprint(b'sk-1')}&b=2"),
        ("api%5Fkey=sk-1", f"api%5Fkey={KEY.fingerprint(b'sk-1')}"),  # the name as the upstream decodes it
        ("api+key=sk-1", f"api+key={KEY.fingerprint(b'sk-1')}"),
        ("key=a%2Bb+c", f"key={KEY.fingerprint(b'a+b c')}"),  # the value as the upstream decodes it
        ("key=dGVzdA==", f"key={KEY.fingerprint(b'dGVzdA==')}"),  # '=' inside the value is the value's
        ("key=s&key=s&key=", f"key={KEY.fingerprint(b's')}&key={KEY.fingerprint(b's')}&key="),
        ("key&token", "key&token"),  # no value, nothing to hide
        ("x=1;sig=abc;;&", f"x=1;sig={KEY.fingerprint(b'abc')};;&"),
        ("q=\xe9t\xe9&token=\xff", "q=\xe9t\xe9&token=" + KEY.fingerprint(bytes([0xFF]))),  # raw bytes (latin-1)
        ("=v&&==", "=v&&=="),
    ],
)
def test_recorded_query(query: str, stored: str) -> None:
    assert recorded_query(query, KEY) == stored


_PIECE = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0xFF), max_size=12)


@given(st.lists(st.tuples(_PIECE, st.sampled_from(["&", ";", "&&"])), max_size=8))
def test_every_byte_but_secret_values_is_kept(pieces: list[tuple[str, str]]) -> None:
    """Any query (latin-1, any separators, any encoding): the same parts in the same order, each
    unchanged unless it is `secret-name=value`, then `secret-name=<fingerprint of the value>`."""
    query = "".join(p + sep for p, sep in pieces)
    stored = recorded_query(query, KEY)
    original_parts, stored_parts = re.split(r"([&;])", query), re.split(r"([&;])", stored)
    assert len(stored_parts) == len(original_parts)
    for before, after in zip(original_parts, stored_parts, strict=True):
        name, _, value = before.partition("=")
        if before in ("&", ";") or not value or not is_secret_name(_unquote_name(name)):
            assert after == before
        else:
            assert after.startswith(name + "=") and FINGERPRINT.fullmatch(after[len(name) + 1 :])


def _unquote_name(name: str) -> str:
    from urllib.parse import unquote_plus

    return unquote_plus(name, errors="replace")


_SECRET_VALUE = st.text(alphabet="abcdef0123456789", min_size=16, max_size=40).map(lambda s: "Zz" + s)
_PLAIN_VALUE = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="&;Zz"))


@given(
    st.lists(
        st.one_of(
            st.tuples(st.sampled_from(SECRET_NAMES), _SECRET_VALUE, st.booleans()),
            st.tuples(st.sampled_from(PLAIN_NAMES[:-1]), _PLAIN_VALUE, st.just(False)),
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(["&", ";"]),
)
def test_secret_values_never_appear(params: list[tuple[str, str, bool]], sep: str) -> None:
    """Planted secret values (sometimes percent-encoded) are gone from the stored query, in any form."""
    query = sep.join(f"{n}={_percent_encoded(v) if encode else v}" for n, v, encode in params)
    stored = recorded_query(query, KEY)
    for name, value, _ in params:
        if is_secret_name(name):
            assert value not in stored and _percent_encoded(value) not in stored and "Zz" not in stored
            assert KEY.fingerprint(value.encode()) in stored
        else:
            assert f"{name}={value}" in stored


def _percent_encoded(value: str) -> str:
    return "".join(f"%{b:02X}" for b in value.encode())


def test_the_fingerprint_names_its_kind_and_its_key() -> None:
    other = FingerprintKey(bytes(range(1, 33)))
    mine, theirs = KEY.fingerprint(b"sk-live-1"), other.fingerprint(b"sk-live-1")
    assert FINGERPRINT.fullmatch(mine) and FINGERPRINT.fullmatch(theirs)
    assert not mine.startswith("sha256:")  # the old, unkeyed kind
    assert mine == FingerprintKey(bytes(range(32))).fingerprint(b"sk-live-1")  # a shared key file agrees
    assert mine != theirs and mine.split(":")[1] == KEY.key_id != other.key_id
    assert KEY.fingerprint(b"sk-live-2") != mine
    with pytest.raises(ValueError, match="32 bytes"):
        FingerprintKey(b"short")


# -- the key file --------------------------------------------------------------------------------


KEY_HEX = "0123456789abcdef" * 4


def _key(tmp_path: Path, key_file: str | None = None) -> FingerprintKey:
    return load_fingerprint_key(GatewaySettings(fingerprint_key_file=key_file), str(tmp_path / "spool"))


def test_default_key_file_is_created_once_beside_the_spool(tmp_path: Path) -> None:
    key = _key(tmp_path)
    path = tmp_path / DEFAULT_KEY_FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert re.fullmatch(rb"[0-9a-f]{64}\n", path.read_bytes())
    again = _key(tmp_path)
    assert again.key_id == key.key_id and again.fingerprint(b"k") == key.fingerprint(b"k")
    assert [p.name for p in tmp_path.iterdir()] == [DEFAULT_KEY_FILE_NAME]  # no temporary file left


def test_gateways_starting_at_once_agree_on_one_key(tmp_path: Path) -> None:
    keys: list[FingerprintKey] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        keys.append(_key(tmp_path))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({k.key_id for k in keys}) == 1 and len(keys) == 8
    assert [p.name for p in tmp_path.iterdir()] == [DEFAULT_KEY_FILE_NAME]


def test_a_configured_key_file_is_read_not_created(tmp_path: Path) -> None:
    path = tmp_path / "shared.key"
    path.write_text(bytes(range(32)).hex().upper() + "\n")
    path.chmod(0o600)
    assert _key(tmp_path, str(path)).key_id == KEY.key_id
    missing = tmp_path / "mnt" / "nope.key"
    with pytest.raises(ConfigError, match=r"LEDGER_FINGERPRINT_KEY_FILE=.*nope\.key: no such file; create one"):
        _key(tmp_path, str(missing))
    assert not missing.parent.exists() and not (tmp_path / DEFAULT_KEY_FILE_NAME).exists()  # no fallback


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"", "expected 64 hex"), (b"00" * 31, "expected 64 hex"), (b"zz" * 32, "expected 64 hex"), (None, "cannot read")],
)
def test_an_unusable_key_file_stops_the_start(tmp_path: Path, content: bytes | None, problem: str) -> None:
    path = tmp_path / DEFAULT_KEY_FILE_NAME
    if content is None:
        path.mkdir()  # unreadable as a file (root reads any mode, so a directory stands in)
    else:
        path.write_bytes(content)
    for configured in (str(path), None):  # the default path is never overwritten either
        with pytest.raises(ConfigError, match=problem):
            _key(tmp_path, configured)
    assert content is None or path.read_bytes() == content
    with pytest.raises(ConfigError, match="is empty"):
        _key(tmp_path, " ")


def test_a_key_file_others_can_read_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "k"
    path.write_text(KEY_HEX)
    path.chmod(0o644)
    with structlog.testing.capture_logs() as logs:
        _key(tmp_path, str(path))
    assert {"event": "fingerprint_key_file_readable_by_others", "mode": "0644"}.items() <= logs[0].items()
    assert KEY_HEX not in repr(logs)


@pytest.mark.parametrize(
    ("plant", "problem"),
    [
        (lambda p: os.chown(p, 65534, 65534), "is owned by uid 65534"),  # planted by another user (nobody)
        (lambda p: p.chmod(0o646), "may be written by other users"),
        (lambda p: p.write_text("00" * 32), "not random"),  # all zeros: fingerprints testable offline
    ],
)
def test_a_planted_key_file_is_refused(tmp_path: Path, plant: Any, problem: str) -> None:
    """Red team, round three: a key of all zeros owned by `nobody` was loaded with only a warning."""
    path = tmp_path / DEFAULT_KEY_FILE_NAME
    path.write_text(KEY_HEX)
    path.chmod(0o600)
    plant(path)
    for configured in (str(path), None):
        with pytest.raises(ConfigError, match=problem):
            _key(tmp_path, configured)


# -- through the real server and upstream client ---------------------------------------------------


@asynccontextmanager
async def _recording_upstream() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A loopback HTTP/1.1 upstream that keeps each request line as received and answers a completion."""
    lines: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            lines.append(head.split(b"\r\n", 1)[0])
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
            body = completion_body(2)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-api-key: echo-k\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], lines
    finally:
        server.close()
        await server.wait_closed()


async def test_stored_query_is_redacted_and_the_upstream_gets_it_unchanged(database: Database, tmp_path: Path) -> None:
    target = b"/v1/chat/completions?api-version=2024-06-01&api_key=sk-QUERY-s3cret&x=%41+b;sig=s1g&flag&key="
    async with _recording_upstream() as (upstream_port, lines):
        settings = GatewaySettings(upstream=f"http://127.0.0.1:{upstream_port}")
        upstream = Upstream(settings)
        async with EventWriter(database, Spool(tmp_path / "spool")) as writer:
            app = create_app(settings, database=database, writer=writer, upstream=upstream, fingerprint_key=KEY)
            sock = bind_socket("127.0.0.1", 0)
            async with listening(app, settings, sock, grace_s=5):
                reader, conn = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
                body = b'{"model":"m","messages":[],"max_tokens":2}'
                conn.write(
                    b"POST %s HTTP/1.1\r\nhost: g\r\napi-key: sk-HEADER-s3cret\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (target, len(body), body)
                )
                status, _, _ = await read_response(reader)
                conn.close()
        await upstream.aclose()
    assert status == 200
    assert lines == [b"POST " + target + b" HTTP/1.1"]  # byte-transparent: the upstream got the real key
    events = [stored.body() async for stored in iter_events(database)]
    started = next(e for e in events if isinstance(e, CallStarted))
    finished = next(e for e in events if isinstance(e, CallFinished))
    assert started.path == "/v1/chat/completions"
    assert started.query == (
        f"api-version=2024-06-01&api_key={KEY.fingerprint(b'sk-QUERY-s3cret')}&x=%41+b;sig={KEY.fingerprint(b's1g')}"
        "&flag&key="
    )
    assert dict(started.request_headers)["api-key"] == KEY.fingerprint(b"sk-HEADER-s3cret")
    assert dict(finished.response_headers)["x-api-key"] == KEY.fingerprint(b"echo-k")
    assert "s3cret" not in repr(events) and "s1g" not in repr(events)


async def test_an_app_without_a_key_never_uses_the_old_public_one(rig: Rig) -> None:
    """Embedded or in tests (no key file): a random in-memory key, not the constant of `sha256:` fingerprints."""
    response = await rig.client.post(
        "/v1/chat/completions?token=t0k", headers={"authorization": "Bearer sk-1"}, content=b'{"model":"m"}'
    )
    assert response.status_code == 200
    started = next(e for e in await rig.events() if isinstance(e, CallStarted))
    public = "sha256:" + hmac.new(b"usage-ledger/header-fingerprint/v1", b"Bearer sk-1", hashlib.sha256).hexdigest()
    stored = dict(started.request_headers)["authorization"]
    assert FINGERPRINT.fullmatch(stored) and public[:19] not in stored
    assert stored.split(":")[1] == rig.app.proxy.fingerprint_key.key_id != FingerprintKey.generate().key_id
    assert started.query == "token=" + rig.app.proxy.fingerprint_key.fingerprint(b"t0k")
