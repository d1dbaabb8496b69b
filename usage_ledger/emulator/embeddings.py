"""`POST /v1/embeddings`, as vLLM 0.32 serves an embedding model (`--runner pooling`).

Each input (a string, a list of strings, a list of token ids or a list of such lists) is one
pooling request in the engine: it is prefilled like any prompt (same step-time model, counted
in `vllm:prompt_tokens_total` and `vllm:request_success_total{finished_reason="stop"}`) and
generates no token. The vector is a deterministic unit vector drawn from the input, of
`dimensions` (or `embedding_dim`) floats. The body and its usage: docs/emulator.md.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
import uuid

import msgspec

from usage_ledger.emulator.asgi import Receive, Scope, Send, respond
from usage_ledger.emulator.config import EmulatorConfig
from usage_ledger.emulator.engine import Engine
from usage_ledger.emulator.lifecycle import (
    BadRequest,
    check_context,
    check_model,
    decode_request,
    header_faults,
    reject,
    running,
    until_done,
)
from usage_ledger.emulator.scheduler import Sequence
from usage_ledger.emulator.tokenizer import count_tokens
from usage_ledger.emulator.wire import Usage, error_body

__all__ = ("EmbeddingRequest", "handle_embeddings")

_encode = msgspec.json.Encoder().encode


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    input: str | list[str | int | list[int]]
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None


class _Embedding(msgspec.Struct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class _EmbeddingResponse(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    data: list[_Embedding]
    usage: Usage
    object: str = "list"


_decoder = msgspec.json.Decoder(EmbeddingRequest)


def _inputs(req: EmbeddingRequest) -> list[tuple[bytes, int]]:
    """(key for the vector, token count) per input."""
    raw = req.input
    items: list[str | list[int]] = []
    if isinstance(raw, str):
        items.append(raw)
    elif raw and all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        items.append([x for x in raw if isinstance(x, int)])
    else:
        for item in raw:
            if isinstance(item, int):
                raise BadRequest(400, "Input must be a string, a list of strings or a list of token-id lists.", "input")
            items.append(item)
    out = [(x.encode(), count_tokens(x)) if isinstance(x, str) else (repr(x).encode(), len(x)) for x in items]
    if not out or any(n == 0 for _, n in out):
        raise BadRequest(400, "Input must not be empty.", "input")
    return out


def _vector(key: bytes, dim: int) -> list[float]:
    rng = random.Random(hashlib.blake2b(key, digest_size=8).digest())
    values = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


async def handle_embeddings(config: EmulatorConfig, engine: Engine, scope: Scope, receive: Receive, send: Send) -> None:
    decoded = await decode_request(config, scope, receive, send, _decoder)
    if decoded is None:
        return
    faults, req = decoded
    try:
        check_model(config, req.model, pooling=True)
        if req.encoding_format not in ("float", "base64"):
            raise BadRequest(
                400, f"The emulator supports encoding_format float or base64, got {req.encoding_format!r}."
            )
        if req.dimensions is not None and req.dimensions < 1:
            raise BadRequest(400, f"dimensions must be >= 1, got {req.dimensions}.", "dimensions")
        inputs = _inputs(req)
        for _, n in inputs:
            check_context(config, n, pooling=True)
    except BadRequest as exc:
        await reject(send, exc)
        return
    if await header_faults(faults, send):
        return
    request_id = "embd-" + uuid.uuid4().hex
    now = engine.now()
    seqs = [Sequence(f"{request_id}-{i}", n, 0, "stop", now) for i, (_, n) in enumerate(inputs)]
    async with running(engine, receive, *seqs) as disconnected:
        if not await until_done(disconnected, *seqs):
            return
    if faults.error_after is not None or faults.drop_after is not None:
        await respond(send, 500, error_body(500, "Injected fault (X-Emulator-Fault).", None))
        return
    dim = req.dimensions or config.embedding_dim
    data = [_Embedding(i, _encoded(_vector(key, dim), req.encoding_format)) for i, (key, _) in enumerate(inputs)]
    tokens = sum(n for _, n in inputs)
    body = _EmbeddingResponse(
        id=request_id,
        created=int(now),
        model=config.model,
        data=data,
        usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
    )
    await respond(send, 200, _encode(body))
