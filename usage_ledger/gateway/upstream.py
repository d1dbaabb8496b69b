"""The gateway's view of the upstream server: send a request, get status, headers and raw body chunks.

`UpstreamClient` is the seam: `HttpxUpstream` adapts one shared `httpx.AsyncClient` (tests inject
one with `MockTransport` / `ASGITransport`). Transport failures come out as the gateway's
`UpstreamUnreachable` / `UpstreamTimeout` / `UpstreamReset`, never as httpx exceptions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

import httpx

from usage_ledger.gateway.errors import UpstreamError, UpstreamReset, UpstreamTimeout, UpstreamUnreachable
from usage_ledger.gateway.headers import Header
from usage_ledger.ledger.settings import Settings

__all__ = ("HttpxUpstream", "UpstreamClient", "UpstreamResponse", "as_upstream", "httpx_client")


class UpstreamResponse(Protocol):
    status: int
    headers: list[Header]

    def iter_raw(self) -> AsyncIterator[bytes]:
        """The body as received (content-encoding untouched); raises `UpstreamError` subclasses."""
        ...

    async def aclose(self) -> None: ...


class UpstreamClient(Protocol):
    base_url: str

    async def send(
        self,
        method: str,
        target: str,
        headers: Sequence[Header],
        body: bytes,
        *,
        on_sent: Callable[[], None] | None = None,
    ) -> UpstreamResponse:
        """Send one request (`target` = path and query) and return once the response headers arrived.

        `on_sent` is called once the request is on its way (work that can overlap the upstream's).
        """
        ...

    async def aclose(self) -> None: ...


def httpx_client(settings: Settings) -> httpx.AsyncClient:
    """The one shared client, with pool limits and timeouts from settings."""
    return httpx.AsyncClient(
        base_url=settings.upstream,
        timeout=httpx.Timeout(
            connect=settings.upstream_connect_timeout_s,
            read=settings.upstream_read_timeout_s,
            write=settings.upstream_read_timeout_s,
            pool=settings.upstream_connect_timeout_s,
        ),
        limits=httpx.Limits(
            max_connections=settings.upstream_max_connections,
            max_keepalive_connections=settings.upstream_max_connections,
        ),
        follow_redirects=False,
        trust_env=False,
    )


def _translate(exc: httpx.TransportError, phase: str) -> UpstreamError:
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"the upstream did not answer in time ({phase}): {type(exc).__name__}")
    if isinstance(exc, httpx.ConnectError):
        return UpstreamUnreachable(f"cannot connect to the upstream: {exc or type(exc).__name__}")
    return UpstreamReset(f"the upstream connection failed ({phase}): {exc or type(exc).__name__}")


_DEFAULT_HEADERS = (b"accept", b"accept-encoding", b"user-agent")


class _HttpxResponse:
    __slots__ = ("_response", "headers", "status")

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.headers: list[Header] = [(k.lower(), v) for k, v in response.headers.raw]

    async def iter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.TransportError as exc:
            raise _translate(exc, "body") from exc

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxUpstream:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.base_url = str(client.base_url).rstrip("/")

    async def send(
        self,
        method: str,
        target: str,
        headers: Sequence[Header],
        body: bytes,
        *,
        on_sent: Callable[[], None] | None = None,
    ) -> UpstreamResponse:
        if on_sent is not None:
            on_sent()  # httpx writes and waits in one call: nothing to overlap
        request = self.client.build_request(method, self.base_url + target, headers=list(headers), content=body)
        sent = {name for name, _ in headers}
        for name in _DEFAULT_HEADERS:  # httpx adds its own defaults; forward only what the client sent
            if name not in sent:
                request.headers.pop(name.decode(), None)
        try:
            response = await self.client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise _translate(exc, "headers") from exc
        return _HttpxResponse(response)

    async def aclose(self) -> None:
        await self.client.aclose()


def as_upstream(client: httpx.AsyncClient | UpstreamClient) -> UpstreamClient:
    if isinstance(client, httpx.AsyncClient):
        return HttpxUpstream(client)
    return client
