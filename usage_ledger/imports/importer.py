"""`ledger import`: historical calls from JSONL or CSV files (DESIGN §6), one `call.imported` each.

- Streamed, in two passes (`import_file`): the first validates every row and checks it against the
  ledger, the second appends, a batch at a time, so memory holds a batch and not the file. Atomic per
  file: the second pass is one transaction, and a bad row means nothing of the file is imported,
  unless `skip_invalid`.
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

import asyncio
import hashlib
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import msgspec

from usage_ledger.imports._identity import NAMESPACE, content_event_id, reconcile_with_ledger
from usage_ledger.imports._record import RowError, parse_record
from usage_ledger.imports._rows import MAX_LINE_BYTES, Format, csv_rows, detect_format, jsonl_rows, line_of
from usage_ledger.ledger import (
    AppendResult,
    AppendStream,
    CallImported,
    Database,
    NewEvent,
    appending,
    call_stream,
    new_event,
    translate_db_error,
)
from usage_ledger.projections import ImportFailed, ProjectionError

__all__ = ("MAX_LINE_BYTES", "ImportResult", "RowError", "import_file", "parse_file", "parse_record")

Progress = Callable[[int, int], None]
_canonical = msgspec.json.Encoder(order="sorted")
_LONG_CALL = timedelta(days=1)
_LONG_RUN = timedelta(days=7)


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


_BATCH = 2000
"""Rows checked against the ledger, and appended (to the file's one transaction), at a time: memory holds
one batch, not the file."""

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
            event = new_event(body, stream=call_stream(body.call_id), occurred_at=body.finished_at, event_id=event_id)
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
    against the ledger; only then does the second read the file again and append it, `_BATCH` rows at a
    time into one transaction (`ledger.appending`). Atomic per file: a bad row anywhere, or a failure
    during the second pass (the database gone, the process killed), appends nothing of the file; the
    same import again appends all of it. Other appenders (a gateway) wait for the second pass to commit:
    it holds the ledger's write lock (SQLite) or the chain's head (PostgreSQL).
    """
    path = Path(path)
    if not path.is_file():
        raise ProjectionError(f"{path}: no such file")
    kind = detect_format(path, fmt)
    source = source or path.name
    size = path.stat().st_size  # the two passes report progress over twice the file
    checked = await _check(database, path, kind, source, progress, size)
    errors = sorted(checked.errors, key=line_of)
    if errors and not skip_invalid:
        raise ImportFailed(errors)
    async with appending(database) as stream:
        await _append_rows(stream, _rows(path, kind, source), checked.skip, progress, size)
    if progress is not None:
        progress(2 * size, 2 * size)
    return ImportResult(
        file=str(path),
        source=source,
        rows=checked.rows,
        appended=stream.appended,
        duplicates=checked.stored + stream.duplicates,
        invalid=len(errors),
        errors=errors,
        warnings=sorted(checked.warnings, key=line_of),
    )


async def _append_rows(
    stream: AppendStream, rows: Iterator[_Row], skip: set[uuid.UUID], progress: Progress | None, size: int
) -> None:
    """The second pass: the rows into `stream`, `_BATCH` at a time, the next batch read while one is appended
    (on the appender's thread), so the file's transaction, which other appenders wait for, ends sooner."""
    sending: asyncio.Task[AppendResult] | None = None
    try:
        batch: list[NewEvent] = []
        for _, consumed, row, _ in rows:
            if isinstance(row, str) or row.event_id in skip:
                continue
            batch.append(row)
            if len(batch) >= _BATCH:
                sending = await _send(stream, batch, sending)
                batch = []
                if progress is not None:
                    progress(size + consumed, 2 * size)
        if batch:
            sending = await _send(stream, batch, sending)
        if sending is not None:
            await sending
    finally:
        # the pass failed or was cancelled (the transaction is rolled back anyway): no batch left in flight,
        # and the error raised is the one that ended the pass, not one of the batch's left unread
        if sending is not None and not sending.done():
            sending.cancel()
        elif sending is not None and not sending.cancelled():
            sending.exception()


async def _send(
    stream: AppendStream, batch: list[NewEvent], before: asyncio.Task[AppendResult] | None
) -> asyncio.Task[AppendResult]:
    """`batch` on its way into `stream` once `before` is in (one batch in flight, one being read)."""
    if before is not None:
        await before
    sending = asyncio.create_task(stream.add(batch))
    await asyncio.sleep(0)  # one turn of the loop: the task hands the batch to the appender before the file is read on
    return sending
