"""The one reader of imported files (`ledger import`; `labels import` and `returns import` read CSV with it).

Rows come as (line, bytes consumed, the row or an error reason): JSONL lines, CSV records. A line
longer than `MAX_LINE_BYTES` is a bad row, read no further than that (never held); bytes that are not
UTF-8 make a bad row too. The callers add the file's name: `file:line: reason`.
"""

from __future__ import annotations

import contextlib
import csv
import io
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec

from usage_ledger.projections import ProjectionError

__all__ = ("MAX_LINE_BYTES", "Format", "Record", "csv_records", "csv_rows", "detect_format", "jsonl_rows", "line_of")

Format = Literal["jsonl", "csv"]
MAX_LINE_BYTES = 1024 * 1024
"""A row (JSONL line, CSV record) longer than this is a bad row: a call's fields fit in far less."""
Record = tuple[int, int, list[str] | str]
"""A CSV record: (line, bytes consumed, its cells or an error reason)."""


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
        except RecursionError:  # msgspec's, not ours: a call's fields are never nested this deep
            yield number, consumed, "invalid JSON: nested too deeply"
            continue
        yield number, consumed, value if isinstance(value, dict) else "expected a JSON object"


def csv_records(handle: io.BufferedReader) -> Generator[Record, None, None]:
    """The header, then every non-blank record: (line, bytes consumed, cells or an error reason).

    The header comes first, as line 1, its names stripped; an empty file yields nothing, and a header
    that cannot be read (invalid CSV, not UTF-8, a line over the cap) is a reason that ends the file.
    Each record after it has as many cells as the header, in valid UTF-8, or is a reason.
    """
    # surrogateescape: a stray non-UTF-8 byte becomes a row error on its own line, not a traceback
    text = io.TextIOWrapper(handle, encoding="utf-8-sig", errors="surrogateescape", newline="")
    try:
        yield from _records(handle, text)
    finally:
        text.detach()  # the caller owns (and closes) the binary handle


def _records(handle: io.BufferedReader, text: io.TextIOWrapper) -> Iterator[Record]:
    too_long: list[int] = []  # lines over the cap, given to the CSV reader as blank lines
    reader = csv.reader(_capped(text, too_long))
    header: list[str] | None = None
    while True:
        first = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            cells, reason = [], f"invalid CSV: {exc}"
        else:
            reason = ""
        if too_long and too_long[-1] >= first:
            reason = f"line longer than {MAX_LINE_BYTES:,} bytes"
            first = too_long[-1]
        if header is None:
            if not reason and not _is_utf8(cells):
                reason = "the header row is not valid UTF-8; save the file as UTF-8"
            yield 1, handle.tell(), reason or [name.strip() for name in cells]
            if reason:
                return
            header = cells
            continue
        if reason:
            yield first, handle.tell(), reason
        elif not any(c.strip() for c in cells):
            continue
        elif not _is_utf8(cells):
            yield first, handle.tell(), "not valid UTF-8; save the file as UTF-8"
        elif len(cells) != len(header):
            yield first, handle.tell(), f"expected {len(header)} columns, got {len(cells)}"
        else:
            yield first, handle.tell(), cells


def _capped(text: io.TextIOWrapper, too_long: list[int]) -> Iterator[str]:
    """The file's lines for `csv.reader`; one over `MAX_LINE_BYTES` is read no further, noted, and given as blank."""
    number = 0
    while line := text.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith(("\n", "\r")):
            while (rest := text.readline(MAX_LINE_BYTES)) and not rest.endswith(("\n", "\r")):
                pass
            too_long.append(number)
            line = "\n"
        yield line


def csv_rows(handle: io.BufferedReader) -> Iterator[tuple[int, int, dict[str, Any] | str]]:
    """`ledger import`'s fields per CSV record: empty cells left out, `tag.<name>` columns as `tags`."""
    with contextlib.closing(csv_records(handle)) as records:
        line, consumed, header = next(records, (0, 0, ""))
        if isinstance(header, str):
            if header:
                yield line, consumed, header
            return
        for line, consumed, cells in records:
            if isinstance(cells, str):
                yield line, consumed, cells
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


def line_of(error: str) -> int:
    """The line number of a `file:line: reason` error (the file name may itself contain colons)."""
    number = error.split(": ", 1)[0].rpartition(":")[2]
    return int(number) if number.isdigit() else 0
