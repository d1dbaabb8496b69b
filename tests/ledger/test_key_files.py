"""One set of rules for every key file (#52 point 6): the fingerprint key, the spool's key and the checkpoint
signing key are refused alike when another user owns them, others may write them, or their key is not random
(every byte the same). Before, a spool key of 32 zero bytes was used, and a signing key owned by `nobody`
with mode 0666 signed checkpoints."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from structlog.testing import capture_logs

from usage_ledger.gateway.fingerprint_key import load_fingerprint_key
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.checkpoint import generate_key, load_signing_key, write_key_files
from usage_ledger.ledger.errors import ConfigError
from usage_ledger.ledger.spool import Spool

NOBODY = 65534


def _signing_pem(seed: bytes) -> bytes:
    pem = Ed25519PrivateKey.from_private_bytes(seed).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return b"key-name: example.com/ledger\n" + pem


class KeyKind:
    """Where a kind of key lives, how it is loaded, and what a key of all zeros looks like in its file."""

    def __init__(self, name: str, make: Callable[[Path], Path], load: Callable[[Path], object], zeros: bytes) -> None:
        self.name, self.make, self.load, self.zeros = name, make, load, zeros

    def __repr__(self) -> str:
        return self.name


def _fingerprint_file(tmp_path: Path) -> Path:
    path = tmp_path / "fingerprint.key"
    path.write_text(os.urandom(32).hex() + "\n")
    path.chmod(0o600)
    return path


def _spool_key_file(tmp_path: Path) -> Path:
    with Spool(tmp_path / "spool") as spool:  # made on first open
        return spool.key_path


def _signing_key_file(tmp_path: Path) -> Path:
    path = tmp_path / "checkpoint.key"
    write_key_files(generate_key("example.com/ledger"), path)
    return path


def _open_spool(path: Path) -> object:
    spool = Spool(path.parent / "spool")
    spool.open()
    spool.close()
    return spool


KINDS = [
    KeyKind(
        "fingerprint",
        _fingerprint_file,
        lambda p: load_fingerprint_key(GatewaySettings(fingerprint_key_file=str(p)), str(p.parent / "spool")),
        b"00" * 32 + b"\n",
    ),
    KeyKind("spool", _spool_key_file, _open_spool, bytes(32)),
    KeyKind("checkpoint", _signing_key_file, lambda p: load_signing_key(p), _signing_pem(bytes(32))),
]


@pytest.mark.parametrize("kind", KINDS, ids=repr)
@pytest.mark.parametrize(
    ("plant", "problem"),
    [
        (lambda p: os.chown(p, NOBODY, NOBODY), f"is owned by uid {NOBODY}"),
        (lambda p: p.chmod(0o666), "may be written by other users"),
        (lambda p: p.chmod(0o646), "may be written by other users"),
    ],
    ids=["owned-by-nobody", "mode-0666", "mode-0646"],
)
def test_a_key_file_that_is_not_ours_is_refused(
    tmp_path: Path, kind: KeyKind, plant: Callable[[Path], None], problem: str
) -> None:
    path = kind.make(tmp_path)
    kind.load(path)  # as made: ours
    plant(path)
    with pytest.raises(ConfigError, match=problem):
        kind.load(path)


@pytest.mark.parametrize("kind", KINDS, ids=repr)
def test_a_key_of_all_zeros_is_refused(tmp_path: Path, kind: KeyKind) -> None:
    path = kind.make(tmp_path)
    path.write_bytes(kind.zeros)
    with pytest.raises(ConfigError, match=r"not random \(every byte 0x00\)"):
        kind.load(path)


@pytest.mark.parametrize("kind", KINDS, ids=repr)
def test_a_key_file_others_may_read_is_used_and_said(tmp_path: Path, kind: KeyKind) -> None:
    path = kind.make(tmp_path)
    path.chmod(0o644)
    with capture_logs() as logs:
        kind.load(path)
    said = [e for e in logs if e["event"].endswith("_readable_by_others")]
    assert len(said) == 1 and said[0]["mode"] == "0644" and said[0]["path"] == str(path)
