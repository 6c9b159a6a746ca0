"""Opening the artifact store a home's ``storage.yaml`` describes: its backend (replicated local
roots, or an S3-compatible bucket) and its master keys (the KMS hook, else the key file)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from shipyard.errors import InvalidSpec, NotFound
from shipyard.storage import config as storage_config
from shipyard.storage.backend import Backend, ScrubTally
from shipyard.storage.blobs import BlobStore
from shipyard.storage.config import RootConfig, StorageConfig
from shipyard.storage.crypto import MasterKeys, load_keyring
from shipyard.storage.roots import ReplicatedRoots
from shipyard.storage.s3 import S3Objects

KEY_FILE = "storage.key"


@dataclass
class Store:
    config: StorageConfig
    blobs: BlobStore

    @property
    def backend(self) -> Backend:
        return self.blobs.backend


def open_store(
    home: Path,
    config: StorageConfig | None = None,
    retiring: Sequence[RootConfig] = (),
    damaged: Callable[[ScrubTally], None] | None = None,
) -> Store:
    """The store of ``home`` (``config``: another configuration than its file's; ``retiring``:
    roots whose copies are being moved off; ``damaged``: told what a read found missing or
    damaged, and repaired)."""
    config = config or storage_config.load(home)
    if config.backend == "local":
        roots = config.roots or [storage_config.default_root(home)]
        for root in roots:
            if root == storage_config.default_root(home):
                root.path.mkdir(parents=True, exist_ok=True)
        config = config.model_copy(update={"roots": roots})
    backend = backend_of(config, retiring)
    return Store(config, BlobStore(backend, lambda: master_keys(home, config), damaged))


def backend_of(config: StorageConfig, retiring: Sequence[RootConfig] = ()) -> Backend:
    """The backend a configuration names (a local one's roots given: a node has no home)."""
    if config.backend == "s3":
        if config.s3 is None:
            raise InvalidSpec(
                "storage.yaml says backend: s3 but has no s3 section",
                hint="add s3: {endpoint_url: ..., bucket: ..., access_key: ..., secret_key: ...}",
            )
        return S3Objects(config.s3)
    return ReplicatedRoots(config.roots, retiring=list(retiring))


def master_keys(home: Path, config: StorageConfig, *, create: bool = True) -> MasterKeys:
    """The KMS hook of ``storage.yaml`` if set, else ``$SHIPYARD_STORAGE_KEY`` or the key file."""
    if config.kms:
        module, _, factory = config.kms.partition(":")
        try:
            return getattr(importlib.import_module(module), factory)(config)  # type: ignore[no-any-return]
        except (ImportError, AttributeError) as exc:
            raise InvalidSpec(
                f"the KMS hook {config.kms!r} of storage.yaml cannot be loaded ({exc})",
                hint="write it as package.module:factory, importable by this Python",
            ) from exc
    ring = load_keyring(home / KEY_FILE, create=create)
    if ring is None:
        raise NotFound("no storage key exists yet", hint="it is made by the first `storage put --encrypt`")
    return ring
