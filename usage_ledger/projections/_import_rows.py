"""`ledger import`'s file readers: JSONL lines and CSV records as (line, bytes consumed, fields or a reason).

A line longer than `MAX_LINE_BYTES` is a bad row, read no further than that (never held).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec

from usage_ledger.projections.errors import ProjectionError

__all__ = ("MAX_LINE_BYTES", "Format", "csv_rows", "detect_format", "jsonl_rows")

Format = Literal["jsonl", "csv"]
MAX_LINE_BYTES = 1024 * 1024
"""A row (JSONL line, CSV record) longer than this is a bad row: a call's fields fit in far less."""


def _lines(handle: io.BufferedReader) -> Iterator[tuple[bytes, bool]]:
    """(line, whole) per line; a line over `MAX_LINE_BYTES` is skipped to its end, never held (whole = False)."""
    while raw := handle.readline(MAX_LINE_BYTES + 1):
        if len(raw) <= MAX_LINE_BYTES or raw.endswith(b"\n"):
            yield raw, True
            continue
        while (rest := handle.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
            pass
        yield b"", False


def jsonl_rows(handle: io.BufferedReader) -> Iterator[tuple[int, int, dict[str, Any] | str]]:
    """(line number, bytes consumed, fields or an error reason) per non-blank line."""
    consumed = 0
    for number, (raw, whole) in enumerate(_lines(handle), start=1):
        consumed = handle.tell()
        if not whole:
            yield number, consumed, f"line longer than {MAX_LINE_BYTES:,} bytes"
            continue
        if not raw.strip():
            continue
        try:
            value = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            yield number, consumed, f"invalid JSON: {exc}"
            continue
        yield number, consumed, value if isinstance(value, dict) else "expected a JSON object"


def csv_rows(handle: io.BufferedReader) -> Iterator[tuple[int, int, dict[str, Any] | str]]:
    # surrogateescape: a stray non-UTF-8 byte becomes a row error on its own line, not a traceback
    text = io.TextIOWrapper(handle, encoding="utf-8-sig", errors="surrogateescape", newline="")
    try:
        yield from _csv_records(csv.reader(text))
    finally:
        text.detach()  # the caller owns (and closes) the binary handle


def _csv_records(reader: Any) -> Iterator[tuple[int, int, dict[str, Any] | str]]:
    try:
        header = next(reader)
    except StopIteration:
        return
    if not _is_utf8(header):
        yield 1, 0, "the header row is not valid UTF-8; save the file as UTF-8"
        return
    consumed = 0
    while True:
        line = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield line, consumed, f"invalid CSV: {exc}"
            continue
        consumed += sum(len(c) + 1 for c in cells)
        if not any(c.strip() for c in cells):
            continue
        if not _is_utf8(cells):
            yield line, consumed, "not valid UTF-8; save the file as UTF-8"
            continue
        if len(cells) != len(header):
            yield line, consumed, f"expected {len(header)} columns, got {len(cells)}"
            continue
        fields: dict[str, Any] = {}
        tags: dict[str, str] = {}
        for name, cell in zip(header, cells, strict=True):
            if cell == "":
                continue
            if name.startswith("tag."):
                tags[name[4:]] = cell
            else:
                fields[name] = cell
        if tags:
            fields["tags"] = tags
        yield line, consumed, fields


def _is_utf8(cells: list[str]) -> bool:
    try:
        "".join(cells).encode("utf-8")
    except UnicodeEncodeError:  # surrogate-escaped bytes from an invalid sequence
        return False
    return True


def detect_format(path: Path, given: str | None) -> Format:
    if given in ("jsonl", "csv"):
        return given  # type: ignore[return-value]
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    raise ProjectionError(f"{path}: cannot tell the format from the extension; pass --format jsonl or --format csv")
