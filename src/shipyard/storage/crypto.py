"""Encryption at rest: AES-256-GCM envelopes, streamed in chunks.

Each blob gets a random 256-bit data key. The data key is wrapped by a master key (a key file, an
environment variable, or a KMS hook) and kept in the catalog, never beside the blob, so rotating
the master key re-wraps small records and leaves the data alone.

A blob is a header and a run of chunks::

    header  = MAGIC | chunk size (u32) | nonce prefix (8 random bytes)
    chunk i = AES-GCM(data key, nonce = prefix | i (u32), plaintext, aad = header | final flag)

The final flag in the associated data makes truncation detectable (a cut-off blob has no chunk
marked final), the counter in the nonce makes reordering detectable, and every chunk's tag makes
any flipped bit fail loudly instead of returning wrong bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from shipyard.durable import write_atomically
from shipyard.errors import CorruptData, DependencyMissing, InvalidSpec
from shipyard.storage.digests import blocks, prefetched

MAGIC = b"SHYENC1\n"
CHUNK_BYTES = 4 << 20
_TAG_BYTES = 16
_HEADER = struct.Struct(">I8s")
HEADER_BYTES = len(MAGIC) + _HEADER.size
ENV_KEY = "SHIPYARD_STORAGE_KEY"


def _aesgcm(key: bytes):  # type: ignore[no-untyped-def]
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise DependencyMissing(
            "encryption needs the `cryptography` package", hint="pip install cryptography"
        ) from exc
    return AESGCM(key)


def new_data_key() -> bytes:
    return secrets.token_bytes(32)


def encrypt_chunks(
    plain: Iterable[bytes], data_key: bytes, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[bytes]:
    """Yield the encrypted blob of ``plain`` (any chunking in, fixed-size chunks sealed out)."""
    cipher = _aesgcm(data_key)
    header = MAGIC + _HEADER.pack(chunk_bytes, secrets.token_bytes(8))
    prefix = header[-8:]
    yield header
    index = 0
    pending = b""
    for piece in _rechunk(plain, chunk_bytes):
        if index or pending:
            yield cipher.encrypt(prefix + struct.pack(">I", index), pending, header + b"\0")
            index += 1
        pending = piece
    yield cipher.encrypt(prefix + struct.pack(">I", index), pending, header + b"\1")


def decrypt_chunks(read: Callable[[int], bytes], data_key: bytes, what: str) -> Iterator[bytes]:
    """Yield the plaintext of an encrypted blob read through ``read``; raise ``CorruptData``
    (naming ``what``) on any modified, truncated, reordered or extended byte."""
    header = read(HEADER_BYTES)
    if len(header) < HEADER_BYTES or not header.startswith(MAGIC):
        raise CorruptData(f"{what}: not an encrypted Shipyard blob (bad or truncated header)")
    chunk_bytes, prefix = _HEADER.unpack(header[len(MAGIC) :])
    cipher = _aesgcm(data_key)
    chunks = prefetched(blocks(read, chunk_bytes + _TAG_BYTES))
    index = 0
    current = next(chunks, b"")
    while True:
        following = next(chunks, b"")
        final = not following
        nonce = prefix + struct.pack(">I", index)
        try:
            yield cipher.decrypt(nonce, current, header + (b"\1" if final else b"\0"))
        except Exception as exc:  # cryptography raises InvalidTag; a short chunk raises ValueError
            raise CorruptData(
                f"{what}: chunk {index} fails authentication (modified, truncated or wrong key)",
                hint="read another replica, or restore it with `shipyard storage scrub --repair`",
            ) from exc
        if final:
            return
        current = following
        index += 1


def _rechunk(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    buffer = bytearray()
    for piece in pieces:
        if not buffer and len(piece) == size:
            yield piece
            continue
        buffer += piece
        while len(buffer) >= size:
            yield bytes(buffer[:size])
            del buffer[:size]
    if buffer:
        yield bytes(buffer)


class MasterKeys(Protocol):
    """Wraps data keys. A KMS (Vault transit, a cloud KMS) plugs in by implementing this."""

    @property
    def active_id(self) -> str: ...

    def wrap(self, data_key: bytes, context: str) -> tuple[str, bytes]:
        """-> (id of the master key used, wrapped data key)."""
        ...

    def unwrap(self, key_id: str, wrapped: bytes, context: str) -> bytes: ...


@dataclass
class Keyring:
    """Master keys by id; new data keys are wrapped with the active one, old ones stay readable
    until every record is re-wrapped (``shipyard storage rotate-key``)."""

    keys: dict[str, bytes]
    active_id: str
    path: Path | None = None
    """The key file the ring was read from (rotation writes it back); None for the variable."""
    _ciphers: dict[str, object] = field(default_factory=dict, repr=False)

    def wrap(self, data_key: bytes, context: str) -> tuple[str, bytes]:
        nonce = secrets.token_bytes(12)
        return self.active_id, nonce + self._cipher(self.active_id).encrypt(nonce, data_key, context.encode())  # type: ignore[attr-defined]

    def unwrap(self, key_id: str, wrapped: bytes, context: str) -> bytes:
        if key_id not in self.keys:
            raise CorruptData(
                f"{context}: its data key was wrapped with master key {key_id!r}, which this keyring lacks",
                hint=f"use the key file or {ENV_KEY} that wrote it (this ring holds {sorted(self.keys)})",
            )
        try:
            return self._cipher(key_id).decrypt(wrapped[:12], wrapped[12:], context.encode())  # type: ignore[attr-defined,no-any-return]
        except Exception as exc:
            raise CorruptData(
                f"{context}: its data key does not open with master key {key_id!r} "
                "(wrong key or a tampered record)",
                hint=f"use the key file or {ENV_KEY} that wrote it",
            ) from exc

    def _cipher(self, key_id: str) -> object:
        if key_id not in self._ciphers:
            self._ciphers[key_id] = _aesgcm(self.keys[key_id])
        return self._ciphers[key_id]

    def rotated(self) -> Keyring:
        """A ring with a fresh active key (the old ones kept for unwrapping), saved to its file."""
        if self.path is None:
            raise InvalidSpec(
                f"the master key comes from {ENV_KEY}; rotation needs a key file",
                hint="unset the variable so the key file in $SHIPYARD_HOME is used, or rotate in your KMS",
            )
        key = secrets.token_bytes(32)
        ring = Keyring({**self.keys, _key_id(key): key}, _key_id(key), self.path)
        ring.save()
        return ring

    def retired(self) -> Keyring:
        """The ring without the keys that are no longer active (after every record moved on)."""
        ring = Keyring({self.active_id: self.keys[self.active_id]}, self.active_id, self.path)
        ring.save()
        return ring

    def save(self) -> None:
        assert self.path is not None
        text = json.dumps(
            {
                "active": self.active_id,
                "keys": {k: base64.b64encode(v).decode() for k, v in self.keys.items()},
            }
        )
        write_atomically(self.path, text.encode(), mode=0o600)


def _key_id(key: bytes) -> str:
    """A public name for a key: the first bytes of a hash of it (never the key itself)."""
    return "k-" + hashlib.sha256(b"shipyard master key id\0" + key).hexdigest()[:12]


def load_keyring(key_file: Path, *, create: bool) -> Keyring | None:
    """The master keys: ``$SHIPYARD_STORAGE_KEY`` (base64 of 32 bytes) if set, else the key file,
    made once with mode 0600 when ``create``; None when neither exists."""
    if os.environ.get(ENV_KEY):
        key = _decode_key(os.environ[ENV_KEY], ENV_KEY)
        return Keyring({_key_id(key): key}, _key_id(key))
    if key_file.exists():
        try:
            data = json.loads(key_file.read_text())
            keys = {k: _decode_key(v, f"{key_file} key {k}") for k, v in data["keys"].items()}
            ring = Keyring(keys, data["active"], key_file)
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidSpec(
                f"the storage key file {key_file} is unreadable ({exc})",
                hint="restore it from your backup; without it encrypted artifacts cannot be read",
            ) from exc
        if ring.active_id not in keys:
            raise InvalidSpec(
                f"the storage key file {key_file} names a missing active key {ring.active_id!r}"
            )
        return ring
    if not create:
        return None
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(32)
    ring = Keyring({_key_id(key): key}, _key_id(key), key_file)
    ring.save()
    return ring


def _decode_key(text: str, where: str) -> bytes:
    try:
        key = base64.b64decode(text, validate=True)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise InvalidSpec(
            f"{where} is not a base64-encoded 32-byte key",
            hint="make one with: python -c "
            "'import base64,os; print(base64.b64encode(os.urandom(32)).decode())'",
        )
    return key
