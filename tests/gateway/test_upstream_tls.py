"""An `https://` upstream: verified TLS in the gateway's own client, the same path as plain HTTP."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.gateway.conftest import make_settings
from tests.gateway.live import live_gateway
from tests.gateway.scripted import Request, Server
from tests.gateway.upstream import completion_body
from usage_ledger.gateway import Upstream
from usage_ledger.gateway.errors import UpstreamUnreachable
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.errors import ConfigError
from usage_ledger.ledger.events import CallFinished
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter

BODY = completion_body(3)


def _certificate(tmp_path: Path, *, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for `name` (and 127.0.0.1 when `name` is localhost): (cert PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    alt: list[x509.GeneralName] = [x509.DNSName(name)]
    if name == "localhost":
        alt.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def _server_tls(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def _answer(request: Request, writer: object) -> bool:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY)
    writer.write(head + BODY)  # type: ignore[attr-defined]
    return True


async def _post(upstream: Upstream) -> tuple[int, bytes]:
    response = await upstream.send("POST", "/v1/chat/completions", [(b"content-type", b"application/json")], b"{}")
    body = b"".join([chunk async for chunk in response.chunks()])
    return response.status, body


async def test_verified_against_the_ca_file(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path, name="localhost")
    async with Server(_answer, tls=_server_tls(cert, key)) as server:
        upstream = Upstream(GatewaySettings(upstream=server.url, upstream_ca_file=str(cert)))
        try:
            assert await _post(upstream) == (200, BODY)
            assert await _post(upstream) == (200, BODY)  # kept alive: one TLS connection for both
        finally:
            await upstream.aclose()
    assert server.accepted == 1


@pytest.mark.parametrize("name", ["localhost", "elsewhere.example"])
async def test_an_untrusted_or_misnamed_certificate_is_refused(tmp_path: Path, name: str) -> None:
    cert, key = _certificate(tmp_path, name=name)
    async with Server(_answer, tls=_server_tls(cert, key)) as server:
        # localhost: not in the system's trust store; elsewhere.example: trusted, but not this host's name
        ca_file = None if name == "localhost" else str(cert)
        upstream = Upstream(GatewaySettings(upstream=server.url, upstream_ca_file=ca_file))
        try:
            with pytest.raises(UpstreamUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
                await _post(upstream)
        finally:
            await upstream.aclose()
    assert not server.requests  # nothing was sent over an unverified connection


async def test_an_unreadable_ca_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="LEDGER_UPSTREAM_CA_FILE"):
        Upstream(GatewaySettings(upstream="https://127.0.0.1:1", upstream_ca_file=str(tmp_path / "missing.pem")))


async def test_the_gateway_records_a_call_to_an_https_upstream(database: Database, tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path, name="localhost")
    settings = make_settings(upstream_ca_file=str(cert))
    async with (
        Server(_answer, tls=_server_tls(cert, key)) as server,
        EventWriter(database, Spool(tmp_path / "spool")) as writer,
        live_gateway(settings, database=database, writer=writer, upstream=server.url) as gateway,
        httpx.AsyncClient(base_url=gateway.url, trust_env=False) as client,
    ):
        response = await client.post("/v1/chat/completions", content=b'{"model":"m","messages":[]}')
    assert response.status_code == 200 and response.content == BODY  # bytes as the upstream sent them
    finished = [e.body() async for e in iter_events(database) if e.type == "call.finished"]
    assert len(finished) == 1 and isinstance(finished[0], CallFinished)
    assert finished[0].usage is not None and finished[0].usage.completion_tokens == 3
