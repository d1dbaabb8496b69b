"""A facility a test needs but this machine does not give (a tmpfs mount, `chattr +i`, chdb, a private
PostgreSQL cluster): the test skips on a developer's machine and fails in CI (`CI=true`), like the PostgreSQL,
vLLM and browser tiers (`LEDGER_TEST_REQUIRE_PG` in tests/conftest.py). The one place a test may skip for it."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ("in_ci", "unavailable")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def unavailable(why: str, *, required: bool = False) -> NoReturn:
    """Skip with `why`; in CI (or when `required`), fail with it instead (a test CI must run never passes by
    skipping)."""
    if required or in_ci():
        pytest.fail(f"{why} (CI=true: this test must run in CI)", pytrace=False)
    pytest.skip(why)
