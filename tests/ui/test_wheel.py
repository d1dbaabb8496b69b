"""The wheel carries the dashboard: its templates, its own JS and CSS, and the vendored uPlot with its licence."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from usage_ledger.ui.render import STATIC_DIR, UPLOT_VERSION

ROOT = Path(__file__).resolve().parents[2]
UI = ROOT / "usage_ledger" / "ui"


def test_the_wheel_ships_every_dashboard_file(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True,
        timeout=240,
    )
    (built,) = tmp_path.glob("usage_ledger-*.whl")
    names = set(zipfile.ZipFile(built).namelist())
    wanted = {
        str(path.relative_to(ROOT))
        for path in UI.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert any(n.endswith("templates/runs.html") for n in wanted) and len(wanted) > 20
    assert wanted - names == set()


def test_the_vendored_chart_library_is_pinned_with_its_licence() -> None:
    vendor = STATIC_DIR / "vendor" / f"uplot-{UPLOT_VERSION}"
    assert sorted(p.name for p in vendor.iterdir()) == ["LICENSE", "uPlot.iife.min.js", "uPlot.min.css"]
    assert "The MIT License" in (vendor / "LICENSE").read_text()
    assert f"/vendor/uplot-{UPLOT_VERSION}" not in (STATIC_DIR / "app.js").read_text()  # app.js names no version
