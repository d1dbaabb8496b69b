"""The Dockerfile and docs/compose.yaml hold what the docs promise (no Docker here: the files are read).

- compose: every replica reads one fingerprint key, made once into a volume it mounts read-only;
  each replica keeps its own state (spool); no host port is `ledger ui`'s default;
- image: the `otel` and `parquet` extras installed, every pip step pinned by docker/constraints.txt
  (a full freeze: every line `name==version`, every requirement of `.[otel,parquet]` in it); the
  gateway's state (spool, key) on a volume of its own, not beside the database; the health check asks
  the port LEDGER_PORT names; the entrypoint refuses a bind mount it cannot write, saying how to fix it
  (both run here: the check against a loopback server, the entrypoint as an unprivileged user).
"""

from __future__ import annotations

import http.server
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from usage_ledger.commands.ui import DEFAULT_PORT as UI_PORT

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = msgspec.yaml.decode((ROOT / "docs" / "compose.yaml").read_bytes())
CONSTRAINTS = ROOT / "docker" / "constraints.txt"
EXTRAS = ("otel", "parquet")


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _final_stage() -> list[tuple[str, str]]:
    steps = _dockerfile()
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def _env(steps: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for op, args in steps:
        if op == "ENV":
            env.update(word.split("=", 1) for word in shlex.split(args))
    return env


def _gateways() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in COMPOSE["services"].items() if "serve" in s.get("command", [])}


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Mount point → (volume, mode)."""
    out = {}
    for spec in service.get("volumes", []):
        volume, target, *mode = spec.split(":")
        out[target] = (volume, mode[0] if mode else "rw")
    return out


def test_replicas_share_one_fingerprint_key_mounted_read_only() -> None:
    gateways = _gateways()
    assert len(gateways) >= 2
    key_files = {s["environment"]["LEDGER_FINGERPRINT_KEY_FILE"] for s in gateways.values()}
    assert len(key_files) == 1  # one path, set: a configured key is read, never created per replica
    (key_file,) = key_files
    key_dir = str(Path(key_file).parent)
    volumes = {_mounts(s)[key_dir] for s in gateways.values()}
    assert len(volumes) == 1 and next(iter(volumes))[1] == "ro"
    (volume, _) = next(iter(volumes))
    makers = [n for n, s in COMPOSE["services"].items() if _mounts(s).get(key_dir) == (volume, "rw")]
    assert len(makers) == 1, makers  # one service writes the key, once
    (maker,) = makers
    assert key_file in "\n".join(COMPOSE["services"][maker]["command"])
    for service in gateways.values():
        assert service["depends_on"][maker] == {"condition": "service_completed_successfully"}


def test_each_replica_keeps_its_own_state_and_no_port_is_the_uis() -> None:
    gateways = _gateways()
    state = []
    for service in gateways.values():
        state_dir = Path(service["environment"]["LEDGER_STATE_DIR"])  # the spool and its key (gateway.state)
        mount = next(m for m in _mounts(service) if state_dir.is_relative_to(m))
        state.append(_mounts(service)[mount][0])
    assert len(set(state)) == len(gateways)  # a spool is one gateway's (an exclusive lock says so)
    published = [int(p.split(":")[-2]) for s in COMPOSE["services"].values() for p in s.get("ports", [])]
    assert published and UI_PORT not in published


def test_the_image_installs_the_extras_pinned_by_the_constraints() -> None:
    pip_steps = [args for op, args in _dockerfile() if op == "RUN" and re.search(r"\bpip (install|wheel)\b", args)]
    assert pip_steps
    for args in pip_steps:
        assert re.search(r"--constraint \S*constraints\.txt|-c \S*constraints\.txt", args), args
        assert re.search(r"\[otel,parquet\]", args), args
    copied = [args for op, args in _dockerfile() if op == "COPY"]
    assert any(args.startswith("docker/constraints.txt ") for args in copied)

    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version and re.fullmatch(r"[A-Za-z0-9_.\-]+", name), line  # a pin, not a range
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [r for extra in EXTRAS for r in project["optional-dependencies"][extra]]
    for requirement in wanted:
        name = re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.\-]+", requirement).group()).lower()  # type: ignore[union-attr]
        assert name in pins, f"{requirement} is not pinned in {CONSTRAINTS.relative_to(ROOT)}: make constraints"


def test_the_gateways_state_is_not_beside_the_database() -> None:
    final = _final_stage()
    env = _env(final)
    database_dir = Path(env["LEDGER_DATABASE_URL"].removeprefix("sqlite:///")).parent
    state_dir = Path(env["LEDGER_STATE_DIR"])  # spool and keys (gateway.state)
    assert database_dir != state_dir and not state_dir.is_relative_to(database_dir)
    (volumes,) = [msgspec.json.decode(args) for op, args in final if op == "VOLUME"]
    assert {str(database_dir), str(state_dir)} <= set(volumes)


def _healthcheck_program() -> str:
    (args,) = [args for op, args in _final_stage() if op == "HEALTHCHECK"]
    command = msgspec.json.decode(args.split("CMD", 1)[1].strip())
    assert command[:2] == ["python", "-c"], command
    return str(command[2])


def test_the_healthcheck_follows_the_configured_port() -> None:
    """The image's health check asks the port LEDGER_PORT names (a compose file that moves it stays healthy)."""
    assert not re.search(r"\b8300\b", _healthcheck_program())  # no port of its own

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/_ledger/health" else 404)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        for env_port, healthy in ((port, True), (_free_port(), False)):
            env = {**os.environ, "LEDGER_PORT": str(env_port)}
            done = subprocess.run([sys.executable, "-c", _healthcheck_program()], env=env, capture_output=True)
            assert (done.returncode == 0) is healthy, done.stderr
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _entrypoint(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The image's entrypoint as a user that owns nothing here (nobody), running `echo started`."""
    (entry,) = [msgspec.json.decode(args) for op, args in _final_stage() if op == "ENTRYPOINT"]
    (copied,) = [args.split() for op, args in _final_stage() if op == "COPY" and args.endswith(entry[-1])]
    script = ROOT / copied[0]
    command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *entry[:-1], str(script)]
    return subprocess.run(
        [*command, "echo", "started"], env={"PATH": os.environ["PATH"], **env}, text=True, capture_output=True
    )


def test_the_entrypoint_says_how_to_fix_a_bind_mount_it_cannot_write() -> None:
    # Not tmp_path: pytest's base directory is 0700, so nobody could not even look inside.
    with tempfile.TemporaryDirectory(prefix="entrypoint-") as base:
        Path(base).chmod(0o755)
        data = Path(base) / "data"  # a host directory owned by another user (root, mode 0755)
        data.mkdir(mode=0o755)
        state = Path(base) / "state"
        state.mkdir()
        state.chmod(0o777)
        env = {"LEDGER_DATABASE_URL": f"sqlite:///{data}/ledger.db", "LEDGER_STATE_DIR": str(state)}
        refused = _entrypoint(env)
        assert refused.returncode == 2 and "started" not in refused.stdout
        assert f"{data} (LEDGER_DATABASE_URL) is not writable by uid 65534" in refused.stderr
        assert "chown 65534:" in refused.stderr and "--user" in refused.stderr
        data.chmod(0o777)
        started = _entrypoint(env)
        assert started.returncode == 0 and started.stdout == "started\n", started.stderr
