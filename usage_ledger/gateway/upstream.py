"""The gateway's upstream client: one shared `aiohttp` session (keep-alive pool, verified TLS).

    Upstream.send ─► aiohttp (≤ upstream_max_connections, idle ones kept KEEPALIVE_EXPIRY_S)
                  ─► UpstreamResponse: status, headers as sent (names lower-cased), body bytes
                     handed over as they arrive (`chunks`: whatever was read together, never held)

aiohttp rather than httpx: in front of a CPU-saturated SSE upstream httpx's client streamed at about
half the chunk rate and added milliseconds to the first token (docs/BENCHMARKS.md, "The gateway's
HTTP stack"). Nothing is added to the request (no User-Agent, Accept or Accept-Encoding of the
client's own) and nothing is decoded from the response: bytes in = bytes out. Failures come out as
`UpstreamUnreachable` / `UpstreamTimeout` / `UpstreamReset`. `https://` upstreams are verified
(certificate and host name) against the system's CAs or `LEDGER_UPSTREAM_CA_FILE`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Sequence
from urllib.parse import urlsplit

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from usage_ledger.gateway.errors import UpstreamError, UpstreamReset, UpstreamTimeout, UpstreamUnreachable
from usage_ledger.gateway.headers import Header
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger import ConfigError

__all__ = ("KEEPALIVE_EXPIRY_S", "Upstream", "UpstreamResponse", "tls_context")

KEEPALIVE_EXPIRY_S = 4.0
"""An idle pooled connection older than this is closed instead of reused (servers drop idle ones at ~5 s)."""

_SCHEMES = ("http", "https")
_NO_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


def tls_context(settings: GatewaySettings) -> ssl.SSLContext:
    """Verifying TLS for an `https://` upstream: the system's CAs, or only those of `upstream_ca_file`."""
    try:
        context = ssl.create_default_context(cafile=settings.upstream_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"LEDGER_UPSTREAM_CA_FILE {settings.upstream_ca_file!r}: {exc}") from exc
    context.set_alpn_protocols(["http/1.1"])
    return context


class UpstreamResponse:
    """A response whose status and headers arrived; its body is read once with `chunks`."""

    __slots__ = ("_response", "headers", "status")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers: list[Header] = [(name.lower(), value) for name, value in response.raw_headers]

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body bytes as they come: each read hands over everything buffered (de-chunked, not decoded).

        Bytes that arrived before a failure are handed over before it is raised (the client gets
        every byte the upstream sent, as it would directly).
        """
        content = self._response.content
        try:
            while True:
                try:
                    chunk = await content.readany()
                except (TimeoutError, aiohttp.ClientError) as exc:
                    rest = _salvage(content)
                    if rest:
                        yield rest
                    if isinstance(exc, TimeoutError):
                        raise UpstreamTimeout(f"the upstream did not answer in time (body): {_detail(exc)}") from exc
                    raise UpstreamReset(
                        f"the upstream closed the connection without sending a complete message body: {_detail(exc)}"
                    ) from exc
                if not chunk:
                    return
                yield chunk
        finally:
            self._response.release()  # read to the end: pooled; failed or abandoned: closed

    async def aclose(self) -> None:
        """Done with the response: the connection is pooled if the body was read to its end, else closed."""
        self._response.release()  # aiohttp closes it instead unless the whole body came off the wire


class Upstream:
    """The client of the one upstream (`settings.upstream`). Build inside the running loop; `aclose` closes it."""

    def __init__(self, settings: GatewaySettings) -> None:
        url = urlsplit(settings.upstream)
        if url.scheme not in _SCHEMES or not url.hostname:
            raise ConfigError(f"LEDGER_UPSTREAM must be an http:// or https:// URL, not {settings.upstream!r}")
        self.base_url = settings.upstream.rstrip("/")
        self._connect_timeout = settings.upstream_connect_timeout_s
        self._read_timeout = settings.upstream_read_timeout_s
        connector = aiohttp.TCPConnector(
            limit=settings.upstream_max_connections,
            limit_per_host=0,
            keepalive_timeout=KEEPALIVE_EXPIRY_S,
            ssl=tls_context(settings) if url.scheme == "https" else False,
            use_dns_cache=True,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=_NO_AUTO_HEADERS,
            timeout=aiohttp.ClientTimeout(total=None, connect=self._connect_timeout, sock_read=self._read_timeout),
            cookie_jar=aiohttp.DummyCookieJar(),
            read_bufsize=256 * 1024,
        )

    async def send(self, method: str, target: str, headers: Sequence[Header], body: bytes) -> UpstreamResponse:
        """Send the request; return once the response's status and headers arrived."""
        url = self.base_url + target
        try:
            response = await self._session.request(
                method,
                URL(url, encoded=True),
                headers=CIMultiDict((name.decode("latin-1"), value.decode("latin-1")) for name, value in headers),
                data=body if body or method in ("POST", "PUT", "PATCH") else None,
                allow_redirects=False,
                compress=None,
                chunked=None,
            )
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamUnreachable(f"cannot connect to the upstream at {self.base_url}: {_detail(exc)}") from exc
        except aiohttp.ConnectionTimeoutError as exc:
            raise UpstreamTimeout(
                f"the upstream did not answer in time (connect): no connection to {self.base_url} "
                f"within {self._connect_timeout:g} s"
            ) from exc
        except (TimeoutError, asyncio.TimeoutError) as exc:  # noqa: UP041
            raise UpstreamTimeout(
                f"the upstream did not answer in time (headers): no bytes for {self._read_timeout:g} s"
            ) from exc
        except aiohttp.ServerDisconnectedError as exc:
            raise UpstreamReset(
                f"the upstream closed the connection without sending a response: {_detail(exc)}"
            ) from exc
        except (aiohttp.ClientPayloadError, aiohttp.ClientResponseError) as exc:
            raise UpstreamReset(f"the upstream sent an invalid HTTP response: {_detail(exc)}") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamReset(f"the upstream request failed: {_detail(exc)}") from exc
        except ValueError as exc:  # a header aiohttp will not send (CR/LF in it)
            raise UpstreamError(f"invalid request for the upstream: {exc}") from exc
        return UpstreamResponse(response)

    async def aclose(self) -> None:
        await self._session.close()


def _salvage(content: aiohttp.StreamReader) -> bytes:
    """What is buffered: aiohttp's `readany` raises a failure before handing over the bytes that preceded it."""
    with contextlib.suppress(Exception):
        if content._buffer:  # no public way to read past a failure
            return content._read_nowait(-1)
    return b""


def _detail(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
