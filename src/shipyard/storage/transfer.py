"""Folders moved between a node's disk and the store by the node itself, so that the agent and the
server never hold a checkpoint's or a dataset's bytes: what crosses the cluster to them is a list
of file records (path, blob name, digest, size), from which the agent commits the catalog.

A node holds no master key. An encrypted blob's data key is handed over unwrapped with the
record (``HandedKeys``): the agent wraps it with the master key before the catalog stores it,
and unwraps it again for the node that reads the blob back. Bytes never leave the node but for
the store; keys never reach a disk but the catalog's, wrapped.
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shipyard.storage.blobs import Blob, BlobStore
from shipyard.storage.config import StorageConfig
from shipyard.storage.node_cache import NodeCache
from shipyard.storage.opening import backend_of

WRITERS = 4
"""Files of one folder a node stores at once."""
HANDED = "handed"
"""The key id of a data key that travels unwrapped between the agent and a node."""


class HandedKeys:
    """The ``MasterKeys`` of a node: a data key is "wrapped" as itself, for the agent to wrap."""

    active_id = HANDED

    def wrap(self, data_key: bytes, context: str) -> tuple[str, bytes]:
        del context
        return HANDED, data_key

    def unwrap(self, key_id: str, wrapped: bytes, context: str) -> bytes:
        assert key_id == HANDED, f"{context}: a node is handed data keys unwrapped"
        return wrapped


def record_of(path: str, blob: Blob) -> dict[str, Any]:
    """A written file as plain values (it crosses processes and machines)."""
    return {
        "path": path,
        "name": blob.name,
        "digest": blob.digest,
        "size_bytes": blob.size_bytes,
        "key_id": blob.key_id,
        "key": _text(blob.wrapped_key),
        "block_crcs": _text(blob.block_crcs),
    }


def blob_of(record: dict[str, Any]) -> Blob:
    return Blob(
        name=record["name"],
        digest=record["digest"],
        size_bytes=record["size_bytes"],
        key_id=record["key_id"],
        wrapped_key=_bytes(record["key"]),
        block_crcs=_bytes(record["block_crcs"]),
    )


@dataclass(frozen=True)
class FolderTransfer:
    """What a node needs to write and read a project's folders in the store: the store's
    configuration (its endpoint and credentials: the node talks to it directly), and the copies
    and encryption the project asks for."""

    config: StorageConfig
    replicas: int
    encrypt: bool

    def _blobs(self) -> BlobStore:
        return BlobStore(backend_of(self.config), HandedKeys)

    def write(self, folder: Path) -> list[dict[str, Any]]:
        """Store every file under ``folder``, several at once, each streamed in blocks (never
        whole in memory); returns their records, paths relative to ``folder``. A file the run
        prunes meanwhile raises ``OSError``: the folder is then no longer worth storing."""
        blobs = self._blobs()
        files = sorted(p for p in folder.rglob("*") if p.is_file())

        def store(file: Path) -> dict[str, Any]:
            blob, _ = blobs.put_file(file, replicas=self.replicas, encrypt=self.encrypt)
            return record_of(file.relative_to(folder).as_posix(), blob)

        # Hashing and the sockets release the GIL: a node's shards go up side by side.
        with ThreadPoolExecutor(max(1, min(WRITERS, len(files)))) as pool:
            return list(pool.map(store, files))

    def read(self, records: list[dict[str, Any]], into: Path) -> Path:
        """The files of ``records`` as folder ``into``, each verified as it is read, the folder
        renamed into place once whole (a reader sees all of it or none)."""
        if into.is_dir():
            return into  # read before (the same checkpoint, handed again)
        blobs = self._blobs()
        staging = into.with_name(f".{into.name}.{os.getpid()}.part")
        shutil.rmtree(staging, ignore_errors=True)
        for record in records:
            blobs.get_file(blob_of(record), _inside(staging, record["path"]))
        staging.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(staging, into)
        except OSError:  # another reader put the same folder in place first
            shutil.rmtree(staging, ignore_errors=True)
            if not into.is_dir():
                raise
        return into

    def cached(self, records: list[dict[str, Any]], cache: Path, holder: str) -> Path:
        """The recorded folder in the node's cache under ``cache``, fetched once per content
        (``node_cache``), held by ``holder`` while this process lives."""
        return NodeCache(cache, int(self.config.node_cache_gib * 2**30)).fetch(self, records, holder)


def _inside(folder: Path, relative: str) -> Path:
    """``folder / relative``, refused when the record's path would leave the folder."""
    target = (folder / relative).resolve()
    if not target.is_relative_to(folder.resolve()) or target == folder.resolve():
        raise ValueError(f"a stored file's path {relative!r} leaves its folder")
    return target


def handed(records: list[dict[str, Any]], wrap: Callable[[bytes, str], tuple[str, bytes]]) -> Iterator[Blob]:
    """The blobs of records a node wrote, their handed data keys wrapped by the master keys."""
    for record in records:
        blob = blob_of(record)
        if blob.key_id == HANDED:
            assert blob.wrapped_key is not None
            key_id, wrapped = wrap(blob.wrapped_key, blob.name)
            blob = Blob(blob.name, blob.digest, blob.size_bytes, key_id, wrapped, blob.block_crcs)
        yield blob


def _text(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode()


def _bytes(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)
