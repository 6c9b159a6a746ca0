"""Manifests: each artifact's catalog rows, written into the store beside its blobs, so that the
catalog can be rebuilt from the store alone after the database is lost (``storage recover``).

A manifest is ``manifests/<sha256 of project/name>.json`` in the backend (every root for local
roots, the bucket for S3), replicated like the artifact, written after its blobs and before the
catalog commit that makes the artifact visible, and removed when the artifact is deleted.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from shipyard.db import StoredArtifact, StoredBlob, StoredEntry
from shipyard.errors import CorruptData, StorageError
from shipyard.storage.opening import Store

PREFIX = "manifests/"
VERSION = 1


def name_of(project: str, name: str) -> str:
    """The manifest's object name (a digest: artifact names may hold slashes and any length)."""
    return f"{PREFIX}{hashlib.sha256(f'{project}/{name}'.encode()).hexdigest()}.json"


def document(artifact: StoredArtifact, blobs: dict[str, StoredBlob]) -> dict[str, Any]:
    return {
        "version": VERSION,
        "project": artifact.project,
        "name": artifact.name,
        "kind": artifact.kind,
        "size_bytes": artifact.size_bytes,
        "replicas": artifact.replicas,
        "encrypted": artifact.encrypted,
        "created_by": artifact.created_by,
        "created_at": artifact.created_at.isoformat(),
        "entries": [
            {"path": entry.path, "blob": _blob(blobs[entry.blob_name])} for entry in artifact.entries
        ],
    }


def _blob(row: StoredBlob) -> dict[str, Any]:
    return {
        "name": row.name,
        "digest": row.digest,
        "size_bytes": row.size_bytes,
        "replicas": row.replicas,
        "key_id": row.key_id,
        # The data key wrapped by the master key: useless without it, as in the catalog.
        "wrapped_key": _text(row.wrapped_key),
        "block_crcs": _text(row.block_crcs),
        "project": row.project,
    }


def _text(value: bytes | None) -> str | None:
    return base64.b64encode(value).decode() if value is not None else None


def _bytes(value: str | None) -> bytes | None:
    return base64.b64decode(value) if value is not None else None


def write(store: Store, artifact: StoredArtifact, blobs: dict[str, StoredBlob]) -> None:
    body = json.dumps(document(artifact, blobs), sort_keys=True).encode()
    name = name_of(artifact.project, artifact.name)
    store.backend.write([body], lambda: name, min(artifact.replicas, _most_copies(store)))


def _most_copies(store: Store) -> int:
    return len(store.backend.describe()) if store.backend.kind == "local" else 1


@dataclass
class ManifestTally:
    missing: int = 0
    """Manifest copies fewer than their artifact wants (a root lost or replaced)."""
    repaired: int = 0
    """Manifests written again from the catalog."""


def heal(store: Store, session: Session, *, repair: bool) -> ManifestTally:
    """Count the manifest copies a lost or replaced root took with it and, with ``repair``,
    write those manifests again from the catalog: blob replicas are restored by the scrub, and a
    manifest with no copy left would leave its artifact unrecoverable after a lost database."""
    tally = ManifestTally()
    artifacts = session.scalars(
        select(StoredArtifact).options(selectinload(StoredArtifact.entries)).order_by(StoredArtifact.id)
    )
    for artifact in artifacts:
        wanted = min(artifact.replicas, _most_copies(store))
        short = wanted - len(store.backend.replicas(name_of(artifact.project, artifact.name)))
        if short <= 0:
            continue
        tally.missing += short
        if repair:
            names = [entry.blob_name for entry in artifact.entries]
            blobs = {
                row.name: row for row in session.scalars(select(StoredBlob).where(StoredBlob.name.in_(names)))
            }
            write(store, artifact, blobs)
            tally.repaired += 1
    return tally


def remove(store: Store, project: str, name: str) -> None:
    store.backend.remove(name_of(project, name))


def stored(store: Store) -> Iterator[tuple[str, dict[str, Any] | str]]:
    """Every manifest in the store: (object name, the manifest, or why it could not be read)."""
    for object_name, _ in list(store.backend.objects()):
        if not object_name.startswith(PREFIX) or not object_name.endswith(".json"):
            continue
        try:
            yield object_name, json.loads(_read(store, object_name))
        except (StorageError, CorruptData, OSError, ValueError) as exc:
            yield object_name, str(exc)


def _read(store: Store, object_name: str) -> bytes:
    chunks: list[bytes] = []

    def collect(read: Any) -> None:
        chunks.clear()
        while piece := read(1 << 20):
            chunks.append(piece)

    copies = store.backend.replicas(object_name)
    if not copies:
        raise StorageError(f"{object_name} has no readable copy")
    with copies[0].open() as handle:
        collect(handle.read)
    return b"".join(chunks)


def restore(session: Session, manifest: dict[str, Any]) -> bool:
    """The manifest's rows, unless the catalog has the artifact; True when it added them."""
    known = session.scalar(
        select(StoredArtifact.id).where(
            StoredArtifact.project == manifest["project"], StoredArtifact.name == manifest["name"]
        )
    )
    if known is not None:
        return False
    artifact = StoredArtifact(
        project=manifest["project"],
        name=manifest["name"],
        kind=manifest["kind"],
        size_bytes=manifest["size_bytes"],
        replicas=manifest["replicas"],
        encrypted=manifest["encrypted"],
        created_by=manifest["created_by"],
        created_at=datetime.fromisoformat(manifest["created_at"]),
    )
    for entry in manifest["entries"]:
        blob = entry["blob"]
        if session.get(StoredBlob, blob["name"]) is None:
            session.add(
                StoredBlob(
                    name=blob["name"],
                    digest=blob["digest"],
                    size_bytes=blob["size_bytes"],
                    replicas=blob["replicas"],
                    key_id=blob["key_id"],
                    wrapped_key=_bytes(blob["wrapped_key"]),
                    block_crcs=_bytes(blob.get("block_crcs")),
                    project=blob["project"],
                )
            )
            session.flush()
        artifact.entries.append(StoredEntry(path=entry["path"], blob_name=blob["name"]))
    session.add(artifact)
    return True
