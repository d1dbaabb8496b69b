"""`ledger redact` refuses an unknown hash (exit 2, nothing appended) and says when a blob is already redacted."""

from __future__ import annotations

import asyncio

import pytest

from tests.ledger.helpers import call_events, head_of
from usage_ledger.cli import main
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import BlobCompressor, read_blob
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.errors import BlobNotFound

_BODY = b'{"messages": [{"role": "user", "content": "a secret prompt that must go"}]}' * 3


def _body_gone(url: str, digest: str) -> bool:
    async def run() -> bool:
        database = open_database(url, null_pool=True)
        try:
            async with database.engine.connect() as conn:
                await read_blob(conn, digest)
        except BlobNotFound:
            return True
        finally:
            await database.dispose()
        return False

    return asyncio.run(run())


@pytest.fixture
def stored(backend_url: str) -> tuple[str, str]:
    """(ledger URL, hash of a stored request body)."""
    assert main(["db", "upgrade", "--db", backend_url]) == 0
    prepared = BlobCompressor().prepare(_BODY)
    assert prepared is not None

    async def seed() -> None:
        database = open_database(backend_url, null_pool=True)
        try:
            await append_events(database, call_events(0, body_hash=prepared.hash), [prepared])
        finally:
            await database.dispose()

    asyncio.run(seed())
    return backend_url, prepared.hash


def test_an_unknown_hash_is_refused_and_nothing_is_appended(
    stored: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, digest = stored
    unknown = "0" * 64
    before = head_of(url)
    assert main(["redact", unknown, "--reason", "gdpr", "--db", url]) == 2
    err = capsys.readouterr().err
    assert f"no blob {unknown}" in err and "nothing appended" in err and "--force" in err
    assert main(["redact", "not-a-hash", "--reason", "gdpr", "--db", url]) == 2
    assert "64 hex digits" in capsys.readouterr().err
    assert head_of(url) == before
    assert not _body_gone(url, digest)


def test_redact_once_then_say_it_was_already_redacted(
    stored: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, digest = stored
    before = head_of(url)
    assert main(["redact", digest.upper(), "--reason", "gdpr", "--db", url]) == 0
    assert f"blob {digest} redacted" in capsys.readouterr().out
    assert head_of(url) == before + 1 and _body_gone(url, digest)
    assert main(["redact", digest, "--reason", "gdpr", "--db", url]) == 0
    assert "already redacted at" in capsys.readouterr().out
    assert head_of(url) == before + 1


def test_force_records_a_redaction_of_an_unknown_hash(stored: tuple[str, str]) -> None:
    url, _ = stored
    before = head_of(url)
    assert main(["redact", "f" * 64, "--reason", "body arrives from a spool later", "--force", "--db", url]) == 0
    assert head_of(url) == before + 1
