"""The admin side, under `/_ledger/`: health, Prometheus metrics and the read API (Litestar).

    /_ledger/health              no auth: the writer's state; 200 when ok, 503 when degraded
    /_ledger/metrics             Prometheus text exposition
    /_ledger/api/calls/{id}      the events of one call (stream `call-<id>`)
    /_ledger/api/<routers>       read models supplied by the composition (runs, tickers, daily, ...)
    /_ledger/api/schema          the OpenAPI schema (…/schema/openapi.json)

Everything but health needs `Authorization: Bearer $LEDGER_ADMIN_TOKEN` when the token is set; wrong tokens are
slowed down per client (`ledger.GuessLimiter`: 429 with `Retry-After` while the door is shut).
Handlers receive `database: Database` and `settings: GatewaySettings` as dependencies.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec
from litestar import Litestar, Response, Router, get
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency, Provide
from litestar.exceptions import HTTPException, NotAuthorizedException, NotFoundException
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi.config import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from litestar.params import FromPath

from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger import VERSION, Database, DoorShut, Event, EventWriter, GuessLimiter, call_stream, read_stream

__all__ = ("CallEvent", "CallEvents", "admin_guard", "call_events", "create_admin_app")


class Health(msgspec.Struct, frozen=True):
    status: str  # "ok", or "degraded" (still serving) with `reasons`
    spooling: bool
    queue_depth: int
    spool_bytes: int
    in_flight: int
    reasons: list[str] = []
    version: str = VERSION  # the usage-ledger release serving


class CallEvent(msgspec.Struct, frozen=True):
    position: int
    type: str
    occurred_at: datetime
    recorded_at: datetime
    body: Event


class CallEvents(msgspec.Struct, frozen=True):
    call_id: str
    events: list[CallEvent]


def admin_guard(token: str | None) -> Any:
    expected = f"Bearer {token}".encode() if token else None
    guesses = GuessLimiter()  # wrong tokens slowed down per client, as at the dashboard's doors

    def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        if expected is None:
            return
        given = connection.headers.get("authorization", "").encode()
        if not given:
            raise NotAuthorizedException("send Authorization: Bearer <LEDGER_ADMIN_TOKEN> to use the admin API")
        client = connection.client.host if connection.client else ""
        try:
            right = guesses.judge(client, lambda: hmac.compare_digest(given, expected))
        except DoorShut as shut:
            headers = {"Retry-After": shut.retry_after}
            raise HTTPException(str(shut), status_code=429, headers=headers) from None
        if not right:
            raise NotAuthorizedException("send Authorization: Bearer <LEDGER_ADMIN_TOKEN> to use the admin API")

    return guard


async def call_events(call_id: FromPath[str], database: NamedDependency[Database]) -> CallEvents:
    """The ledger events of one call (404 if it has none)."""
    if not database.backend_ops.can_hold(call_id):  # its stream column cannot hold such an id: no such call
        raise NotFoundException(f"no call {call_id!r} in the ledger")
    async with database.engine.connect() as conn:
        stored = await read_stream(conn, call_stream(call_id))
    if not stored:
        raise NotFoundException(f"no call {call_id!r} in the ledger")
    return CallEvents(
        call_id=call_id,
        events=[
            CallEvent(
                position=e.position, type=e.type, occurred_at=e.occurred_at, recorded_at=e.recorded_at, body=e.body()
            )
            for e in stored
        ],
    )


def create_admin_app(
    settings: GatewaySettings,
    *,
    database: Database,
    writer: EventWriter,
    metrics: Metrics,
    api_routers: Sequence[Router] = (),
) -> Litestar:
    guard = admin_guard(settings.admin_token)
    # what the schema promises besides 200: 401 from the guard when a token is set, 404 for no such call
    guarded: list[type[HTTPException]] = [NotAuthorizedException] if settings.admin_token else []
    get_call = get(
        "/calls/{call_id:str}/events", summary="The ledger events of one call", raises=[*guarded, NotFoundException]
    )(call_events)

    @get("/_ledger/health", summary="The writer's state", include_in_schema=False)
    async def health() -> Response[Health]:
        # 503 when degraded, so a container's health check sees trouble (events not recorded, a disk nearly
        # full, a spool not replayed); the body says why. Use it for readiness and alerts: a restart fixes none
        # of these, so it is no liveness probe (docs/operations.md).
        problems = writer.problems
        body = Health(
            status="degraded" if problems else "ok",
            reasons=problems,
            spooling=writer.spooling,
            queue_depth=writer.queue_depth,
            spool_bytes=writer.spool_bytes,
            in_flight=metrics.in_flight,
        )
        return Response(body, status_code=503 if problems else 200)

    @get("/_ledger/metrics", guards=[guard], include_in_schema=False)
    async def prometheus() -> Response[str]:
        text = metrics.render(
            queue_depth=writer.queue_depth,
            spool_bytes=writer.spool_bytes,
            spooling=writer.spooling,
            committed=writer.committed_events,
            spooled=writer.spooled_events,
        )
        return Response(text, media_type="text/plain; version=0.0.4")

    api = Router(path="/_ledger/api", route_handlers=[get_call, *api_routers], guards=[guard])
    openapi = OpenAPIConfig(
        title="usage-ledger admin API",
        version="1",
        path="/_ledger/api/schema",
        render_plugins=[JsonRenderPlugin()],
        # the schema's own routes are not API operations: left out of it
        openapi_router=Router(path="/_ledger/api/schema", route_handlers=[], guards=[guard], include_in_schema=False),
        components=Components(security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")}),
        security=[{"bearer": []}] if settings.admin_token else None,
    )
    return Litestar(
        route_handlers=[health, prometheus, api],
        dependencies={
            "database": Provide(lambda: database, sync_to_thread=False),
            "settings": Provide(lambda: settings, sync_to_thread=False),
        },
        openapi_config=openapi,
        debug=False,
        logging_config=None,
        request_max_body_size=settings.max_body_bytes,
    )
