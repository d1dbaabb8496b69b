"""Decoding a copy of a compressed response body, so its usage can be read; the client gets the bytes as sent.

    decoder = BodyDecoder.for_encoding(b"gzip")   # None for identity; raises UnreadableBody if unknown
    text = decoder.feed(chunk) ...                 # incremental: works on a stream as it arrives

Content codings (RFC 9110 §8.4): gzip / x-gzip and deflate (zlib), br (brotli), zstd (zstandard).
Several codings are undone in reverse order of application. The decoded copy is capped
(`MAX_DECODED_BYTES`): a body that expands past it is reported unreadable instead of held in memory.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import brotli
import zstandard

__all__ = ("MAX_DECODED_BYTES", "BodyDecoder", "UnreadableBody")

MAX_DECODED_BYTES = 256 * 1024 * 1024


class UnreadableBody(Exception):
    """The body cannot be decoded for inspection; the message says why (it is recorded on the call)."""


def _zlib(wbits: int) -> Callable[[bytes], bytes]:
    return zlib.decompressobj(wbits).decompress


def _deflate() -> Callable[[bytes], bytes]:
    """`deflate` is meant to be zlib-wrapped (RFC 9110), but some servers send raw deflate: try both."""
    state: list[zlib._Decompress] = []

    def feed(data: bytes) -> bytes:
        if not state:
            wrapped = zlib.decompressobj()
            try:
                out = wrapped.decompress(data)
            except zlib.error:
                raw = zlib.decompressobj(-zlib.MAX_WBITS)
                state.append(raw)
                return raw.decompress(data)
            state.append(wrapped)
            return out
        return state[0].decompress(data)

    return feed


def _brotli() -> Callable[[bytes], bytes]:
    return brotli.Decompressor().process  # type: ignore[no-any-return]


def _zstd() -> Callable[[bytes], bytes]:
    return zstandard.ZstdDecompressor().decompressobj().decompress


_CODINGS: dict[bytes, Callable[[], Callable[[bytes], bytes]]] = {
    b"gzip": lambda: _zlib(16 + zlib.MAX_WBITS),
    b"x-gzip": lambda: _zlib(16 + zlib.MAX_WBITS),
    b"deflate": _deflate,
    b"br": _brotli,
    b"zstd": _zstd,
}


class BodyDecoder:
    __slots__ = ("_size", "_steps", "name")

    def __init__(self, name: str, steps: list[Callable[[bytes], bytes]]) -> None:
        self.name = name
        self._steps = steps
        self._size = 0

    @classmethod
    def for_encoding(cls, content_encoding: bytes) -> BodyDecoder | None:
        """A decoder for a `Content-Encoding` value; None when the body is not encoded."""
        codings = [c.strip().lower() for c in content_encoding.split(b",")]
        codings = [c for c in codings if c and c != b"identity"]
        if not codings:
            return None
        name = content_encoding.decode("latin-1")
        unknown = [c.decode("latin-1") for c in codings if c not in _CODINGS]
        if unknown:
            raise UnreadableBody(f"the response's content-encoding {name!r} cannot be decoded ({', '.join(unknown)})")
        return cls(name, [_CODINGS[c]() for c in reversed(codings)])

    def feed(self, data: bytes) -> bytes:
        try:
            for step in self._steps:
                data = step(data)
        except Exception as exc:  # each library has its own error class; all mean "not a valid body"
            raise UnreadableBody(f"the {self.name} response body could not be decoded: {exc}") from exc
        self._size += len(data)
        if self._size > MAX_DECODED_BYTES:
            raise UnreadableBody(f"the {self.name} response body decodes to more than {MAX_DECODED_BYTES} bytes")
        return data
