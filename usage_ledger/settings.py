"""Every layer's settings in one object, read once from `LEDGER_*` variables and overridden by flags.

The composition root's part of the settings convention (`ledger.settings`): each layer declares
its own section, this module combines them, and the commands hand each layer only its section.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec

from usage_ledger.gateway import GatewaySettings
from usage_ledger.ledger import ENV_PREFIX, ConfigError, LogSettings, StorageSettings
from usage_ledger.otel import OtelSettings
from usage_ledger.projections import ReportSettings

__all__ = ("Settings", "load_settings")


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    storage: StorageSettings = StorageSettings()
    gateway: GatewaySettings = GatewaySettings()
    reports: ReportSettings = ReportSettings()
    otel: OtelSettings = OtelSettings()
    log: LogSettings = LogSettings()


_SECTIONS: dict[str, type[msgspec.Struct]] = {
    name: type(getattr(Settings(), name)) for name in Settings.__struct_fields__
}
_SECTION_OF = {field: name for name, cls in _SECTIONS.items() for field in cls.__struct_fields__}
assert len(_SECTION_OF) == sum(len(cls.__struct_fields__) for cls in _SECTIONS.values()), "a field in two sections"


def load_settings(env: Mapping[str, str], overrides: Mapping[str, Any] | None = None) -> Settings:
    """Settings from the `LEDGER_*` variables in `env`, then `overrides` (flags by field name; None = not given).

    Unknown `LEDGER_*` names fail fast so a typo never silently falls back to a default.
    """
    raw: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name.startswith("LEDGER_TEST_"):
            continue
        field = name[len(ENV_PREFIX) :].lower()
        if field not in _SECTION_OF:
            known = ", ".join(sorted(ENV_PREFIX + f.upper() for f in _SECTION_OF))
            raise ConfigError(f"unknown environment variable {name}; known settings are: {known}")
        raw[_SECTION_OF[field]][field] = value
    for field, value in (overrides or {}).items():
        if value is not None:
            raw[_SECTION_OF[field]][field] = value
    try:
        return msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        # msgspec names the field by its path in `Settings` (`$.gateway.port`): name the variable instead
        message = re.sub(r"`\$\.\w+\.(\w+)`", lambda m: ENV_PREFIX + m.group(1).upper(), str(exc))
        message = re.sub(r" - at `\$\.\w+`$", "", message)  # a section's own check names its variable
        raise ConfigError(f"invalid setting: {message} (check the LEDGER_* variable or flag)") from exc
