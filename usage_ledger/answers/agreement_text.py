"""A label from a stored response: the assistant text of a body (after its `content-encoding`), then a regex
group or a JSON pointer into it (docs/decide.md). Responses and embeddings bodies give no text (None)."""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import brotli
import msgspec
import regex
import zstandard

from usage_ledger.projections import ProjectionError

__all__ = (
    "EXTRACT_TIMEOUT_S",
    "LabelExtractor",
    "assistant_text",
    "decoded_body",
    "json_content",
    "pointer_extractor",
    "regex_extractor",
)

LabelExtractor = Callable[[str], str | None]
"""The label in an assistant text, or None when there is none; `TimeoutError` when finding out would take
longer than the extractor allows (a pattern that backtracks without end, such as `(a+)+$`)."""

EXTRACT_TIMEOUT_S = 1.0
"""How long `--extract`'s pattern may search one answer (`regex_extractor`'s default)."""

_LINE_END = re.compile(rb"\r\n|\r|\n")
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\r?\n(.*?)```", re.DOTALL)
_DECODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda data: zlib.decompress(data, 16 + zlib.MAX_WBITS),
    "x-gzip": lambda data: zlib.decompress(data, 16 + zlib.MAX_WBITS),
    "br": brotli.decompress,
    "zstd": lambda data: zstandard.ZstdDecompressor().decompressobj().decompress(data),
    "identity": lambda data: data,
}


def _inflate(data: bytes) -> bytes:
    """`deflate` is zlib-wrapped by the RFC, raw DEFLATE from some servers: either is read."""
    try:
        return zlib.decompress(data)
    except zlib.error:
        return zlib.decompress(data, -zlib.MAX_WBITS)


def decoded_body(data: bytes, content_encoding: str | None) -> bytes:
    """The body with its content codings undone (last applied, first undone); ValueError when one cannot be."""
    if not content_encoding:
        return data
    for coding in reversed([c.strip().lower() for c in content_encoding.split(",") if c.strip()]):
        decode = _inflate if coding == "deflate" else _DECODERS.get(coding)
        if decode is None:
            raise ValueError(f"content-encoding {coding!r} cannot be undone")
        try:
            data = decode(data)
        except Exception as exc:  # each codec has its own error type; all mean the same here
            raise ValueError(f"the body is not valid {coding}: {exc}") from exc
    return data


def _choice_zero(document: Any) -> dict[str, Any] | None:
    if not isinstance(document, dict):
        return None
    choices = document.get("choices")
    if not isinstance(choices, list):
        return None
    for choice in choices:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return None


def _content_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones, in order
        parts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "".join(parts) if parts else None
    return None


def _choice_text(choice: dict[str, Any], member: str) -> str | None:
    """The text of a choice's `member` (`message`, or a chunk's `delta`); completions' `text` otherwise."""
    message = choice.get(member)
    if isinstance(message, dict):
        return _content_text(message.get("content"))
    text = choice.get("text")
    return text if isinstance(text, str) else None


def _sse_data(body: bytes) -> Iterator[bytes]:
    """The `data` of each complete event (data lines joined by LF); a last event cut short is not dispatched."""
    data: list[bytes] | None = None
    lines = _LINE_END.split(body)
    complete = lines[:-1]  # after the last line end: an unfinished line
    for line in complete:
        if not line:
            if data is not None:
                yield b"\n".join(data)
            data = None
        elif line.startswith(b"data"):
            name, _, value = line.partition(b":")
            if name == b"data":
                (data := data if data is not None else []).append(value[1:] if value.startswith(b" ") else value)


def _looks_like_sse(body: bytes) -> bool:
    head = body.lstrip()[:6]
    return head.startswith((b"data:", b"event:", b"id:", b":"))


def assistant_text(body: bytes, content_type: str | None = None) -> str | None:
    """The assistant's text in a chat/completions response body (streamed or not); None when it has none."""
    if (content_type or "").startswith("text/event-stream") or _looks_like_sse(body):
        pieces: list[str] = []
        seen = False
        for data in _sse_data(body):
            if data.strip() == b"[DONE]":
                continue
            try:
                choice = _choice_zero(msgspec.json.decode(data))
            except msgspec.DecodeError:
                continue
            text = _choice_text(choice, "delta") if choice is not None else None
            if text is not None:
                seen = True
                pieces.append(text)
        return "".join(pieces) if seen else None
    try:
        choice = _choice_zero(msgspec.json.decode(body))
    except msgspec.DecodeError:
        return None
    return _choice_text(choice, "message") if choice is not None else None


def _label(value: Any) -> str | None:
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, bool | int | float):
        return msgspec.json.encode(value).decode()
    return None  # null, an object or an array is not a label


def regex_extractor(pattern: str, timeout_s: float = EXTRACT_TIMEOUT_S) -> LabelExtractor:
    """The first match's one group, stripped; ProjectionError unless the pattern compiles with exactly one group.

    The pattern runs on the `regex` engine (Python's `re` syntax) because it can stop a search: one answer
    may take `timeout_s` at most, then the extractor raises `TimeoutError` (an answer of 41 characters kept
    `re` busy past 30 s with `(a+)+$`)."""
    shown = pattern if len(pattern) <= 80 else pattern[:80] + "…"
    try:
        compiled = regex.compile(pattern)
    except regex.error as exc:
        raise ProjectionError(f"--extract {shown!r} is not a valid regular expression: {exc}") from exc
    except RecursionError:  # the engine's parser recurses per nested group
        raise ProjectionError(
            f"--extract {shown!r} nests its groups too deeply to compile: a label needs a few levels at most"
        ) from None
    if compiled.groups != 1:
        raise ProjectionError(
            f"--extract {shown!r} has {compiled.groups} groups: it needs exactly one, around the label "
            "(make the others non-capturing with (?:...))"
        )

    def extract(text: str) -> str | None:
        match = compiled.search(text, timeout=timeout_s)
        return _label(match.group(1)) if match is not None else None

    return extract


def json_content(text: str) -> Any:
    """The text parsed as JSON, else the first ```json fenced block that parses; None when neither does."""
    for candidate in (text, *(m.group(1) for m in _FENCE.finditer(text))):
        try:
            return msgspec.json.decode(candidate.strip())
        except msgspec.DecodeError:
            continue
    return None


def _pointer_tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ProjectionError(f"--extract-json {pointer!r} is not a JSON pointer (RFC 6901): start it with '/'")
    if re.search(r"~(?![01])", pointer):
        raise ProjectionError(f"--extract-json {pointer!r}: '~' must be followed by 0 or 1 (RFC 6901)")
    return [token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/")]


def _resolve(document: Any, tokens: list[str]) -> Any:
    for token in tokens:
        if isinstance(document, dict):
            if token not in document:
                return None
            document = document[token]
        elif isinstance(document, list):
            if not re.fullmatch(r"0|[1-9][0-9]*", token) or int(token) >= len(document):
                return None
            document = document[int(token)]
        else:
            return None
    return document


def pointer_extractor(pointer: str) -> LabelExtractor:
    """The value at an RFC 6901 pointer into the JSON content (strings, numbers and booleans are labels)."""
    tokens = _pointer_tokens(pointer)

    def extract(text: str) -> str | None:
        document = json_content(text)
        return None if document is None else _label(_resolve(document, tokens))

    return extract
