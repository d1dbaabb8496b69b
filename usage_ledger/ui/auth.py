"""The dashboard's door (docs/dashboard.md): the token entered once in a form gives an HttpOnly,
SameSite=Strict cookie holding a random session id, never the token; scripts may send a Bearer token.
Both compared in constant time. Sessions live in the process: a restart ends them all."""

from __future__ import annotations

import hmac
import math
import secrets
import time
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie
from litestar.enums import RequestEncodingType
from litestar.exceptions import HTTPException, NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.params import Body, FromQuery
from litestar.response import Redirect
from litestar.status_codes import HTTP_200_OK, HTTP_303_SEE_OTHER, HTTP_401_UNAUTHORIZED, HTTP_429_TOO_MANY_REQUESTS

from usage_ledger.ledger import DoorShut, GuessLimiter
from usage_ledger.ui.render import Renderer

__all__ = ("COOKIE", "SESSION_S", "LoginRequired", "UiAuth")

COOKIE = "ledger_ui"
UI_PREFIX = "/_ledger/ui"


class LoginRequired(NotAuthorizedException):
    """No valid cookie or bearer token: pages redirect to the form, the JSON endpoints answer 401."""


class LoginForm(msgspec.Struct, frozen=True):
    token: str = ""
    next: str = ""


def _safe_next(target: str) -> str:
    """Only a path of the dashboard itself (no open redirect to another site)."""
    if target.startswith(UI_PREFIX + "/") and not target.startswith("//") and "\\" not in target:
        return target
    return UI_PREFIX + "/"


SESSION_S = 12 * 3600
"""How long a login lasts (the cookie's max-age and the session's life in the process)."""
_MAX_SESSIONS = 1000


class _Sessions:
    """The dashboard's logins in this process: random ids, each until logout or `SESSION_S` after login.

    At most `_MAX_SESSIONS` live at once (the oldest ends first), so repeated logins cannot grow memory.
    """

    def __init__(self) -> None:
        self._until: dict[str, float] = {}  # insertion order = login order

    def open(self) -> str:
        now = time.monotonic()
        for session in [s for s, until in self._until.items() if until <= now]:
            del self._until[session]
        while len(self._until) >= _MAX_SESSIONS:
            del self._until[next(iter(self._until))]
        session = secrets.token_urlsafe(32)
        self._until[session] = now + SESSION_S
        return session

    def valid(self, session: str) -> bool:
        until = self._until.get(session)
        return until is not None and until > time.monotonic()

    def close(self, session: str) -> None:
        self._until.pop(session, None)


class UiAuth:
    def __init__(self, token: str | None, renderer: Renderer) -> None:
        self.token = token
        self.renderer = renderer
        self._sessions = _Sessions()
        self.guesses = GuessLimiter()
        self._bearer = f"Bearer {token}".encode() if token else b""

    def __deepcopy__(self, memo: dict[int, Any]) -> UiAuth:
        # Litestar deep-copies a router's guards (bound methods, with their instance) when it registers them;
        # every copy must see the one session store the login writes to
        return self

    @property
    def enabled(self) -> bool:
        return self.token is not None

    def allowed(self, connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
        if self.token is None:
            return True
        if self._sessions.valid(connection.cookies.get(COOKIE, "")):
            return True
        bearer = connection.headers.get("authorization", "").encode()
        if not bearer:
            return False  # no token offered: not a guess
        client = connection.client.host if connection.client else ""
        try:  # a bearer token is a guess like the form's: slowed down by the same count
            return self.guesses.judge(client, lambda: hmac.compare_digest(bearer, self._bearer))
        except DoorShut as shut:
            headers = {"Retry-After": shut.retry_after}
            raise HTTPException(str(shut), status_code=HTTP_429_TOO_MANY_REQUESTS, headers=headers) from None

    def guard(self, connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        if not self.allowed(connection):
            raise LoginRequired("enter LEDGER_ADMIN_TOKEN at /_ledger/ui/login (or send Authorization: Bearer …)")

    def to_login(self, request: Request[Any, Any, Any], _: Exception) -> Response[Any]:
        """Exception handler of the pages: to the form, coming back to the page asked for."""
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return Redirect(f"{UI_PREFIX}/login", query_params={"next": target}, status_code=HTTP_303_SEE_OTHER)

    def handlers(self) -> list[Any]:
        auth = self

        def form(target: str, error: str | None = None, status: int = HTTP_200_OK) -> Response[str]:
            page = auth.renderer.page("login.html", title="Enter the admin token", next=target, error=error)
            page.status_code = status
            return page

        @get("/login", include_in_schema=False, sync_to_thread=False)
        def login_form(next: FromQuery[str] = "") -> Response[str]:
            return form(_safe_next(next))

        @post("/login", include_in_schema=False, sync_to_thread=False)
        def login(
            request: Request[Any, Any, Any],
            data: Annotated[LoginForm, Body(media_type=RequestEncodingType.URL_ENCODED)],
        ) -> Response[str]:
            target = _safe_next(data.next)
            if auth.token is None:
                return Redirect(target, status_code=HTTP_303_SEE_OTHER)
            client = request.client.host if request.client else ""
            wait_s = auth.guesses.wait_s(client)
            if wait_s > 0:  # the token is not compared: a right guess now looks like a wrong one
                seconds = math.ceil(wait_s)
                error = f"Too many wrong tokens from your address: try again in {seconds} s."
                page = form(target, error, HTTP_429_TOO_MANY_REQUESTS)
                page.headers["Retry-After"] = str(seconds)
                return page
            if not hmac.compare_digest(data.token.encode(), auth.token.encode()):
                auth.guesses.failed(client)
                return form(target, "That is not the admin token.", HTTP_401_UNAUTHORIZED)
            auth.guesses.succeeded(client)
            cookie = Cookie(
                key=COOKIE,
                value=auth._sessions.open(),
                max_age=SESSION_S,
                path=UI_PREFIX,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
            return Redirect(target, status_code=HTTP_303_SEE_OTHER, cookies=[cookie])

        @post("/logout", include_in_schema=False, sync_to_thread=False)
        def logout(request: Request[Any, Any, Any]) -> Response[str]:
            auth._sessions.close(request.cookies.get(COOKIE, ""))  # a copy of the cookie ends with it
            gone = Cookie(key=COOKIE, value="", path=UI_PREFIX, httponly=True, samesite="strict", max_age=0)
            return Redirect(f"{UI_PREFIX}/login", status_code=HTTP_303_SEE_OTHER, cookies=[gone])

        return [login_form, login, logout]
