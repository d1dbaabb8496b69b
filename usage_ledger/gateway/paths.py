"""Which requests are calls: decided on the path the upstream routes, never on how the client spelled it.

vLLM's server (uvicorn + Starlette) routes on the path uvicorn hands over: the request target's path
without its fragment (httptools' URL parser stops at `#`), percent-decoded once (`urllib.parse.unquote`),
then matched exactly (case-sensitive; a trailing slash only earns a 307 redirect). So
`/v1/chat/%63ompletions` is a chat completion to it, as `/v1/chat/completions` is.

    call_path(method, raw_path) -> the routed path of a call (recorded), None (passed on unrecorded),
                                   or NonCanonicalPath (400, nothing forwarded)

A POST whose routed path ends with an inference path is a call; its bytes are forwarded as sent. A POST
whose path has more than one reading (a `#`, `\\` or `;`, a percent-encoded `/ \\ ? # ; % .` or NUL,
a dot or empty segment, a trailing slash, or the letters in another case) is refused when any reading —
this router's, or one a server or proxy before it may take — is an inference path: the gateway cannot
know which reading the upstream takes, and a call must never reach it unrecorded. Every other request
passes, bytes unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import unquote

from usage_ledger.gateway.errors import NonCanonicalPath

__all__ = ("INFERENCE_PATHS", "USAGE_REQUEST_PATHS", "call_path")

INFERENCE_PATHS = (
    "/chat/completions",
    "/completions",
    "/responses",
    "/embeddings",
    "/score",
    "/rerank",
    "/pooling",
    "/classify",
    "/audio/transcriptions",
    "/audio/translations",
    # vLLM 0.32's other generating or pooling routes (`vllm/entrypoints/*/api_router.py`)
    "/chat/completions/batch",
    "/v1/messages",  # Anthropic Messages API
    "/invocations",  # SageMaker: a chat, completion or pooling request, by its body
    "/generative_scoring",
    "/inference/v1/generate",
    "/cohere/v2/chat",
    "/v2/embed",
)
"""Path endings of the inference APIs (vLLM's OpenAI-compatible server and its others): a POST to one is a call."""
USAGE_REQUEST_PATHS = ("/chat/completions", "/completions")
"""The APIs whose streams carry usage only when asked (`stream_options.include_usage`)."""

_UNUSUAL = re.compile(r"[%#\\;\x00]|//|/\.|./$")
"""What a path spelled one way only has none of (the fast path: every canonical request)."""
_PLAIN_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})|%(?:2[F35E]|2f|2e|3[BFbf]|5[Cc]|00)")
"""A `%` that is no escape, or an escape of a delimiter (`/ # % . ; ? \\` NUL): decoding it changes the path's shape."""
_CUTS = re.compile(r"[?#;\x00]")
"""Where a reader may take the path to end: a query, a fragment, path parameters, a C string's end."""
_MAX_DECODES = 3
"""Percent-decoding rounds tried (a proxy that decodes before the upstream decodes again)."""
_SHOWN = 200


def call_path(method: str, raw_path: str) -> str | None:
    """The path the upstream routes a call on, None for a request that is no call (passed on unrecorded).

    Raises `NonCanonicalPath` (400) for a POST whose spelling some reader could route to an inference API
    while the upstream's router, or the gateway, could read it otherwise.
    """
    if method != "POST":
        return None  # the inference APIs take POST only
    if _UNUSUAL.search(raw_path) is None:  # one reading only: as sent
        if raw_path.endswith(INFERENCE_PATHS):
            return raw_path
        if raw_path.casefold().endswith(INFERENCE_PATHS):
            raise _refused(raw_path)
        return None
    routed = unquote(raw_path.split("#", 1)[0])
    if "#" not in raw_path and _PLAIN_ESCAPE.search(raw_path) is None and _normalised(routed) == routed:
        # escapes of plain characters only (`%63ompletions`, a model name's `%20`): one reading, the decoded one
        if routed.endswith(INFERENCE_PATHS):
            return routed
        if routed.casefold().endswith(INFERENCE_PATHS):
            raise _refused(raw_path)
        return None
    if any(reading.endswith(INFERENCE_PATHS) for reading in _readings(raw_path, routed)):
        raise _refused(raw_path)
    return None


def _readings(raw_path: str, routed: str) -> Iterator[str]:
    """Every path a reader might route `raw_path` as, lower-cased: decoded 0 to `_MAX_DECODES` times, cut at
    each delimiter or not, `\\` as `/`, `;` parameters dropped, dot and empty segments resolved."""
    yield routed.casefold()
    text = raw_path
    for _ in range(_MAX_DECODES + 1):
        yield _normalised(text).casefold()
        for cut in _CUTS.finditer(text):
            yield _normalised(text[: cut.start()]).casefold()
        decoded = unquote(text)
        if decoded == text:
            return
        text = decoded


def _normalised(path: str) -> str:
    """`path` with `\\` as `/`, each segment's `;` parameters dropped, and dot and empty segments resolved."""
    out: list[str] = []
    for part in path.replace("\\", "/").split("/"):
        segment = part.split(";", 1)[0]
        if segment == "..":
            if out:
                out.pop()
        elif segment not in ("", "."):
            out.append(segment)
    return "/" + "/".join(out)


def _refused(raw_path: str) -> NonCanonicalPath:
    shown = raw_path if len(raw_path) <= _SHOWN else raw_path[:_SHOWN] + "..."
    return NonCanonicalPath(
        f"POST {shown}: a spelling of the path that may reach an inference API but is not its canonical form "
        "(an escaped '/', '.', '%', ';', '?' or '#'; '#', '\\' or ';'; a dot or empty segment; a trailing slash; "
        "or another letter case). The gateway records every call it forwards, so it refuses a path it cannot "
        "be sure how the upstream routes: send it as the API spells it, e.g. /v1/chat/completions"
    )
