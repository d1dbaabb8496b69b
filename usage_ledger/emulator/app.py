"""The emulator as a raw ASGI application: `create_app(config)`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec

from usage_ledger.emulator.asgi import Receive, Scope, Send, read_body, respond
from usage_ledger.emulator.bodies import ModelCard, ModelList, ModelPermission
from usage_ledger.emulator.config import EmulatorConfig
from usage_ledger.emulator.embeddings import handle_embeddings
from usage_ledger.emulator.engine import Engine
from usage_ledger.emulator.generate import handle_generate
from usage_ledger.emulator.responses import handle_responses
from usage_ledger.emulator.tokenizer import decode, encode, render_chat
from usage_ledger.emulator.version import VLLM_VERSION
from usage_ledger.emulator.wire import DetokenizeRequest, TokenizeRequest, error_body

__all__ = ("VLLM_VERSION", "EmulatorApp", "create_app")

_encode = msgspec.json.Encoder().encode
T = TypeVar("T")
_PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"


Handler = Callable[[EmulatorConfig, Engine, Scope, Receive, Send], Awaitable[None]]


class EmulatorApp:
    """ASGI app; `engine` holds the scheduler, metrics and the log of finished requests."""

    def __init__(self, config: EmulatorConfig, engine: Engine | None = None):
        self.config = config
        self.engine = engine or Engine(config)
        self._routes = {
            ("GET", "/health"): self._health,
            ("GET", "/ping"): self._health,
            ("GET", "/version"): self._version,
            ("GET", "/v1/models"): self._models,
            ("GET", "/metrics"): self._metrics,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._detokenize,
            ("GET", "/emulator/requests"): self._requests,
            ("GET", "/emulator/clock"): self._clock,
        }
        self._inference: dict[str, Handler]
        if config.runner == "pooling":
            self._inference = {"/v1/embeddings": handle_embeddings}
        else:
            self._inference = {
                "/v1/chat/completions": handle_generate,
                "/v1/completions": handle_generate,
                "/v1/responses": handle_responses,
            }
        self._paths = {path for _, path in self._routes} | set(self._inference)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            self.engine.start()
            path: str = scope["path"]
            method: str = scope["method"]
            handler = self._inference.get(path) if method == "POST" else None
            if handler is not None:
                await handler(self.config, self.engine, scope, receive, send)
                return
            route = self._routes.get((method, path))
            if route is not None:
                await route(scope, receive, send)
            elif path in self._paths:
                await respond(send, 405, b'{"detail":"Method Not Allowed"}')
            else:
                await respond(send, 404, b'{"detail":"Not Found"}')
        elif kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self.engine.start()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.engine.stop()
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, b"", content_type=b"text/plain")

    async def _version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, _encode({"version": VLLM_VERSION}))

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        created = int(self.engine.now())
        card = ModelCard(
            id=self.config.model,
            created=created,
            max_model_len=self.config.max_model_len,
            root=self.config.model,
            permission=[ModelPermission(id="modelperm-emulator", created=created)],
        )
        await respond(send, 200, _encode(ModelList(data=[card])))

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, self.engine.render_metrics().encode(), content_type=_PROMETHEUS)

    async def _requests(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, _encode(list(self.engine.records)))

    async def _clock(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, _encode({"now": self.engine.now(), "speed": self.config.speed}))

    async def _tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        req = await _read(receive, send, TokenizeRequest)
        if req is None:
            return
        if req.model is not None and req.model != self.config.model:
            await respond(send, 404, error_body(404, f"The model `{req.model}` does not exist.", "model"))
            return
        if req.messages is not None:
            text = render_chat([(m.role, m.text()) for m in req.messages], req.add_generation_prompt)
        elif req.prompt is not None:
            text = req.prompt
        else:
            await respond(send, 400, error_body(400, "Either `prompt` or `messages` is required."))
            return
        tokens = encode(text)
        body = {"count": len(tokens), "max_model_len": self.config.max_model_len, "tokens": tokens, "token_strs": None}
        await respond(send, 200, _encode(body))

    async def _detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        req = await _read(receive, send, DetokenizeRequest)
        if req is not None:
            await respond(send, 200, _encode({"prompt": decode(req.tokens)}))


async def _read(receive: Receive, send: Send, kind: type[T]) -> T | None:
    """The decoded body, or None once a 400 has been answered (or the client left)."""
    body = await read_body(receive)
    if body is None:
        return None
    try:
        return msgspec.json.decode(body, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        await respond(send, 400, error_body(400, f"Invalid request body: {exc}"))
        return None


def create_app(config: EmulatorConfig) -> EmulatorApp:
    """The ASGI app for `config` (the engine starts with the lifespan or the first request)."""
    return EmulatorApp(config)
