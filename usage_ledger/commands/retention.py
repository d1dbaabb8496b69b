"""`ledger redact --before DATE | --run RUN`: erase the bodies of the calls a rule selects, and the same
erasure for `ledger serve --keep-bodies DAYS` (the composition hands `erase_older` to the gateway).

The selection is `answers.plan_erasure` (reads the calls read model); each batch of its bodies is erased by
`ledger.erase_bodies` (the `blob.redacted` events first, then the bytes), so a run cut anywhere is finished
by running it again.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta

import msgspec

from usage_ledger.answers import BodySelection, plan_erasure
from usage_ledger.commands.support import checked_database, settings_from_args
from usage_ledger.ledger import ERASE_BATCH, ConfigError, Database, erase_bodies, reclaim_space

__all__ = ("Erased", "erase_older", "erase_selected", "parse_before", "redact_selected")


class Erased(msgspec.Struct, frozen=True, kw_only=True):
    """What an erasure by rule did (or, with `dry_run`, would do)."""

    calls: int
    bodies: int
    raw_bytes: int
    stored_bytes: int
    kept_shared: int
    already_erased: int
    resumed: int = 0
    """Bodies whose `blob.redacted` an interrupted erase had appended: finished now."""


async def erase_selected(
    database: Database,
    selection: BodySelection,
    reason: str,
    *,
    dry_run: bool = False,
    refresh: bool = True,
    batch: int = ERASE_BATCH,
    after_batch: Callable[[int], None] | None = None,
) -> Erased:
    """Erase the bodies `selection` picks, `batch` at a time (`after_batch` gets each batch's count); `refresh`:
    catch the read models up first (`plan_erasure`)."""
    plan = await plan_erasure(database, selection, refresh=refresh)
    try:
        erased = resumed = stored = 0
        kept = plan.kept_shared
        if not dry_run:
            for digests in plan.batches(batch):
                if not selection.include_shared:
                    reused = await plan.referenced_since(database, digests)
                    kept += len(reused)
                    digests = [digest for digest in digests if digest not in reused]
                done = await erase_bodies(database, digests, reason)
                erased += done.erased
                resumed += done.resumed
                stored += done.stored_bytes
                if after_batch is not None:
                    after_batch(done.erased)
        return Erased(
            calls=plan.calls,
            bodies=plan.bodies if dry_run else erased,
            raw_bytes=plan.raw_bytes,
            stored_bytes=plan.stored_bytes if dry_run else stored,
            kept_shared=kept,
            already_erased=plan.already_erased,
            resumed=resumed,
        )
    finally:
        plan.close()


async def erase_older(database: Database, days: float, *, after_batch: Callable[[int], None] | None = None) -> Erased:
    """`ledger serve --keep-bodies DAYS`: erase the bodies of calls started more than `days` ago (the gateway's
    follower keeps the read model; calls it has not folded yet are outside the selection)."""
    selection = BodySelection(before=datetime.now(UTC) - timedelta(days=days))
    reason = f"retention: bodies are kept {days:g} days (ledger serve --keep-bodies)"
    return await erase_selected(database, selection, reason, refresh=False, after_batch=after_batch)


def parse_before(text: str) -> datetime:
    """`--before`: a date (midnight UTC) or an ISO 8601 time with an offset."""
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), time(), UTC)
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ConfigError(
            f"--before {text!r}: expected a date YYYY-MM-DD (midnight UTC) or an ISO 8601 time with an offset "
            "(2026-09-01T00:00:00+09:00)"
        )
    return moment


async def redact_selected(args: argparse.Namespace) -> int:
    """`ledger redact --before DATE | --run RUN --reason R [--include-shared] [--dry-run] [--vacuum]`."""

    settings = settings_from_args(args)
    if not args.reason.strip():
        raise ConfigError("--reason must say why the bodies are erased")
    before = parse_before(args.before) if args.before is not None else None
    selection = BodySelection(run=args.run, before=before, include_shared=args.include_shared)
    async with checked_database(settings) as database:
        erased = await erase_selected(database, selection, args.reason, dry_run=args.dry_run)
        if args.vacuum and not args.dry_run:
            await reclaim_space(database)
    print(_summary(erased, dry_run=args.dry_run, vacuumed=args.vacuum and not args.dry_run))
    return 0


def _summary(erased: Erased, *, dry_run: bool, vacuumed: bool) -> str:
    verb = "would erase" if dry_run else "erased"
    lines = [
        f"{verb} {erased.bodies:,} bodies of {erased.calls:,} calls "
        f"({_size(erased.stored_bytes)} stored, {_size(erased.raw_bytes)} uncompressed)"
    ]
    if erased.kept_shared:
        lines.append(
            f"kept {erased.kept_shared:,} bodies a call outside the selection also references "
            "(--include-shared erases them too)"
        )
    if erased.already_erased:
        lines.append(f"{erased.already_erased:,} bodies were erased before")
    if erased.resumed:
        lines.append(f"{erased.resumed:,} bodies finished whose blob.redacted an interrupted erase had appended")
    if vacuumed:
        lines.append("space given back (VACUUM)")
    elif not dry_run and erased.bodies:
        lines.append("the space is reused by new bodies; --vacuum gives it back (docs/operations.md)")
    return "\n".join(lines)


def _size(n: int) -> str:
    if n < 1000:
        return f"{n:,} B"
    value = float(n)
    for unit in ("KB", "MB", "GB"):
        value /= 1000
        if value < 1000 or unit == "GB":
            break
    return f"{value:,.1f} {unit}"
