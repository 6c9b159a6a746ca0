"""Blobs: one file's bytes in a backend, plain or encrypted, verified on every read.

A plain blob on local roots is named by its digest (``blobs/ab/abcd…``), so an operator can find
and inspect it; an encrypted blob, or any blob on S3, gets a random name and the catalog maps
digests to names. The catalog (the database) is the services' business; this module moves bytes.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from shipyard.errors import CorruptData, NotFound, StorageError
from shipyard.storage.backend import Backend, Reader, ScrubTally, Verify, Written
from shipyard.storage.crypto import MasterKeys, decrypt_chunks, encrypt_chunks, new_data_key
from shipyard.storage.digests import CRC_BYTES, BlockCrcs, BlockHasher, block_crc, blocks, hashed, prefetched

Progress = Callable[[int], None]
"""Called with the bytes done since the last call."""


@dataclass(frozen=True)
class Blob:
    name: str
    """The object's name in the backend."""
    digest: str
    """Block SHA-256 of the plaintext (see ``digests``)."""
    size_bytes: int
    key_id: str | None = None
    wrapped_key: bytes | None = None
    block_crcs: bytes | None = None
    """CRC32C of each 4 MiB plaintext block of a plain blob, which reads check (None: written
    before blocks had them; such reads check the digest)."""
    replicas: int | None = None
    """Copies the catalog wants: a read that finds fewer, or a damaged one, repairs them."""

    @property
    def encrypted(self) -> bool:
        return self.key_id is not None


class BlobStore:
    def __init__(
        self,
        backend: Backend,
        keys: Callable[[], MasterKeys],
        damaged: Callable[[ScrubTally], None] | None = None,
    ) -> None:
        self.backend = backend
        self._keys = keys
        """Looked up only when a blob is encrypted or decrypted (it may create the key file)."""
        self._damaged = damaged
        """Told what a read found and repaired (the store's upkeep takes it from there)."""

    def master_keys(self) -> MasterKeys:
        return self._keys()

    def put_file(
        self, path: Path, *, replicas: int, encrypt: bool, progress: Progress | None = None
    ) -> tuple[Blob, Written]:
        hasher, crcs = BlockHasher(), BlockCrcs()
        with open(path, "rb") as source:
            plain = _reporting(hashed(blocks(source.read), hasher), progress)
            if encrypt:
                name = f"enc/{_random_name()}"
                data_key = new_data_key()
                written = self.backend.write(encrypt_chunks(plain, data_key), lambda: name, replicas)
                key_id, wrapped = self._keys().wrap(data_key, name)
                return Blob(name, hasher.hexdigest(), hasher.size, key_id, wrapped), written
            fixed = f"objects/{_random_name()}"

            def name_of() -> str:
                if self.backend.kind != "local":
                    return fixed
                digest = hasher.hexdigest()
                return f"blobs/{digest[:2]}/{digest}"

            written = self.backend.write(crcs.through(plain), name_of, replicas)
        return Blob(written.name, hasher.hexdigest(), hasher.size, block_crcs=bytes(crcs.crcs)), written

    def get_file(self, blob: Blob, out: Path, progress: Progress | None = None) -> None:
        """Write the blob to ``out`` (atomically) from the first replica that verifies."""
        data_key = self._data_key(blob)
        out.parent.mkdir(parents=True, exist_ok=True)
        staged = out.with_name(f".{out.name}.{os.getpid()}.part")
        try:
            with open(staged, "wb") as sink:

                def deliver(read: Reader) -> None:
                    sink.seek(0)
                    sink.truncate()
                    for piece in self._plaintext(blob, read, data_key):
                        sink.write(piece)
                        if progress:
                            progress(len(piece))

                self.read(blob, deliver)
                sink.flush()
                os.fsync(sink.fileno())
            staged.replace(out)
        except BaseException:
            staged.unlink(missing_ok=True)
            raise

    def read(self, blob: Blob, consume: Verify) -> None:
        """Run ``consume`` over replicas until one reads to its end without an integrity or
        transport error; raise naming the blob and every replica's failure otherwise."""
        copies = self.backend.replicas(blob.name)
        if not copies:
            raise NotFound(
                f"blob {blob.name} ({blob.digest[:12]}…) is missing from every root",
                hint="`shipyard storage scrub` lists what is lost; restore the root that held it",
            )
        failures: list[tuple[str, Exception]] = []
        for copy in copies:
            try:
                with copy.open() as handle:
                    consume(handle.read)
            except (CorruptData, StorageError, OSError) as exc:
                failures.append((copy.where, exc))
                continue
            if failures or (blob.replicas is not None and len(copies) < blob.replicas):
                self._read_repair(blob, len(copies), damaged=bool(failures))
            return
        causes = "; ".join(f"{where}: {exc}" for where, exc in failures)
        if all(isinstance(exc, CorruptData) for _, exc in failures):
            raise CorruptData(
                f"blob {blob.name}: no replica holds the right bytes ({causes})",
                hint="nothing wrong was returned; restore a root that held it, then run "
                "`shipyard storage scrub --repair`",
            )
        raise StorageError(f"blob {blob.name} could not be read: {causes}")

    def _read_repair(self, blob: Blob, seen: int, *, damaged: bool) -> None:
        """After serving a good copy, restore the missing and damaged ones from a verified copy
        (read-repair, as Cassandra and HDFS do): damage found by a read heals then, not at the
        next scrub. Best effort: the read has already succeeded."""
        try:
            found = self.scrub(blob, blob.replicas or seen, repair=True, verify=damaged)
        except Exception:
            found = ScrubTally(checked=1, missing=1)
        if self._damaged is not None:
            self._damaged(found)

    def _data_key(self, blob: Blob) -> bytes | None:
        """Unwrapped once per read, so a wrong master key is reported as such, not as damage."""
        if not blob.encrypted:
            return None
        assert blob.key_id is not None and blob.wrapped_key is not None
        return self._keys().unwrap(blob.key_id, blob.wrapped_key, blob.name)

    def _plaintext(
        self, blob: Blob, read: Reader, data_key: bytes | None, *, digest: bool = False
    ) -> Iterator[bytes]:
        """The blob's bytes from one replica, checked as they stream: by the chunks' GCM tags
        (encrypted), by each block's CRC32C, or (``digest``, and for blobs without CRCs) by the
        content digest; an ``CorruptData`` at the first block that does not match."""
        if data_key is not None:
            # Every chunk's tag authenticates it under a key that belongs to this blob alone (and
            # is bound to its name): the digest would check nothing more, at the cost of a hash.
            size = 0
            for piece in decrypt_chunks(read, data_key, f"blob {blob.name}"):
                size += len(piece)
                yield piece
            if size != blob.size_bytes:
                raise CorruptData(f"blob {blob.name}: {size} bytes decrypted, {blob.size_bytes} expected")
            return
        if blob.block_crcs is not None and not digest:
            yield from self._crc_checked(blob, read, blob.block_crcs)
            return
        hasher = BlockHasher()
        for piece in prefetched(blocks(read)):
            hasher.update(piece)
            yield piece
        if hasher.hexdigest() != blob.digest or hasher.size != blob.size_bytes:
            raise CorruptData(
                f"blob {blob.name}: content does not match its digest {blob.digest[:12]}… "
                f"({hasher.size} bytes read, {blob.size_bytes} expected)"
            )

    @staticmethod
    def _crc_checked(blob: Blob, read: Reader, crcs: bytes) -> Iterator[bytes]:
        size = 0
        for index, piece in enumerate(prefetched(blocks(read))):
            expected = crcs[index * CRC_BYTES : (index + 1) * CRC_BYTES]
            if block_crc(piece) != expected:
                raise CorruptData(f"blob {blob.name}: block {index} does not match its CRC32C")
            size += len(piece)
            yield piece
        if size != blob.size_bytes:
            raise CorruptData(f"blob {blob.name}: {size} bytes read, {blob.size_bytes} expected")

    def verifier(self, blob: Blob, *, digest: bool = True) -> Verify:
        """A check of one replica: the full digest, what a scrub runs (with ``digest`` False,
        what a read checks: each block's CRC32C)."""
        data_key = self._data_key(blob)

        def verify(read: Reader) -> None:
            for _ in self._plaintext(blob, read, data_key, digest=digest):
                pass

        return verify

    def scrub(self, blob: Blob, replicas: int, *, repair: bool, verify: bool = True) -> ScrubTally:
        """With ``verify``, read every copy in full (a deep scrub); without, see only that they
        exist (a light one), but check a copy before repairing from it."""
        return self.backend.scrub(
            blob.name,
            replicas,
            self.verifier(blob) if verify else None,
            repair,
            source_check=self.verifier(blob, digest=False),
        )


def _random_name() -> str:
    name = uuid.uuid4().hex
    return f"{name[:2]}/{name}"


def _reporting(pieces: Iterable[bytes], progress: Progress | None) -> Iterator[bytes]:
    for piece in pieces:
        yield piece
        if progress:
            progress(len(piece))
