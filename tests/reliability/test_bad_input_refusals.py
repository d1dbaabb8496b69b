"""Bad targets and bad rows are refused by the real `ledger` CLI: exit 2, a message saying what to do,
and not one event appended (nothing lost, nothing forged)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from tests.reliability.helpers import ledger_cli, read_ledger


def _row(second: int, **extra: object) -> bytes:
    row = {"started_at": 1772373600 + second, "elapsed_s": 2, "input_tokens": 100, "output_tokens": 10, **extra}
    return msgspec.json.encode({"run": "r", **row}) + b"\n"


async def _count(db: str) -> int:
    return len((await read_ledger(db)).events)


async def test_refusals_append_nothing(backend_url: str, tmp_path: Path) -> None:
    db = backend_url
    assert (await ledger_cli("db", "upgrade", "--db", db)).returncode == 0
    october = tmp_path / "calls-2026-10.jsonl"
    october.write_bytes(_row(0) + _row(1, call_id="c-7"))
    assert (await ledger_cli("import", str(october), "--db", db)).returncode == 0
    assert await _count(db) == 2

    copy = tmp_path / "copy-of-october.jsonl"
    copy.write_bytes(october.read_bytes())
    renamed = await ledger_cli("import", str(copy), "--db", db)
    assert renamed.returncode == 0 and "0 calls imported, 2 already present" in renamed.stdout

    strings = tmp_path / "strings.jsonl"
    strings.write_bytes(_row(10) + _row(11, input_tokens="12"))
    bad = await ledger_cli("import", str(strings), "--db", db)
    assert bad.returncode == 2 and f"{strings}:2: input_tokens" in bad.stderr and "nothing imported" in bad.stderr

    november = tmp_path / "calls-2026-11.jsonl"
    november.write_bytes(_row(20) + _row(21, call_id="c-7", output_tokens=11))
    clash = await ledger_cli("import", str(november), "--db", db)
    assert clash.returncode == 2
    assert f"{november}:2: call_id 'c-7'" in clash.stderr and "calls-2026-10.jsonl:2" in clash.stderr

    annotate = await ledger_cli("annotate", "--run", "nosuchrun", "--hardware", "rtx5090", "--db", db)
    assert annotate.returncode == 2 and "nosuchrun" in annotate.stderr and "--force" in annotate.stderr

    redact = await ledger_cli("redact", "ab" * 32, "--reason", "typo", "--db", db)
    assert redact.returncode == 2 and "no blob" in redact.stderr and "--force" in redact.stderr

    assert await _count(db) == 2
    assert (await ledger_cli("verify", "--db", db)).returncode == 0
