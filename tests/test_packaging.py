"""The wheel puts one top-level name into site-packages, `usage_ledger`, and ships what it needs to run.

`.ci/package` also builds the sdist, runs `twine check` and installs the wheel into a fresh venv.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        timeout=240,
    )
    (built,) = out.glob("usage_ledger-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_has_one_top_level_package(wheel: zipfile.ZipFile) -> None:
    top = {name.split("/")[0] for name in wheel.namelist() if ".dist-info/" not in name}
    assert top == {"usage_ledger"}
    (top_level,) = (n for n in wheel.namelist() if n.endswith(".dist-info/top_level.txt"))
    assert wheel.read(top_level).decode().split() == ["usage_ledger"]


def test_the_wheel_carries_the_migrations_licence_and_typing_marker(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert {
        "usage_ledger/migrations/env.py",
        "usage_ledger/migrations/script.py.mako",
        "usage_ledger/py.typed",
    } <= names
    assert any(n.startswith("usage_ledger/migrations/versions/0001_") for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "Description-Content-Type: text/markdown" in metadata


def test_version_is_shown_from_the_one_place_it_is_written() -> None:
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    shown = subprocess.run(
        [sys.executable, "-m", "usage_ledger.cli", "--version"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert shown == ["ledger", declared]
