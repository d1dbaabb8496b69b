"""Signed checkpoints: the C2SP signed-note format (pinned to Go's golang.org/x/mod/sumdb/note test
vector), the tlog-checkpoint body, key files, and a checkpoint of a real ledger."""

from __future__ import annotations

import base64
import hashlib
import stat
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.ledger.helpers import call_events
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.checkpoint import (
    Checkpoint,
    CheckpointMalformed,
    SignatureRejected,
    SigningKey,
    generate_key,
    load_signing_key,
    load_verifier_key,
    open_checkpoint,
    open_note,
    parse_verifier_key,
    sign_checkpoint,
    sign_note,
    write_key_files,
)
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.errors import ConfigError
from usage_ledger.ledger.verify_ledger import chain_head, snapshot, verify_ledger

# golang.org/x/mod/sumdb/note's documented example: a second implementation to agree with, byte for byte
GO_SIGNER = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VERIFIER = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_NOTE = (
    GO_TEXT
    + "\n— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)


def _go_key() -> SigningKey:
    seed = base64.b64decode(GO_SIGNER.split("+", 4)[4])[1:]
    return SigningKey("PeterNeumann", Ed25519PrivateKey.from_private_bytes(seed))


def test_signed_notes_match_gos_implementation_byte_for_byte() -> None:
    key = _go_key()
    assert key.verifier.vkey() == GO_VERIFIER
    assert sign_note(GO_TEXT, key) == GO_NOTE
    assert open_note(GO_NOTE.encode(), parse_verifier_key(GO_VERIFIER)) == GO_TEXT


def test_the_key_id_is_the_spec_formula() -> None:
    key = generate_key("example.com/ledger")
    raw = key.verifier.raw
    assert key.verifier.key_id == hashlib.sha256(b"example.com/ledger\n\x01" + raw).digest()[:4]


def test_a_checkpoint_body_is_origin_size_root_then_the_recorded_at_extension() -> None:
    checkpoint = Checkpoint(origin="usage-ledger/x", size=12, head_hash="ab" * 32, recorded_at_digest="cd" * 32)
    note = sign_checkpoint(checkpoint, generate_key("k"))
    lines = note.split("\n")
    assert lines[:4] == [
        "usage-ledger/x",
        "12",
        base64.b64encode(bytes.fromhex("ab" * 32)).decode(),
        "recorded-at " + base64.b64encode(bytes.fromhex("cd" * 32)).decode(),
    ]
    assert lines[4] == "" and lines[5].startswith("— k ") and lines[6] == ""


def test_open_rejects_edits_other_keys_and_garbage() -> None:
    key = generate_key("k")
    note = sign_checkpoint(Checkpoint(origin="o", size=3, head_hash="11" * 32), key)
    assert open_checkpoint(note.encode(), key.verifier).size == 3
    with pytest.raises(SignatureRejected, match="does not verify"):
        open_checkpoint(note.replace("\n3\n", "\n2\n").encode(), key.verifier)
    with pytest.raises(SignatureRejected, match="not signed by"):
        open_checkpoint(note.encode(), generate_key("k").verifier)  # same name, other key: ignored, so unsigned
    other = sign_note(Checkpoint(origin="o", size=3, head_hash="11" * 32).text(), generate_key("other"))
    both = note + other.split("\n\n", 1)[1]  # a second signature by an unknown key is ignored
    assert open_checkpoint(both.encode(), key.verifier).size == 3
    for bad in (b"", b"o\n3\n", "o\n3\n\x01\n\n— k AAAA\n".encode(), b"\xff\n\n", note.replace("— ", "- ").encode()):
        with pytest.raises(CheckpointMalformed):
            open_checkpoint(bad, key.verifier)


def test_a_signed_checkpoint_with_a_malformed_body_is_malformed() -> None:
    key = generate_key("k")
    for text in ("o\n03\nAAAA\n", "o\n3\nnot-base64\n", "o\n3\n" + base64.b64encode(b"short").decode() + "\n"):
        with pytest.raises(CheckpointMalformed):
            open_checkpoint(sign_note(text, key).encode(), key.verifier)


def test_key_files_are_private_readable_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "ledger.key"
    key = generate_key("example.com/ledger")
    pub = write_key_files(key, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert pub == tmp_path / "ledger.key.pub"
    assert pub.read_text() == key.verifier.vkey() + "\n"
    loaded = load_signing_key(path)
    assert loaded.name == key.name and loaded.verifier.raw == key.verifier.raw
    assert load_verifier_key(pub).key_id == key.verifier.key_id
    with pytest.raises(ConfigError, match="exists"):
        write_key_files(generate_key("x"), path)
    pub.write_text(pub.read_text().replace("+", "+0", 1))  # an edited key ID
    with pytest.raises(CheckpointMalformed, match="does not match"):
        load_verifier_key(pub)
    with pytest.raises(ConfigError):
        generate_key("has space")


async def test_a_checkpoint_of_the_head_verifies_until_the_ledger_changes(database: Database) -> None:
    key = generate_key("k")
    for index in range(3):
        await append_events(database, call_events(index))
    conn = await snapshot(database)
    try:
        report, checkpoint = await chain_head(conn, None)
    finally:
        await conn.close()
    assert report.ok and checkpoint is not None and checkpoint.size == 6
    assert checkpoint.origin.startswith("usage-ledger/")
    note = ("cp", sign_checkpoint(checkpoint, key).encode())
    intact = await verify_ledger(database, checkpoints=[note], verifier=key.verifier)
    assert intact.ok and intact.checkpoints[0].ok and intact.origin == checkpoint.origin
    await append_events(database, call_events(9))  # growing past a checkpoint is fine
    assert (await verify_ledger(database, checkpoints=[note], verifier=key.verifier)).ok
    forged = (
        "forged",
        sign_checkpoint(Checkpoint(origin=checkpoint.origin, size=6, head_hash="00" * 32), key).encode(),
    )
    failed = await verify_ledger(database, checkpoints=[forged], verifier=key.verifier)
    assert not failed.ok and failed.chain_ok and "re-chained" in (failed.checkpoints[0].problem or "")
    elsewhere_checkpoint = msgspec.structs.replace(checkpoint, origin="other")
    elsewhere = ("o", sign_checkpoint(elsewhere_checkpoint, key).encode())
    [check] = (await verify_ledger(database, checkpoints=[elsewhere], verifier=key.verifier)).checkpoints
    assert not check.ok and "origin" in (check.problem or "")
