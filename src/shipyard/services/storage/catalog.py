"""The artifact catalog, read: an artifact found by name (and checked against the caller's role),
its content digest, what a job's data path was, and the views the API answers with."""

from __future__ import annotations

import hashlib

from sqlalchemy import select
from sqlalchemy.orm import Session

from shipyard.auth import Permission
from shipyard.db import StoredArtifact, StoredBlob
from shipyard.errors import NotFound
from shipyard.schemas.jobspec import STORE_SCHEME
from shipyard.schemas.storage_views import StoredArtifactView, StoredFileView
from shipyard.services.accounts import rbac
from shipyard.services.context import ServiceContext
from shipyard.storage.blobs import Blob
from shipyard.storage.names import check_name


def content_digest(artifact: StoredArtifact) -> str:
    """One digest for an artifact's whole content: its files' paths and block digests."""
    listing = "\n".join(f"{e.path}\0{e.blob.digest}" for e in artifact.entries)
    return hashlib.sha256(listing.encode()).hexdigest()


def dataset_lineage(session: Session, project: str, path: str, recorded: list[str]) -> dict[str, object]:
    """What a job's data path was: a stored dataset with the content digest its attempts read
    (``recorded``, first attempt first), or a local path (not content-addressed: the files may
    have changed since). Says so when the dataset changed between attempts or since."""
    if not path.startswith(STORE_SCHEME):
        return {"path": path, "digest": None}
    name = path.removeprefix(STORE_SCHEME)
    artifact = find(session, project, name)
    current = content_digest(artifact) if artifact else None
    read = list(dict.fromkeys(recorded))  # distinct, in order
    found: dict[str, object] = {
        "path": path,
        "artifact": f"{project}/{name}",
        "digest": read[0] if read else current,
    }
    if len(read) > 1:
        found["changed_between_attempts"] = read
    if read and current != read[-1]:
        found["current_digest"] = current  # replaced or deleted since: the lineage keeps what was read
    return found


def blob_of(row: StoredBlob) -> Blob:
    return Blob(
        row.name, row.digest, row.size_bytes, row.key_id, row.wrapped_key, row.block_crcs, row.replicas
    )


def find(session: Session, project: str, name: str) -> StoredArtifact | None:
    return session.scalars(
        select(StoredArtifact).where(StoredArtifact.project == project, StoredArtifact.name == name)
    ).first()


def readable(
    ctx: ServiceContext, session: Session, project: str, name: str, permission: Permission
) -> StoredArtifact:
    check_name(name)
    rbac.require(ctx, session, permission, f"artifact/{project}/{name}", project)
    artifact = find(session, project, name)
    if artifact is None:
        raise NotFound(
            f"no artifact {project}/{name}",
            hint=f"`shipyard storage ls --project {project}` lists the artifacts of the project",
        )
    return artifact


def view_of(artifact: StoredArtifact, *, with_entries: bool) -> StoredArtifactView:
    return StoredArtifactView(
        project=artifact.project,
        name=artifact.name,
        kind=artifact.kind,
        size_bytes=artifact.size_bytes,
        files=len(artifact.entries),
        replicas=artifact.replicas,
        encrypted=artifact.encrypted,
        created_by=artifact.created_by,
        created_at=artifact.created_at,
        entries=[
            StoredFileView(path=e.path, size_bytes=e.blob.size_bytes, digest=e.blob.digest)
            for e in artifact.entries
        ]
        if with_entries
        else [],
    )
