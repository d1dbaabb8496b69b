"""Signed checkpoints: the ledger's head at a size, as a C2SP tlog-checkpoint signed with Ed25519.

The note's lines, the signature line, the key ID and the key files are docs/auditing.md, "Signed checkpoints"
(Format, Keys). This ledger is a hash chain, not a Merkle tree: the "root hash" line is the chain head, so a
checkpoint proves a prefix only to a verifier that re-reads the chain (`ledger verify --checkpoint`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import struct
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from usage_ledger.ledger.chain import GENESIS_HASH, epoch_micros
from usage_ledger.ledger.errors import ConfigError
from usage_ledger.ledger.key_files import check_random, read_key_file

__all__ = (
    "Checkpoint",
    "CheckpointMalformed",
    "HeadTracker",
    "SignatureRejected",
    "SigningKey",
    "VerifierKey",
    "derived_origin",
    "generate_key",
    "load_signing_key",
    "load_verifier_key",
    "open_checkpoint",
    "open_note",
    "parse_verifier_key",
    "sign_checkpoint",
    "sign_note",
    "write_key_files",
)

ED25519_TYPE = b"\x01"
SIGNATURE_PREFIX = "\u2014 "  # em dash, space
RECORDED_AT_PREFIX = "recorded-at "
MAX_NOTE_BYTES = 64 * 1024  # the spec asks verifiers for a limit; 16 Ed25519 signatures fit easily
_KEY_NAME = re.compile(r"[^\s+]+")
_NAME_LINE = "key-name: "
_WHAT = "checkpoint key"
_ROW_DIGEST = struct.Struct(">Qq")  # position, recorded_at in microseconds


class CheckpointMalformed(ConfigError):
    """A checkpoint or key file that cannot be read as one (bad input: exit code 2)."""


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    origin: str
    size: int
    head_hash: str
    """The chain hash at position `size`, hex."""
    recorded_at_digest: str | None = None
    """SHA-256 over every (position, recorded_at) of 1..size, hex; None in a checkpoint without the line."""

    def text(self) -> str:
        lines = [self.origin, str(self.size), _b64(bytes.fromhex(self.head_hash))]
        if self.recorded_at_digest is not None:
            lines.append(RECORDED_AT_PREFIX + _b64(bytes.fromhex(self.recorded_at_digest)))
        return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class VerifierKey:
    name: str
    public_key: Ed25519PublicKey

    @property
    def raw(self) -> bytes:
        return self.public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @property
    def key_id(self) -> bytes:
        return hashlib.sha256(self.name.encode() + b"\n" + ED25519_TYPE + self.raw).digest()[:4]

    def vkey(self) -> str:
        """The signed-note verifier key text (as Go's golang.org/x/mod/sumdb/note reads it)."""
        return f"{self.name}+{self.key_id.hex()}+{_b64(ED25519_TYPE + self.raw)}"


@dataclass(frozen=True, slots=True)
class SigningKey:
    name: str
    private_key: Ed25519PrivateKey

    @property
    def verifier(self) -> VerifierKey:
        return VerifierKey(self.name, self.private_key.public_key())


class HeadTracker:
    """The head (size, hash) and recorded-at digest, fed row by row in position order."""

    def __init__(self) -> None:
        self.size = 0
        self.head_hash = GENESIS_HASH
        self._recorded = hashlib.sha256()

    def add(self, position: int, stored_hash: str, recorded_at: datetime) -> None:
        self._recorded.update(_ROW_DIGEST.pack(position, epoch_micros(recorded_at)))
        self.size = position
        self.head_hash = stored_hash

    def checkpoint(self, origin: str) -> Checkpoint:
        return Checkpoint(
            origin=origin, size=self.size, head_hash=self.head_hash, recorded_at_digest=self._recorded.hexdigest()
        )


def derived_origin(first_event_id: uuid.UUID | None) -> str:
    """The default origin: stable for a ledger's life, because its first event never changes."""
    if first_event_id is None:
        raise ConfigError("the ledger is empty: nothing to checkpoint yet (or set LEDGER_CHECKPOINT_ORIGIN)")
    return f"usage-ledger/{first_event_id}"


def generate_key(name: str) -> SigningKey:
    if not _KEY_NAME.fullmatch(name):
        raise ConfigError(f"key name {name!r} must be non-empty, without spaces or '+' (e.g. example.com/ledger)")
    return SigningKey(name, Ed25519PrivateKey.generate())


def write_key_files(key: SigningKey, path: Path) -> Path:
    """Write the private key to `path` (mode 0600, never overwritten) and the verifier key to `path`.pub."""
    pub = path.with_name(path.name + ".pub")
    for target in (path, pub):
        if target.exists():
            raise ConfigError(f"{target} exists: refusing to overwrite a key; choose another --out")
    pem = key.private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    text = f"# usage-ledger checkpoint signing key (Ed25519); keep it secret\n{_NAME_LINE}{key.name}\n".encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(text + pem)
        pub.write_text(key.verifier.vkey() + "\n")
    except OSError as exc:
        raise ConfigError(f"cannot write key file: {exc}") from exc
    return pub


def load_signing_key(path: Path) -> SigningKey:
    """The key `ledger keygen` wrote, by the rules of every key file (`key_files`): ConfigError if it is not
    ours (another owner, writable by others), not random, or not a checkpoint key."""
    try:
        data = read_key_file(path, _WHAT)
    except OSError as exc:
        raise ConfigError(f"cannot read checkpoint key {path}: {exc.strerror or exc}") from exc
    name = next(
        (
            line[len(_NAME_LINE) :].strip()
            for line in data.decode("utf-8", "replace").splitlines()
            if line.startswith(_NAME_LINE)
        ),
        None,
    )
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path} is not a checkpoint key written by `ledger keygen`: {exc}") from exc
    if not isinstance(private, Ed25519PrivateKey) or not name or not _KEY_NAME.fullmatch(name):
        raise ConfigError(f"{path} is not a checkpoint key written by `ledger keygen` (Ed25519 with a key-name line)")
    seed = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    check_random(seed, path, _WHAT, "make a new one with `ledger keygen`")
    return SigningKey(name, private)


def load_verifier_key(path: Path) -> VerifierKey:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read public key {path}: {exc}") from exc
    return parse_verifier_key(text, str(path))


def parse_verifier_key(text: str, where: str = "verifier key") -> VerifierKey:
    """A signed-note verifier key `<name>+<hex key ID>+<base64(0x01 ‖ public key)>`."""
    name, _, rest = text.strip().partition("+")
    key_id_hex, _, encoded = rest.partition("+")  # the base64 itself may hold a '+'
    try:
        raw = base64.b64decode(encoded, validate=True)
        if raw[:1] != ED25519_TYPE or len(raw) != 33 or not _KEY_NAME.fullmatch(name):
            raise ValueError("not an Ed25519 verifier key")
        key = VerifierKey(name, Ed25519PublicKey.from_public_bytes(raw[1:]))
    except (ValueError, binascii.Error) as exc:
        raise CheckpointMalformed(
            f"{where}: expected a verifier key NAME+KEYID+BASE64 (from `ledger keygen`): {exc}"
        ) from exc
    if key.key_id.hex() != key_id_hex.lower():
        raise CheckpointMalformed(f"{where}: key ID {key_id_hex} does not match the key (the file was edited?)")
    return key


def sign_note(text: str, key: SigningKey) -> str:
    """A signed note of `text` (which ends with a newline) with one signature line by `key`."""
    signature = key.private_key.sign(text.encode())
    return f"{text}\n{SIGNATURE_PREFIX}{key.name} {_b64(key.verifier.key_id + signature)}\n"


def sign_checkpoint(checkpoint: Checkpoint, key: SigningKey) -> str:
    return sign_note(checkpoint.text(), key)


class SignatureRejected(Exception):
    """The note is well formed but not validly signed by the given key (a failed check: exit code 1)."""


def open_checkpoint(note: bytes, key: VerifierKey, where: str = "checkpoint") -> Checkpoint:
    """The checkpoint in a signed note, after verifying `key`'s signature."""
    return _parse_text(open_note(note, key, where), where)


def open_note(note: bytes, key: VerifierKey, where: str = "note") -> str:
    """The text of a signed note once `key`'s signature on it verified (C2SP signed-note rules).

    Raises CheckpointMalformed for bytes that are not a signed note, SignatureRejected when no
    signature by `key` is present or one by `key` fails (signatures by other keys are ignored).
    """
    if len(note) > MAX_NOTE_BYTES:
        raise CheckpointMalformed(f"{where}: larger than {MAX_NOTE_BYTES} bytes, not a checkpoint")
    try:
        decoded = note.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointMalformed(f"{where}: not UTF-8") from exc
    if any(ord(c) < 0x20 and c != "\n" for c in decoded):
        raise CheckpointMalformed(f"{where}: contains control characters")
    split = decoded.rfind("\n\n")
    if split < 0 or not decoded.endswith("\n"):
        raise CheckpointMalformed(f"{where}: no blank line before the signatures (not a signed note)")
    text, signatures = decoded[: split + 1], decoded[split + 2 :]
    matched = False
    for line in signatures.splitlines():
        name, signature = _signature_line(line, where)
        if name != key.name or signature[:4] != key.key_id:
            continue  # the spec: ignore signatures by unknown keys
        matched = True
        try:
            key.public_key.verify(signature[4:], text.encode())
        except InvalidSignature:
            raise SignatureRejected(f"{where}: the signature by {key.name} does not verify (edited?)") from None
    if not matched:
        raise SignatureRejected(f"{where}: not signed by the key {key.name}+{key.key_id.hex()}")
    return text


def _signature_line(line: str, where: str) -> tuple[str, bytes]:
    if not line.startswith(SIGNATURE_PREFIX):
        raise CheckpointMalformed(f"{where}: signature line {line[:40]!r} does not start with an em dash and space")
    name, _, encoded = line[len(SIGNATURE_PREFIX) :].partition(" ")
    try:
        signature = base64.b64decode(encoded, validate=True)
    except binascii.Error as exc:
        raise CheckpointMalformed(f"{where}: signature of {name!r} is not base64") from exc
    if not _KEY_NAME.fullmatch(name) or len(signature) < 5:
        raise CheckpointMalformed(f"{where}: malformed signature line for {name!r}")
    return name, signature


def _parse_text(text: str, where: str) -> Checkpoint:
    lines = text[:-1].split("\n")
    if len(lines) < 3 or not all(lines):
        raise CheckpointMalformed(f"{where}: a checkpoint needs origin, size and root hash lines, none empty")
    origin, size_text, root, *extensions = lines
    if not size_text.isdigit() or (size_text != "0" and size_text.startswith("0")):
        raise CheckpointMalformed(f"{where}: size {size_text!r} is not a decimal without leading zeroes")
    head = _b64_32(root, where, "root hash")
    digest = next(
        (
            _b64_32(e[len(RECORDED_AT_PREFIX) :], where, "recorded-at")
            for e in extensions
            if e.startswith(RECORDED_AT_PREFIX)
        ),
        None,
    )
    return Checkpoint(origin=origin, size=int(size_text), head_hash=head, recorded_at_digest=digest)


def _b64_32(text: str, where: str, what: str) -> str:
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error:
        raw = b""
    if len(raw) != 32:
        raise CheckpointMalformed(f"{where}: the {what} line is not the base64 of 32 bytes")
    return raw.hex()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
