"""`ledger import`: historical calls from JSONL or CSV files (DESIGN §6), one `call.imported` each.

- Atomic per file: the whole file is parsed first and appended in one transaction; a bad row
  means nothing of the file is imported, unless `skip_invalid`.
- Identity comes from content, never from the file name or `--source`: an event id is a UUIDv5
  over the row's canonical content (sorted keys) and its occurrence number among identical rows of
  the file. Re-importing the same file, or a renamed copy, adds nothing; a row without `call_id`
  gets `imp-<event id>`. (Rows stored under the older, source-scoped ids count as present too.)
- A `call_id` already in the ledger with different content (another file, an earlier import, a
  gateway call) is a bad row naming both places; the same call again (only `source`/`line`
  differ) is a duplicate. Within one file a repeated `call_id` is a bad row.
- JSONL values keep their JSON types: a count or seconds given as a string (`"12"`) is a bad row.
  CSV cells are text, so they are parsed, and counts must still be whole numbers.
- A moment the calendar cannot hold (a start of 9999-12-31T23:59:59Z plus 5 s, 0001-01-01T00:00+05:00,
  `elapsed_s` of 1e300) is a bad row; a span that is valid but unlikely (a call over a day, a run whose
  calls in the file spread over more than a week: a mistyped year) is imported with a warning.
- A line longer than `MAX_LINE_BYTES` is a bad row, read no further than that.
- Errors and warnings read `file:line: reason`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import msgspec

from usage_ledger.ledger.append import append_events, translate_db_error
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallImported, NewEvent, new_event
from usage_ledger.projections._import_identity import NAMESPACE, Parsed, content_event_id, reconcile_with_ledger
from usage_ledger.projections.errors import ImportFailed, ProjectionError

__all__ = ("MAX_LINE_BYTES", "ImportResult", "RowError", "import_file", "parse_file", "parse_record")

Format = Literal["jsonl", "csv"]
Progress = Callable[[int, int], None]
_KNOWN = frozenset(
    {
        "started_at",
        "finished_at",
        "elapsed_s",
        "input_tokens",
        "output_tokens",
        "run",
        "ticker",
        "model",
        "ttft_s",
        "status",
        "tags",
        "call_id",
        "finish_reason",
    }
)
_canonical = msgspec.json.Encoder(order="sorted")
_MAX_TEXT = 255
MAX_LINE_BYTES = 1024 * 1024
"""A row (JSONL line, CSV record) longer than this is a bad row: a call's fields fit in far less."""
_LONG_CALL = timedelta(days=1)
_LONG_RUN = timedelta(days=7)


class RowError(ValueError):
    """One invalid row: the reason (the caller adds `file:line`)."""


class ImportResult(msgspec.Struct, frozen=True, kw_only=True):
    file: str
    source: str
    rows: int
    appended: int
    duplicates: int
    invalid: int
    errors: list[str] = []
    warnings: list[str] = []
    """Rows imported as given whose spans are unlikely (`file:line: reason`)."""


def _time(value: Any, field: str, text_numbers: bool = True) -> datetime:
    if isinstance(value, bool):
        raise RowError(f"{field}: expected ISO 8601 with offset or epoch seconds, got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise RowError(f"{field}: epoch seconds must be finite")
        try:
            return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=value)
        except OverflowError:
            raise RowError(f"{field}: epoch seconds {value!r} out of range") from None
    if not isinstance(value, str):
        raise RowError(f"{field}: expected ISO 8601 with offset or epoch seconds, got {type(value).__name__}")
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not text_numbers:
            raise RowError(f"{field}: epoch seconds must be a JSON number, not the string {value!r} (drop the quotes)")
        return _time(seconds, field)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise RowError(f"{field}: {value!r} is neither ISO 8601 nor epoch seconds") from None
    if parsed.tzinfo is None:
        raise RowError(f"{field}: {value!r} has no UTC offset (add Z or +09:00, or give epoch seconds)")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise RowError(f"{field}: {value!r} is before 0001-01-01 or after 9999-12-31 in UTC") from None


def _count(value: Any, field: str, text_numbers: bool = True) -> int:
    if isinstance(value, str) and not text_numbers:
        raise RowError(f"{field}: expected a whole number, got the string {value!r} (drop the quotes)")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise RowError(f"{field}: expected a whole number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RowError(f"{field}: expected a whole number, got {value!r}")
    if value < 0:
        raise RowError(f"{field}: must be >= 0, got {value}")
    return value


def _seconds(value: Any, field: str, text_numbers: bool = True) -> float:
    if isinstance(value, str) and not text_numbers:
        raise RowError(f"{field}: expected seconds as a number, got the string {value!r} (drop the quotes)")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise RowError(f"{field}: expected seconds, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RowError(f"{field}: expected seconds, got {value!r}")
    if value < 0:
        raise RowError(f"{field}: must be >= 0, got {value}")
    return float(value)


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise RowError(f"{field}: expected a string, got {type(value).__name__}")
    if not value or len(value) > _MAX_TEXT or any(ord(ch) < 32 for ch in value):
        raise RowError(f"{field}: must be 1-{_MAX_TEXT} characters without control characters")
    return value


def parse_record(
    fields: dict[str, Any], *, source: str, line: int, event_id: uuid.UUID, from_text: bool = False
) -> CallImported:
    """Validate one row's fields into a `call.imported` body.

    JSON values must have their JSON types (`"input_tokens": "12"` is refused); `from_text` (CSV,
    where every cell is text) parses numbers from strings, still refusing non-integer counts.
    """
    unknown = sorted(set(fields) - _KNOWN)
    if unknown:
        raise RowError(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN))}")
    for required in ("started_at", "input_tokens", "output_tokens"):
        if fields.get(required) is None:
            raise RowError(f"missing required field {required}")
    started = _time(fields["started_at"], "started_at", from_text)
    finished_raw, elapsed_raw = fields.get("finished_at"), fields.get("elapsed_s")
    if finished_raw is None and elapsed_raw is None:
        raise RowError("missing finished_at or elapsed_s (one is required)")
    finished = _time(finished_raw, "finished_at", from_text) if finished_raw is not None else None
    if elapsed_raw is not None:
        elapsed = _seconds(elapsed_raw, "elapsed_s", from_text)
        try:
            by_elapsed = started + timedelta(seconds=elapsed)
        except OverflowError:
            raise RowError(f"elapsed_s: {elapsed:g} s after started_at is past 9999-12-31") from None
        if finished is not None and abs((finished - by_elapsed).total_seconds()) > 0.001:
            raise RowError("finished_at and elapsed_s disagree (give one of them)")
        finished = finished or by_elapsed
    assert finished is not None
    if finished < started:
        raise RowError("finished_at is before started_at")
    tags_raw = fields.get("tags") or {}
    if not isinstance(tags_raw, dict):
        raise RowError("tags: expected an object of string values")
    tags = {_text(k, "tags").lower(): _text(v, f"tags.{k}") for k, v in tags_raw.items()}
    ticker = fields.get("ticker")
    if ticker is not None:
        ticker = _text(ticker, "ticker")
        if tags.get("ticker", ticker) != ticker:
            raise RowError("ticker and tags.ticker disagree")
        tags["ticker"] = ticker
    status_raw = fields.get("status") or "ok"
    if status_raw not in ("ok", "error"):
        raise RowError(f"status: expected ok or error, got {status_raw!r}")
    status: Literal["ok", "error"] = "ok" if status_raw == "ok" else "error"
    ttft = _seconds(fields["ttft_s"], "ttft_s", from_text) if fields.get("ttft_s") is not None else None
    if ttft is not None and ttft > (finished - started).total_seconds() + 0.001:
        raise RowError(f"ttft_s ({ttft:g} s) is longer than the call ({(finished - started).total_seconds():g} s)")
    call_id = fields.get("call_id")
    return CallImported(
        call_id=_text(call_id, "call_id") if call_id is not None else f"imp-{event_id.hex}",
        source=source,
        line=line,
        started_at=started,
        finished_at=finished,
        input_tokens=_count(fields["input_tokens"], "input_tokens", from_text),
        output_tokens=_count(fields["output_tokens"], "output_tokens", from_text),
        run=_text(fields["run"], "run") if fields.get("run") is not None else None,
        tags=tags,
        model=_text(fields["model"], "model") if fields.get("model") is not None else None,
        ttft_s=ttft,
        status=status,
        finish_reason=_text(fields["finish_reason"], "finish_reason")
        if fields.get("finish_reason") is not None
        else None,
    )


def _lines(handle: io.BufferedReader) -> Iterator[tuple[bytes, bool]]:
    """(line, whole) per line; a line over `MAX_LINE_BYTES` is skipped to its end, never held (whole = False)."""
    while raw := handle.readline(MAX_LINE_BYTES + 1):
        if len(raw) <= MAX_LINE_BYTES or raw.endswith(b"\n"):
            yield raw, True
            continue
        while (rest := handle.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
            pass
        yield b"", False


def _jsonl_rows(handle: io.BufferedReader) -> Iterator[tuple[int, int, dict[str, Any] | str]]:
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


def _csv_rows(handle: io.BufferedReader) -> Iterator[tuple[int, int, dict[str, Any] | str]]:
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


def _parse(path: Path, fmt: str | None, source: str, progress: Progress | None) -> Parsed:
    kind = detect_format(path, fmt)
    total = os.path.getsize(path)
    parsed = Parsed(events=[], errors=[], warnings=[], rows=0, legacy={})
    seen: dict[bytes, int] = {}  # a row's content digest -> how often it occurred so far
    call_lines: dict[str, int] = {}
    runs: dict[str | None, tuple[datetime, int, datetime, int]] = {}  # earliest start, its line, latest end, its line
    with path.open("rb") as handle:
        iterator = _jsonl_rows(handle) if kind == "jsonl" else _csv_rows(handle)
        for line, consumed, fields in iterator:
            parsed.rows += 1
            if progress is not None and parsed.rows % 2000 == 0:
                progress(consumed, total)
            if isinstance(fields, str):
                parsed.errors.append(f"{path}:{line}: {fields}")
                continue
            content = _canonical.encode(fields)
            digest = hashlib.blake2b(content, digest_size=16).digest()
            occurrence = seen.get(digest, 0)
            seen[digest] = occurrence + 1
            event_id = content_event_id(content, occurrence)
            try:
                body = parse_record(fields, source=source, line=line, event_id=event_id, from_text=kind == "csv")
            except RowError as exc:
                parsed.errors.append(f"{path}:{line}: {exc}")
                continue
            first = call_lines.setdefault(body.call_id, line)
            if first != line:
                parsed.errors.append(f"{path}:{line}: duplicate call_id {body.call_id!r} (first on line {first})")
                continue
            if fields.get("call_id") is None:
                parsed.legacy[event_id] = uuid.uuid5(NAMESPACE, f"{source}\n{occurrence}\n{content.decode()}")
            if body.finished_at - body.started_at > _LONG_CALL:
                seconds = (body.finished_at - body.started_at).total_seconds()
                parsed.warnings.append(f"{path}:{line}: a call of {seconds:,.0f} s (over a day): check its times")
            first_start, first_line, last_end, last_line = runs.get(
                body.run, (body.started_at, line, body.finished_at, line)
            )
            if body.started_at < first_start:
                first_start, first_line = body.started_at, line
            if body.finished_at > last_end:
                last_end, last_line = body.finished_at, line
            runs[body.run] = (first_start, first_line, last_end, last_line)
            parsed.events.append(
                new_event(body, stream=f"call-{body.call_id}", occurred_at=body.finished_at, event_id=event_id)
            )
    for run, (first_start, first_line, last_end, last_line) in runs.items():
        if run is not None and last_end - first_start > _LONG_RUN:
            days = (last_end - first_start).total_seconds() / 86400
            parsed.warnings.append(
                f"{path}:{first_line}: run {run!r} spreads over {days:,.1f} days in this file (lines {first_line} "
                f"to {last_line}): check those dates"
            )
    if progress is not None:
        progress(total, total)
    return parsed


def parse_file(
    path: Path, *, fmt: str | None = None, source: str | None = None, progress: Progress | None = None
) -> tuple[list[NewEvent], list[str], int]:
    """(events, `file:line: reason` errors, rows seen) for one file."""
    parsed = _parse(path, fmt, source or path.name, progress)
    return parsed.events, parsed.errors, parsed.rows


async def import_file(
    database: Database,
    path: str | Path,
    *,
    fmt: str | None = None,
    source: str | None = None,
    skip_invalid: bool = False,
    progress: Progress | None = None,
) -> ImportResult:
    """Import one file in one transaction; raises `ImportFailed` on bad rows unless `skip_invalid`."""
    path = Path(path)
    if not path.is_file():
        raise ProjectionError(f"{path}: no such file")
    parsed = _parse(path, fmt, source or path.name, progress)
    try:
        todo, stored = await reconcile_with_ledger(database, path, parsed)
    except Exception as exc:
        raise translate_db_error(exc, database) from exc
    errors = sorted(parsed.errors, key=_line_of)
    if errors and not skip_invalid:
        raise ImportFailed(errors)
    result = await append_events(database, todo) if todo else None
    return ImportResult(
        file=str(path),
        source=source or path.name,
        rows=parsed.rows,
        appended=result.appended if result else 0,
        duplicates=stored + (result.duplicates if result else 0),
        invalid=len(errors),
        errors=errors,
        warnings=sorted(parsed.warnings, key=_line_of),
    )


def _line_of(error: str) -> int:
    """The line number of a `file:line: reason` error (the file name may itself contain colons)."""
    head = error.split(": ", 1)[0]
    number = head.rpartition(":")[2]
    return int(number) if number.isdigit() else 0
