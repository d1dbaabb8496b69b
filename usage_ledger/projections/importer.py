"""`ledger import`: historical calls from JSONL or CSV files (DESIGN §6), one `call.imported` each.

- Streamed, in two passes (`import_file`): the first validates every row and checks it against the
  ledger, the second appends, a batch at a time, so memory holds a batch and not the file. A bad row
  means nothing of the file is imported, unless `skip_invalid`.
- Identity comes from content, never from the file name or `--source`: an event id is a UUIDv5
  over the row's canonical content (sorted keys) and its occurrence number among identical rows of
  the file. Re-importing the same file, or a renamed copy, adds nothing; a row without `call_id`
  gets `imp-<event id>`. (Rows stored under the older, source-scoped ids count as present too.)
- A `call_id` already in the ledger with different content (another file, an earlier import, a
  gateway call) is a bad row naming both places; the same call again (only `source`/`line`
  differ) is a duplicate. Within one file a repeated `call_id` is a bad row.
- JSONL values keep their JSON types: a count or seconds given as a string (`"12"`) is a bad row.
  CSV cells are text, so they are parsed, and counts must still be whole numbers, never negative.
  A whole count outside the plausibility rule (`ledger.counts`: 2⁶³ tokens) is no bad row: it is
  imported as given, its event says `usage_source` `implausible`, and it enters no sum.
- A moment the calendar cannot hold (a start of 9999-12-31T23:59:59Z plus 5 s, 0001-01-01T00:00+05:00,
  `elapsed_s` of 1e300) is a bad row; a span that is valid but unlikely (a call over a day, a run whose
  calls in the file spread over more than a week: a mistyped year) is imported with a warning.
- A line longer than `MAX_LINE_BYTES` is a bad row, read no further than that.
- Errors and warnings read `file:line: reason`.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import msgspec

from usage_ledger.ledger.append import append_events, translate_db_error
from usage_ledger.ledger.counts import count_problem
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallImported, NewEvent, new_event
from usage_ledger.projections._import_identity import NAMESPACE, content_event_id, reconcile_with_ledger
from usage_ledger.projections._import_rows import MAX_LINE_BYTES, Format, csv_rows, detect_format, jsonl_rows
from usage_ledger.projections.errors import ImportFailed, ProjectionError

__all__ = ("MAX_LINE_BYTES", "ImportResult", "RowError", "import_file", "parse_file", "parse_record")

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
    input_tokens = _count(fields["input_tokens"], "input_tokens", from_text)
    output_tokens = _count(fields["output_tokens"], "output_tokens", from_text)
    implausible = "; ".join(
        p for f, v in (("input_tokens", input_tokens), ("output_tokens", output_tokens)) if (p := count_problem(f, v))
    )
    return CallImported(
        call_id=_text(call_id, "call_id") if call_id is not None else f"imp-{event_id.hex}",
        source=source,
        line=line,
        started_at=started,
        finished_at=finished,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        usage_source="implausible" if implausible else "imported",
        usage_detail=implausible,
        run=_text(fields["run"], "run") if fields.get("run") is not None else None,
        tags=tags,
        model=_text(fields["model"], "model") if fields.get("model") is not None else None,
        ttft_s=ttft,
        status=status,
        finish_reason=_text(fields["finish_reason"], "finish_reason")
        if fields.get("finish_reason") is not None
        else None,
    )


_BATCH = 2000
"""Rows checked against the ledger, and appended, at a time: memory holds one batch, not the file."""

_Row = tuple[int, int, NewEvent | str, uuid.UUID | None]
"""(line, bytes consumed, the row's event or its `file:line: reason` error, its pre-content id when it has one)."""


def _rows(path: Path, kind: Format, source: str) -> Iterator[_Row]:
    """Every row of the file in order, parsed; the same rows, ids and errors however often it is read."""
    seen: dict[bytes, int] = {}  # a row's content digest -> how often it occurred so far
    call_lines: dict[str, int] = {}
    with path.open("rb") as handle:
        iterator = jsonl_rows(handle) if kind == "jsonl" else csv_rows(handle)
        for line, consumed, fields in iterator:
            if isinstance(fields, str):
                yield line, consumed, f"{path}:{line}: {fields}", None
                continue
            content = _canonical.encode(fields)
            digest = hashlib.blake2b(content, digest_size=16).digest()
            occurrence = seen.get(digest, 0)
            seen[digest] = occurrence + 1
            event_id = content_event_id(content, occurrence)
            try:
                body = parse_record(fields, source=source, line=line, event_id=event_id, from_text=kind == "csv")
            except RowError as exc:
                yield line, consumed, f"{path}:{line}: {exc}", None
                continue
            first = call_lines.setdefault(body.call_id, line)
            if first != line:
                yield line, consumed, f"{path}:{line}: duplicate call_id {body.call_id!r} (first on line {first})", None
                continue
            legacy = None
            if fields.get("call_id") is None:
                legacy = uuid.uuid5(NAMESPACE, f"{source}\n{occurrence}\n{content.decode()}")
            event = new_event(body, stream=f"call-{body.call_id}", occurred_at=body.finished_at, event_id=event_id)
            yield line, consumed, event, legacy


class _Checked(msgspec.Struct, kw_only=True):
    """What the first pass over a file found: rows, errors, warnings, and the rows the second pass leaves out."""

    rows: int = 0
    errors: list[str] = []
    warnings: list[str] = []
    stored: int = 0
    skip: set[uuid.UUID] = set()
    """Rows already in the ledger, and rows whose call_id is there with other content (errors)."""


class _Spans:
    """Unlikely spans, said as warnings: a call over a day, a run spread over more than a week in the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs: dict[
            str | None, tuple[datetime, int, datetime, int]
        ] = {}  # first start, its line, last end, its line

    def note(self, body: CallImported, warnings: list[str]) -> None:
        line = body.line
        if body.finished_at - body.started_at > _LONG_CALL:
            seconds = (body.finished_at - body.started_at).total_seconds()
            warnings.append(f"{self.path}:{line}: a call of {seconds:,.0f} s (over a day): check its times")
        first_start, first_line, last_end, last_line = self.runs.get(
            body.run, (body.started_at, line, body.finished_at, line)
        )
        if body.started_at < first_start:
            first_start, first_line = body.started_at, line
        if body.finished_at > last_end:
            last_end, last_line = body.finished_at, line
        self.runs[body.run] = (first_start, first_line, last_end, last_line)

    def runs_spread(self, warnings: list[str]) -> None:
        for run, (first_start, first_line, last_end, last_line) in self.runs.items():
            if run is not None and last_end - first_start > _LONG_RUN:
                days = (last_end - first_start).total_seconds() / 86400
                warnings.append(
                    f"{self.path}:{first_line}: run {run!r} spreads over {days:,.1f} days in this file (lines "
                    f"{first_line} to {last_line}): check those dates"
                )


async def _check(
    database: Database, path: Path, kind: Format, source: str, progress: Progress | None, size: int
) -> _Checked:
    """The first pass: every row validated, and checked against the ledger a batch at a time."""
    checked = _Checked()
    spans = _Spans(path)
    batch: list[NewEvent] = []
    legacy: dict[uuid.UUID, uuid.UUID] = {}

    async def reconcile() -> None:
        try:
            stored, conflicting, errors = await reconcile_with_ledger(database, path, batch, legacy)
        except Exception as exc:
            raise translate_db_error(exc, database) from exc
        checked.stored += len(stored)
        checked.skip |= stored | conflicting
        checked.errors.extend(errors)
        batch.clear()
        legacy.clear()

    for _, consumed, row, pre_content in _rows(path, kind, source):
        checked.rows += 1
        if progress is not None and checked.rows % 2000 == 0:
            progress(consumed, 2 * size)
        if isinstance(row, str):
            checked.errors.append(row)
            continue
        assert isinstance(row.body, CallImported)
        spans.note(row.body, checked.warnings)
        batch.append(row)
        if pre_content is not None:
            legacy[row.event_id] = pre_content
        if len(batch) >= _BATCH:
            await reconcile()
    if batch:
        await reconcile()
    spans.runs_spread(checked.warnings)
    return checked


def parse_file(
    path: Path, *, fmt: str | None = None, source: str | None = None
) -> tuple[list[NewEvent], list[str], int]:
    """(events, `file:line: reason` errors, rows seen) for one file, in memory (for tests and small files)."""
    found: list[NewEvent] = []
    errors: list[str] = []
    rows = 0
    for _, _, row, _ in _rows(path, detect_format(path, fmt), source or path.name):
        rows += 1
        if isinstance(row, str):
            errors.append(row)
        else:
            found.append(row)
    return found, errors, rows


async def import_file(
    database: Database,
    path: str | Path,
    *,
    fmt: str | None = None,
    source: str | None = None,
    skip_invalid: bool = False,
    progress: Progress | None = None,
) -> ImportResult:
    """Import one file; raises `ImportFailed` on bad rows (appending nothing) unless `skip_invalid`.

    Two passes, so memory holds a batch rather than the file: the first validates every row and checks it
    against the ledger; only then does the second read the file again and append it, `_BATCH` rows a
    transaction. A bad row anywhere means nothing is appended. A failure during the second pass (the
    database gone, the process killed) leaves the rows appended so far; the same import again appends
    the rest and nothing twice (ids come from content).
    """
    path = Path(path)
    if not path.is_file():
        raise ProjectionError(f"{path}: no such file")
    kind = detect_format(path, fmt)
    source = source or path.name
    size = _size(path)  # the two passes report progress over twice the file
    checked = await _check(database, path, kind, source, progress, size)
    errors = sorted(checked.errors, key=_line_of)
    if errors and not skip_invalid:
        raise ImportFailed(errors)
    appended = duplicates = 0
    batch: list[NewEvent] = []
    for _, consumed, row, _ in _rows(path, kind, source):
        if isinstance(row, str) or row.event_id in checked.skip:
            continue
        batch.append(row)
        if len(batch) >= _BATCH:
            result = await append_events(database, batch)
            appended, duplicates = appended + result.appended, duplicates + result.duplicates
            batch = []
            if progress is not None:
                progress(size + consumed, 2 * size)
    if batch:
        result = await append_events(database, batch)
        appended, duplicates = appended + result.appended, duplicates + result.duplicates
    if progress is not None:
        progress(2 * size, 2 * size)
    return ImportResult(
        file=str(path),
        source=source,
        rows=checked.rows,
        appended=appended,
        duplicates=checked.stored + duplicates,
        invalid=len(errors),
        errors=errors,
        warnings=sorted(checked.warnings, key=_line_of),
    )


def _size(path: Path) -> int:
    return path.stat().st_size


def _line_of(error: str) -> int:
    """The line number of a `file:line: reason` error (the file name may itself contain colons)."""
    head = error.split(": ", 1)[0]
    number = head.rpartition(":")[2]
    return int(number) if number.isdigit() else 0
