"""Bad input and unreachable databases: clear messages, exit code 2, nothing changed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ledger.helpers import call_events
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.errors import ConfigError
from usage_ledger.ledger.spool import Spool, SpoolRecord
from usage_ledger.ledger.sqlite_append import SqliteAppender
from usage_ledger.projections.settings import ReportSettings
from usage_ledger.settings import Settings, load_settings

REPO = Path(__file__).resolve().parents[2]


def ledger_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "usage_ledger.cli", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_unknown_url_scheme_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unsupported database URL scheme 'mysql'"):
        open_database("mysql://root@localhost/db")


def test_cli_unknown_scheme_exits_2() -> None:
    result = ledger_cli("verify", "--db", "mysql://root@localhost/db")
    assert result.returncode == 2
    assert "unsupported database URL scheme" in result.stderr


def test_cli_unreachable_database_exits_2() -> None:
    result = ledger_cli("db", "upgrade", "--db", "postgresql://postgres@127.0.0.1:1/nowhere")
    assert result.returncode == 2
    assert "cannot reach the database" in result.stderr


def test_cli_unmigrated_database_says_what_to_do(tmp_path: Path) -> None:
    result = ledger_cli("verify", "--db", f"sqlite:///{tmp_path / 'empty.db'}")
    assert result.returncode == 2
    assert "ledger db upgrade" in result.stderr


def test_cli_corrupt_spool_exits_2(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'l.db'}"
    assert ledger_cli("db", "upgrade", "--db", db).returncode == 0
    with Spool(tmp_path / "spool") as spool:
        spool.write(SpoolRecord(events=call_events(1)))
        spool.write(SpoolRecord(events=call_events(2)))
        data = bytearray(spool.path.read_bytes())
        data[10] ^= 0xFF
        spool.path.write_bytes(bytes(data))
    result = ledger_cli("spool", "replay", "--db", db, "--spool-dir", str(tmp_path / "spool"))
    assert result.returncode == 2
    assert "fails its checksum" in result.stderr


def test_unknown_ledger_env_var_fails_fast() -> None:
    with pytest.raises(ConfigError, match="unknown environment variable LEDGER_DATABSE_URL"):
        load_settings({"LEDGER_DATABSE_URL": "sqlite:///x.db"})


def test_env_is_coerced_and_flags_win() -> None:
    settings = load_settings(
        {"LEDGER_PORT": "9000", "LEDGER_RUN_GAP_S": "60", "LEDGER_HOST": "0.0.0.0"}, {"port": 9100, "host": None}
    )
    assert settings == Settings(
        gateway=GatewaySettings(port=9100, host="0.0.0.0"), reports=ReportSettings(run_gap_s=60.0)
    )


def test_invalid_setting_value_is_reported_by_its_variable() -> None:
    with pytest.raises(ConfigError, match=r"invalid setting: .* at LEDGER_DURABILITY"):
        load_settings({"LEDGER_DURABILITY": "sometimes"})
    with pytest.raises(ConfigError, match="Expected `int`, got `str` - at LEDGER_PORT"):
        load_settings({}, {"port": "eighty"})


@pytest.mark.parametrize("token", ["", "  "])
def test_an_empty_admin_token_is_refused_not_read_as_no_token(token: str) -> None:
    """Set but empty would leave the admin API, metrics and dashboard open while looking guarded."""
    with pytest.raises(ConfigError, match="LEDGER_ADMIN_TOKEN is set but empty") as raised:
        load_settings({"LEDGER_ADMIN_TOKEN": token})
    assert "$." not in str(raised.value)
    assert load_settings({}).gateway.admin_token is None
    for command in (["serve", "--upstream", "http://127.0.0.1:9"], ["ui"]):
        result = ledger_cli(*command, "--db", "sqlite:///never.db", env={**os.environ, "LEDGER_ADMIN_TOKEN": token})
        assert result.returncode == 2 and "LEDGER_ADMIN_TOKEN is set but empty" in result.stderr, result


def test_every_layer_owns_its_settings_and_the_variables_keep_their_names() -> None:
    """Each section is one layer's own Struct; together they read the same `LEDGER_*` names as before."""
    sections = {name: type(getattr(Settings(), name)).__module__ for name in Settings.__struct_fields__}
    assert sections == {
        "storage": "usage_ledger.ledger.settings",
        "log": "usage_ledger.ledger.settings",
        "gateway": "usage_ledger.gateway.settings",
        "reports": "usage_ledger.projections.settings",
        "otel": "usage_ledger.otel.settings",
    }
    fields = [f for name in Settings.__struct_fields__ for f in type(getattr(Settings(), name)).__struct_fields__]
    assert len(fields) == len(set(fields)) == 40  # + state_dir, min_body_rate (wave 3); keep_bodies_*, pg_*_timeout_s
    documented = set(re.findall(r"`(LEDGER_[A-Z_]+)`", (REPO / "docs" / "configuration.md").read_text()))
    assert {f"LEDGER_{f.upper()}" for f in fields} <= documented


async def test_sqlite_synchronous_setting_reaches_both_connections(tmp_path: Path) -> None:
    from sqlalchemy import text

    from usage_ledger.ledger.migrate import upgrade_database

    database = open_database(f"sqlite:///{tmp_path / 'l.db'}", sqlite_synchronous="normal")
    await upgrade_database(database)
    async with database.engine.connect() as conn:
        assert (await conn.execute(text("PRAGMA synchronous"))).scalar_one() == 1  # NORMAL
    assert isinstance(database.appender, SqliteAppender)
    assert database.appender.synchronous == "NORMAL"
    await database.dispose()
    with pytest.raises(ConfigError, match="full or normal"):
        open_database("sqlite:///x.db", sqlite_synchronous="off")
    assert load_settings({"LEDGER_SQLITE_SYNCHRONOUS": "normal"}).storage.sqlite_synchronous == "normal"


def test_a_database_password_never_reaches_an_error_message() -> None:
    result = ledger_cli("db", "upgrade", "--db", "postgresql://postgres:hunter2secret@127.0.0.1:1/nowhere")
    assert result.returncode == 2
    assert "hunter2secret" not in result.stderr + result.stdout
    assert "***" in result.stderr
