"""The commands that draw progress bars, run as a user runs them: the real `ledger` on a terminal.

Off a terminal the bars are disabled, so the in-process CLI tests never draw one; a bar whose
columns could not render an unknown total once made `ledger import` and `ledger rebuild` fail
on every terminal.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

from tests.projections.seed import MOE, seed_rows, write_jsonl

LEDGER = str(Path(sys.executable).parent / "ledger")


def on_terminal(*args: str) -> tuple[int, str]:
    """Run `ledger ARGS` with stdout and stderr on a 120-column pseudo-terminal; (exit code, all it printed)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    proc = subprocess.Popen(
        [LEDGER, *args], stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env={**env, "TERM": "xterm"}
    )
    os.close(follower)
    output = bytearray()
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: every copy of the terminal's other end is closed, the process has exited
            break
        if not data:
            break
        output += data
    os.close(leader)
    return proc.wait(timeout=60), output.decode(errors="replace")


def test_import_and_rebuild_draw_their_progress_bars_on_a_terminal(backend_url: str, tmp_path: Path) -> None:
    seed = write_jsonl(tmp_path / "moe.jsonl", seed_rows(MOE))
    code, out = on_terminal("db", "upgrade", "--db", backend_url)
    assert code == 0, out

    code, out = on_terminal("import", str(seed), "--db", backend_url)
    assert code == 0, out
    assert f"import {seed}" in out  # the bar was drawn
    assert f"{seed}: 1700 rows, 1700 calls imported" in out

    code, out = on_terminal("rebuild", "--db", backend_url)
    assert code == 0, out
    for step in ("folding events into version", "digest and promotion of version"):
        assert f"rebuild calls: {step}" in out  # each step shown as it began
    assert "Traceback" not in out

    code, out = on_terminal("rebuild", "calls", "--db", backend_url)  # now there is a version to remove
    assert code == 0, out
    assert "rebuild calls: removing version" in out
    assert re.search(r"calls: version \d+ promoted at position \d+", out)
    assert "Traceback" not in out
