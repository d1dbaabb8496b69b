"""The gateway's state directory: its spool and keys in one place (`--state-dir`, `LEDGER_STATE_DIR`), and the files older
gateways left in the working directory taken into it.

    <state_dir>/                 beside a SQLite ledger (`ledger-state/` for `ledger.db`), else per user
      ledger-fingerprint.key     the fingerprint key (`gateway.fingerprint_key`), unless LEDGER_FINGERPRINT_KEY_FILE
      ledger-spool.key           the spool's key (`ledger.spool`)
      spool/events.spool         the outage spool, unless LEDGER_SPOOL_DIR

`adopt_legacy_state` moves an older gateway's `./ledger-fingerprint.key` and `./ledger-spool/` into it, so a key
and a spool not yet replayed are never orphaned (docs/configuration.md, `LEDGER_STATE_DIR`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import structlog

from usage_ledger.gateway.fingerprint_key import DEFAULT_KEY_FILE_NAME
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger import ConfigError, Spool, StorageSettings

__all__ = ("LEGACY_SPOOL_DIR", "adopt_legacy_state")

log = structlog.get_logger("gateway.state")

LEGACY_SPOOL_DIR = "ledger-spool"
"""The spool's old default, relative to the working directory (the keys sat beside it)."""


def _holds_records(spool_dir: Path) -> bool:
    path = spool_dir / Spool.FILE_NAME
    return path.is_file() and path.stat().st_size > 0


def _move(source: Path, target: Path, what: str) -> None:
    shutil.move(source, target)  # a rename, or a copy and a delete across file systems
    log.warning(f"{what}_moved", source=str(source), target=str(target))


def adopt_legacy_state(storage: StorageSettings, settings: GatewaySettings, cwd: Path) -> None:
    """Make the state directory (mode 0700) and move an older gateway's files from `cwd` into it.

    Only where the state directory is in charge: a spool placed by LEDGER_SPOOL_DIR, or a key by
    LEDGER_FINGERPRINT_KEY_FILE, is used where it is. ConfigError when both places hold a spool not yet replayed.
    """
    state = Path(storage.state_dir)
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    if Path(storage.spool_dir) != state / "spool":
        return
    old_key = cwd / DEFAULT_KEY_FILE_NAME
    if (
        settings.fingerprint_key_file is None
        and old_key.is_file()
        and old_key.resolve() != (state / old_key.name).resolve()
    ):
        if (state / old_key.name).exists():
            log.warning("legacy_fingerprint_key_left", path=str(old_key), used=str(state / old_key.name))
        else:
            _move(old_key, state / old_key.name, "fingerprint_key")
    old_spool = cwd / LEGACY_SPOOL_DIR
    if not old_spool.is_dir() or old_spool.resolve() == Path(storage.spool_dir).resolve():
        return
    if not _holds_records(old_spool):
        return  # nothing to replay: left as it is, and no longer read
    target = Path(storage.spool_dir)
    found = list(target.iterdir()) if target.is_dir() else []
    if any(p.name != Spool.FILE_NAME or p.stat().st_size > 0 for p in found):
        raise ConfigError(
            f"{old_spool} (an older gateway's spool) holds events not yet in the ledger, and {target} is not empty; "
            f"replay the older one first: `ledger spool replay --spool-dir {old_spool}`"
        )
    for empty in found:
        empty.unlink()
    if target.is_dir():
        target.rmdir()
    old_spool_key = cwd / Spool.KEY_FILE_NAME  # its records are keyed with the key beside it
    if old_spool_key.is_file():
        (state / Spool.KEY_FILE_NAME).unlink(missing_ok=True)
        _move(old_spool_key, state / Spool.KEY_FILE_NAME, "spool_key")
    _move(old_spool, target, "spool")
