"""A vLLM 0.32 stand-in: OpenAI wire format plus a continuous-batching timing model, no GPU.

Run it with ``ledger emulate`` (or ``python -m usage_ledger.emulator``); every profile parameter and
vLLM's own server flags have a flag. The wire shapes are vLLM 0.32's, checked against transcripts
recorded from the real server (tests/emulator/test_shape.py): when the two disagree, the real
server wins. Endpoints, flags, faults and the grade line: docs/emulator.md.
"""

from __future__ import annotations

from usage_ledger.emulator.app import EmulatorApp, create_app
from usage_ledger.emulator.commands import register as register_commands
from usage_ledger.emulator.config import PROFILES, EmulatorConfig, profile_config
from usage_ledger.emulator.engine import Engine, RequestRecord
from usage_ledger.emulator.faults import Faults, parse_faults
from usage_ledger.emulator.grades import GRADE_SCALE
from usage_ledger.emulator.server import RunningEmulator, running_emulator, serve
from usage_ledger.emulator.simulate import SimulationResult, simulate

__all__ = (
    "GRADE_SCALE",
    "PROFILES",
    "EmulatorApp",
    "EmulatorConfig",
    "Engine",
    "Faults",
    "RequestRecord",
    "RunningEmulator",
    "SimulationResult",
    "create_app",
    "parse_faults",
    "profile_config",
    "register_commands",
    "running_emulator",
    "serve",
    "simulate",
)
