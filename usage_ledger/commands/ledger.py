"""`ledger` subcommands of the ledger package: db (`commands.db`), verify, keygen, checkpoint, events tail,
spool replay, redact."""

from __future__ import annotations

import argparse
import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from usage_ledger.commands.db import register_db
from usage_ledger.commands.support import (
    add_db_option,
    async_command,
    checked_database,
    settings_from_args,
)

if TYPE_CHECKING:
    from usage_ledger.ledger import LedgerReport
    from usage_ledger.projections import ReadModelCheck

__all__ = ("register",)

_HEX64 = re.compile(r"[0-9a-f]{64}")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    register_db(sub)

    verify = sub.add_parser(
        "verify", help="recompute the hash chain, check every blob and checkpoint; exit 0 only if intact"
    )
    add_db_option(verify)
    verify.add_argument(
        "--expect-head", metavar="POSITION:HASH", help="also require this head (an anchor kept elsewhere)"
    )
    verify.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="FILE",
        help="a signed checkpoint (or a directory of them) the ledger must contain; repeatable",
    )
    verify.add_argument("--pubkey", metavar="FILE", help="the verifier key (FILE.pub from `ledger keygen`)")
    verify.add_argument(
        "--clock-skew-s",
        type=float,
        help="how far recorded_at may run behind an earlier row or its occurred_at (default: the ledger's, 120)",
    )
    verify.add_argument(
        "--read-models",
        action="store_true",
        help="also fold the events again and compare each stored read model with the fold, naming rows that differ",
    )
    verify.add_argument("--format", choices=("text", "json"), default="text")
    verify.set_defaults(func=_verify)

    keygen = sub.add_parser("keygen", help="make an Ed25519 checkpoint key: FILE (secret, 0600) and FILE.pub")
    keygen.add_argument("--out", required=True, metavar="FILE")
    keygen.add_argument("--name", default="usage-ledger", help="the key name in signatures (default %(default)s)")
    keygen.set_defaults(func=_keygen)

    checkpoint = sub.add_parser("checkpoint", help="verify the chain, then sign a checkpoint of its head")
    add_db_option(checkpoint)
    checkpoint.add_argument("--key", required=True, metavar="FILE", help="the private key from `ledger keygen`")
    checkpoint.add_argument("--out", required=True, metavar="FILE")
    checkpoint.add_argument(
        "--origin", dest="checkpoint_origin", help="origin line (else LEDGER_CHECKPOINT_ORIGIN, else derived)"
    )
    checkpoint.set_defaults(func=_checkpoint)

    events = sub.add_parser("events", help="read raw events")
    events_sub = events.add_subparsers(dest="events_command", metavar="ACTION", required=True)
    tail = events_sub.add_parser("tail", help="print events as JSON lines")
    add_db_option(tail)
    tail.add_argument("--after", type=int, default=None, help="start after this position (default: the last 20)")
    tail.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    tail.set_defaults(func=_events_tail)

    spool = sub.add_parser("spool", help="the local outage spool")
    spool_sub = spool.add_subparsers(dest="spool_command", metavar="ACTION", required=True)
    replay = spool_sub.add_parser("replay", help="append spooled events to the database, then empty the spool")
    add_db_option(replay)
    replay.add_argument("--spool-dir", dest="spool_dir", help="spool directory (else LEDGER_SPOOL_DIR)")
    replay.add_argument(
        "--accept-unkeyed",
        action="store_true",
        help="also replay records without the spool's key (written by a gateway older than keyed records); "
        "anyone who could write the spool could have forged them",
    )
    replay.set_defaults(func=_spool_replay)

    redact = sub.add_parser(
        "redact", help="erase a stored body, or the bodies of a run or older calls (appends blob.redacted first)"
    )
    add_db_option(redact)
    redact.add_argument("blob_hash", metavar="HASH", nargs="?", help="one body, by its hash")
    redact.add_argument("--before", metavar="DATE", help="the bodies of calls started before DATE (UTC midnight)")
    redact.add_argument("--run", metavar="RUN", help="the bodies of the run's calls")
    redact.add_argument("--reason", required=True)
    redact.add_argument(
        "--include-shared",
        action="store_true",
        help="also erase bodies a call outside the selection references (kept otherwise, and counted)",
    )
    redact.add_argument("--dry-run", action="store_true", help="say how many calls, bodies and bytes would go")
    redact.add_argument("--vacuum", action="store_true", help="then give the space back (SQLite: VACUUM)")
    redact.add_argument(
        "--force", action="store_true", help="append blob.redacted even if the hash is unknown or already redacted"
    )
    redact.set_defaults(func=_redact)


@async_command
async def _verify(args: argparse.Namespace) -> int:
    from usage_ledger.ledger import (
        CLOCK_SKEW,
        ConfigError,
        as_ledger_errors,
        load_verifier_key,
        read_checkpoint_notes,
        verify_ledger,
    )
    from usage_ledger.projections import verify_read_models

    settings = settings_from_args(args)
    anchor = _parse_anchor(args.expect_head) if args.expect_head else None
    if bool(args.checkpoint) != bool(args.pubkey):
        raise ConfigError("--checkpoint and --pubkey go together: the key verifies the checkpoints' signatures")
    skew = CLOCK_SKEW if args.clock_skew_s is None else timedelta(seconds=args.clock_skew_s)
    if skew < timedelta(0):
        raise ConfigError("--clock-skew-s must not be negative")
    verifier = load_verifier_key(Path(args.pubkey)) if args.pubkey else None
    notes = read_checkpoint_notes([Path(p) for p in args.checkpoint])
    async with checked_database(settings) as database:
        with as_ledger_errors(database):
            report = await verify_ledger(
                database,
                expect_head=anchor,
                checkpoints=notes,
                verifier=verifier,
                origin=settings.storage.checkpoint_origin,
                clock_skew=skew,
            )
            # a fold of a broken chain says nothing: the read models are checked on an intact one only
            models = await verify_read_models(database) if args.read_models and report.chain_ok else None
    if args.format == "json":
        out = msgspec.to_builtins(report)
        if args.read_models:
            out["read_models"] = msgspec.to_builtins(models)
        sys.stdout.buffer.write(msgspec.json.encode(out) + b"\n")
    else:
        _print_report(report)
        if args.read_models:
            _print_read_models(models)
    return 0 if report.ok and all(m.ok for m in models or ()) else 1


def _print_report(report: LedgerReport) -> None:
    if report.chain_ok:
        print(f"chain intact: {report.checked} events, head {report.head_position} {report.head_hash}")
    else:
        print(f"chain BROKEN at position {report.first_bad_position}: {report.problem}")
        print(f"({report.checked} events verified before it)")
    if report.blobs is None:
        print("blobs not checked: the chain is broken")
    elif report.blobs.ok:
        print(f"blobs intact: {report.blobs.checked} stored, {report.blobs.referenced} referenced")
    else:
        print(f"blobs BROKEN: {report.blobs.problems_total} problems in {report.blobs.checked} stored blobs")
        for problem in report.blobs.problems:
            where = f" (position {problem.position})" if problem.position is not None else ""
            print(f"  blob {problem.hash}{where}: {problem.problem}")
    if report.blobs is not None and report.blobs.unreferenced:
        print(
            f"  {report.blobs.unreferenced} stored bodies no event references (left by appends that never "
            "committed, or inserted; they change nothing an event says: docs/auditing.md)"
        )
    for check in report.checkpoints:
        if check.ok:
            print(f"checkpoint {check.source}: the ledger contains its head at size {check.size}")
        else:
            print(f"checkpoint {check.source} FAILED: {check.problem}")


def _print_read_models(models: list[ReadModelCheck] | None) -> None:
    if models is None:
        print("read models not checked: the chain is broken")
        return
    for model in models:
        where = f"read model {model.name} (version {model.version}, up to position {model.checkpoint})"
        if model.ok:
            print(f"{where}: equal to the events folded again (digest {model.stored_digest})")
            continue
        print(f"{where} DIFFERS: {model.problem}")
        for row in model.rows:
            print(f"  {row.key}: {row.problem}")
        if model.differing_rows > len(model.rows):
            print(f"  ... and {model.differing_rows - len(model.rows)} more")


@async_command
async def _keygen(args: argparse.Namespace) -> int:
    from usage_ledger.ledger import generate_key, write_key_files

    path = Path(args.out)
    pub = write_key_files(generate_key(args.name), path)
    print(f"private key {path} (keep it secret), verifier key {pub}")
    return 0


@async_command
async def _checkpoint(args: argparse.Namespace) -> int:
    from usage_ledger.ledger import (
        as_ledger_errors,
        chain_head,
        load_signing_key,
        sign_checkpoint,
        snapshot,
        write_checkpoint_file,
    )

    settings = settings_from_args(args, "checkpoint_origin")
    key = load_signing_key(Path(args.key))
    async with checked_database(settings) as database:
        with as_ledger_errors(database):
            conn = await snapshot(database)
            try:
                report, checkpoint = await chain_head(conn, settings.storage.checkpoint_origin)
            finally:
                await conn.close()
    if checkpoint is None:
        print(f"chain BROKEN at position {report.first_bad_position}: {report.problem}; nothing signed")
        return 1
    write_checkpoint_file(Path(args.out), sign_checkpoint(checkpoint, key))
    print(f"checkpoint {args.out}: {checkpoint.origin} size {checkpoint.size} head {checkpoint.head_hash}")
    return 0


def _parse_anchor(text: str) -> tuple[int, str]:
    from usage_ledger.ledger import ConfigError

    position, _, digest = text.partition(":")
    if not position.isdigit() or len(digest) != 64:
        raise ConfigError(f"--expect-head {text!r}: expected POSITION:HASH with a 64-hex-digit hash")
    return int(position), digest.lower()


@async_command
async def _events_tail(args: argparse.Namespace) -> int:
    from usage_ledger.ledger import follow_events, iter_events

    settings = settings_from_args(args)
    encoder = msgspec.json.Encoder()
    out = sys.stdout.buffer
    async with checked_database(settings) as database:
        after = args.after
        if after is None:
            from usage_ledger.ledger import head_position

            async with database.engine.connect() as conn:
                after = max(0, await head_position(conn) - 20)
        source = follow_events(database, after) if args.follow else iter_events(database, after)
        async for stored in source:
            row: dict[str, Any] = msgspec.to_builtins(stored)
            row["payload"] = msgspec.json.decode(stored.payload)
            out.write(encoder.encode(row) + b"\n")
            out.flush()
    return 0


@async_command
async def _spool_replay(args: argparse.Namespace) -> int:
    from usage_ledger.ledger import Spool, replay_spool

    settings = settings_from_args(args, "spool_dir")
    async with checked_database(settings) as database:
        with Spool(settings.storage.spool_dir) as spool:
            appended, duplicates = await replay_spool(database, spool, accept_unkeyed=args.accept_unkeyed)
    print(f"spool replayed: {appended} events appended, {duplicates} already present")
    return 0


@async_command
async def _redact(args: argparse.Namespace) -> int:
    from usage_ledger.ledger import (
        BlobNotFound,
        BlobRedacted,
        ConfigError,
        append_events,
        as_ledger_errors,
        blob_redacted_at,
        blob_stream,
        new_event,
        redact_blob,
    )

    by_rule = args.before is not None or args.run is not None
    if by_rule == (args.blob_hash is not None):
        raise ConfigError("redact takes a HASH, or --before DATE and/or --run RUN, not both")
    if by_rule:
        if args.force:
            raise ConfigError("--force goes with a HASH, not with --before or --run")
        from usage_ledger.commands.retention import redact_selected

        return await redact_selected(args)
    if args.include_shared or args.dry_run or args.vacuum:
        raise ConfigError("--include-shared, --dry-run and --vacuum go with --before or --run")
    settings = settings_from_args(args)
    # Redaction is for client data: the bodies (`request_blob`, `response_blob`). A call's
    # `chunk_gaps_blob` holds arrival timings only, so erasing a call's bodies never needs it.
    digest = args.blob_hash.strip().lower()
    if not _HEX64.fullmatch(digest):
        raise ConfigError(
            f"{args.blob_hash!r} is not a blob hash: expected 64 hex digits "
            "(copy it from the body lines of `ledger show call ID`)"
        )
    if not args.reason.strip():
        raise ConfigError("--reason must say why the body is erased")
    async with checked_database(settings) as database:
        with as_ledger_errors(database):
            try:
                async with database.engine.connect() as conn:
                    redacted_at = await blob_redacted_at(conn, digest)
            except BlobNotFound:
                if not args.force:
                    raise BlobNotFound(
                        f"no blob {digest} in the ledger: nothing redacted, nothing appended; copy the hash from "
                        "the body lines of `ledger show call ID`, or pass --force to record the redaction anyway"
                    ) from None
                redacted_at = None
            if redacted_at is not None and not args.force:
                print(f"blob {digest} was already redacted at {redacted_at.isoformat()}: nothing appended")
                return 0
            await append_events(
                database,
                [new_event(BlobRedacted(blob_hash=digest, reason=args.reason), stream=blob_stream(digest))],
            )
            async with database.engine.begin() as conn:
                changed = await redact_blob(conn, digest)
    print(
        f"blob {digest} redacted"
        if changed
        else f"blob.redacted appended (--force); blob {digest}: nothing to erase (unknown or already redacted)"
    )
    return 0
