"""The artifact store's use cases: put, get, list, stat, delete (upkeep: ``storage_upkeep``).

Bytes go to the backend first, durably; the catalog rows that make an artifact visible are
written after, in one transaction. A crash in between leaves unreferenced blobs, which garbage
collection removes after its grace period, and never a partial artifact.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shipyard import audit
from shipyard.auth import Permission
from shipyard.db import StoredArtifact, StoredBlob, StoredEntry
from shipyard.domain.paths import refuse_overwrite
from shipyard.durable import fsync_dir
from shipyard.errors import Conflict, InvalidSpec, NotFound
from shipyard.executors.base import StoredInput
from shipyard.schemas.storage_views import StoredArtifactView
from shipyard.services.accounts import rbac
from shipyard.services.context import ServiceContext
from shipyard.services.storage import admission, catalog, manifests
from shipyard.services.storage import health as store_health
from shipyard.storage import transfer
from shipyard.storage.backend import ScrubTally
from shipyard.storage.blobs import Blob, Progress
from shipyard.storage.names import check_name
from shipyard.storage.opening import Store, open_store
from shipyard.storage.transfer import FolderTransfer

DEFAULT_PROJECT = "default"


# -- put / get --------------------------------------------------------------------------------------


def put(
    ctx: ServiceContext,
    source: Path,
    name: str,
    *,
    project: str = DEFAULT_PROJECT,
    replicas: int | None = None,
    encrypt: bool | None = None,
    progress: Callable[[int], Progress] | None = None,
    owner: str | None = None,
    file_name: str | None = None,
) -> StoredArtifactView:
    """Store a file or a folder as artifact ``project/name``; visible only once every blob is
    durable. ``progress(total_bytes)`` returns the per-chunk callback; ``owner`` is recorded as
    the creator when the caller acts for someone (the agent for a job's owner)."""
    check_name(name)
    check_name(project, "project name")
    source = source.expanduser()
    files = _files_of(source)
    if file_name is not None and source.is_file():  # an upload's temporary file, by the name given
        files = [(check_name(file_name, "file name"), source, files[0][2])]
    total = sum(size for _, _, size in files)
    store = open_tended_store(ctx)
    copies = store.config.replicas_for(project, replicas)
    notes = []
    roots = len(store.backend.describe()) if store.backend.kind == "local" else copies
    if replicas is None and copies > roots:
        # A default the store cannot meet yet (one built-in root) must not fail every checkpoint.
        notes.append(
            f"{copies} replicas by default but only {roots} root(s): stored {roots}; add roots for more"
        )
        copies = roots
    encrypted = store.config.project(project).encrypt if encrypt is None else encrypt
    with ctx.db.transaction() as session:
        rbac.require(ctx, session, Permission.ARTIFACT_WRITE, f"artifact/{project}/{name}", project)
        admission.refuse_taken(session, project, name)
        admission.check_quota(session, store.config, project, total)
    report = progress(total) if progress else None
    placed = [
        (path, *store.blobs.put_file(file, replicas=copies, encrypt=encrypted, progress=report))
        for path, file, _ in files
    ]
    kind = "folder" if source.is_dir() else "file"
    view = _commit(ctx, store, project, name, kind, [(path, blob) for path, blob, _ in placed], copies, owner)
    warnings = notes + [warning for _, _, written in placed for warning in written.warnings]
    return view.model_copy(update={"warnings": warnings})


def _commit(
    ctx: ServiceContext,
    store: Store,
    project: str,
    name: str,
    kind: str,
    placed: list[tuple[str, Blob]],
    copies: int,
    owner: str | None,
) -> StoredArtifactView:
    """Make durable blobs visible as artifact ``project/name``: its catalog rows and manifest, in
    one transaction."""
    total = sum(blob.size_bytes for _, blob in placed)
    with ctx.db.transaction() as session:
        admission.refuse_taken(session, project, name)  # again: another writer may have committed meanwhile
        artifact = StoredArtifact(
            project=project,
            name=name,
            kind=kind,
            size_bytes=total,
            replicas=copies,
            encrypted=any(blob.encrypted for _, blob in placed),
            created_by=owner or ctx.actor.name,
        )
        rows = {}
        for path, blob in placed:
            row = _catalog(session, store, blob, copies, project)
            artifact.entries.append(StoredEntry(path=path, blob_name=row.name))
            rows[row.name] = row
        session.add(artifact)
        session.flush()
        # Beside the blobs, before the commit: a catalog lost later is rebuilt from the store.
        manifests.write(store, artifact, rows)
        audit.append(
            session,
            ctx.audit_key,
            ctx.actor,
            "artifact.put",
            f"artifact/{project}/{name}",
            detail={
                "bytes": total,
                "files": len(placed),
                "replicas": copies,
                "encrypted": artifact.encrypted,
            },
        )
        return catalog.view_of(artifact, with_entries=False)


# -- folders nodes move themselves ----------------------------------------------------------------


def transfer_for(ctx: ServiceContext, project: str) -> FolderTransfer:
    """What a node needs to write the project's folders into the store, and read them back."""
    store = open_tended_store(ctx)
    return FolderTransfer(store.config, _copies(store, project), store.config.project(project).encrypt)


def sealed(ctx: ServiceContext, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records a node wrote, each handed data key wrapped by the master keys (so that no key is
    kept unwrapped, not even until the catalog commits them)."""
    if not any(record["key_id"] == transfer.HANDED for record in records):
        return records
    keys = open_tended_store(ctx).blobs.master_keys()
    blobs = transfer.handed(records, keys.wrap)
    return [transfer.record_of(record["path"], blob) for record, blob in zip(records, blobs, strict=True)]


def commit_written(
    ctx: ServiceContext, records: list[dict[str, Any]], name: str, *, project: str, owner: str | None
) -> None:
    """Commit as artifact ``project/name`` a folder whose files a node wrote into the store itself
    (``FolderTransfer.write``): the blobs are durable already, the catalog makes them visible,
    within the project's quota. Blobs a refusal leaves unreferenced go at garbage collection."""
    check_name(name)
    store = open_tended_store(ctx)
    with ctx.db.transaction() as session:
        rbac.require(ctx, session, Permission.ARTIFACT_WRITE, f"artifact/{project}/{name}", project)
        admission.refuse_taken(session, project, name)
        admission.check_quota(session, store.config, project, sum(r["size_bytes"] for r in records))
    records = sealed(ctx, records)
    placed = [(record["path"], transfer.blob_of(record)) for record in records]
    _commit(ctx, store, project, name, "folder", placed, _copies(store, project), owner)


def handed(ctx: ServiceContext, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records of stored files for a node to read them back with ``FolderTransfer.read``, each
    encrypted blob's data key unwrapped for it (it travels with the launch, never to a disk)."""
    if not any(record["key_id"] for record in records):
        return records
    keys = open_tended_store(ctx).blobs.master_keys()
    out = []
    for record in records:
        blob = transfer.blob_of(record)
        if blob.encrypted:
            assert blob.key_id is not None and blob.wrapped_key is not None
            key = keys.unwrap(blob.key_id, blob.wrapped_key, blob.name)
            blob = Blob(blob.name, blob.digest, blob.size_bytes, transfer.HANDED, key, blob.block_crcs)
        out.append(transfer.record_of(record["path"], blob))
    return out


def node_input(ctx: ServiceContext, session: Session, name: str, project: str) -> tuple[StoredInput, str]:
    """Stored artifact ``project/name`` as a cluster node fetches it into its own cache (the
    caller must be allowed to read it), and its content digest (for lineage)."""
    artifact = catalog.readable(ctx, session, project, name, Permission.ARTIFACT_READ)
    files = [transfer.record_of(e.path, catalog.blob_of(e.blob)) for e in artifact.entries]
    within = artifact.entries[0].path if artifact.kind == "file" else ""
    return StoredInput(handed(ctx, files), within), catalog.content_digest(artifact)


def _copies(store: Store, project: str) -> int:
    """The copies of a project's blobs, at most as many as the local roots can hold apart."""
    copies = store.config.replicas_for(project)
    return min(copies, len(store.backend.describe())) if store.backend.kind == "local" else copies


def _files_of(source: Path) -> list[tuple[str, Path, int]]:
    """(path inside the artifact, file, size) of a file or of every file under a folder."""
    if source.is_file():
        return [(source.name, source, source.stat().st_size)]
    if not source.is_dir():
        raise NotFound(f"{source} does not exist", hint="give the path of a file or a folder to store")
    files = sorted(p for p in source.rglob("*") if p.is_file())
    if not files:
        raise InvalidSpec(f"{source} holds no file", hint="store a folder with at least one file in it")
    return [(p.relative_to(source).as_posix(), p, p.stat().st_size) for p in files]


def _catalog(session: Session, store: Store, blob: Blob, replicas: int, project: str) -> StoredBlob:
    """The catalog row for a freshly written blob; an equal blob already stored is reused and the
    fresh copy dropped, so unchanged shards are kept once."""
    existing = session.get(StoredBlob, blob.name)  # a content-addressed name: the same bytes
    if existing is None:
        same = select(StoredBlob).where(
            StoredBlob.digest == blob.digest, StoredBlob.size_bytes == blob.size_bytes
        )
        if blob.encrypted:
            same = same.where(StoredBlob.key_id.is_not(None), StoredBlob.project == project)
        else:
            same = same.where(StoredBlob.key_id.is_(None))
        existing = session.scalars(same.limit(1)).first()
    if existing is not None:
        existing.replicas = max(existing.replicas, replicas)
        if existing.block_crcs is None and not blob.encrypted:  # stored before blocks had CRCs
            existing.block_crcs = blob.block_crcs
        if existing.name != blob.name:
            store.backend.remove(blob.name)
        # The fresh write may have put copies on other roots than the first: keep as many as asked.
        store.backend.ensure(existing.name, existing.replicas)
        return existing
    row = StoredBlob(
        name=blob.name,
        digest=blob.digest,
        size_bytes=blob.size_bytes,
        replicas=replicas,
        key_id=blob.key_id,
        wrapped_key=blob.wrapped_key,
        project=project if blob.encrypted else None,
        block_crcs=blob.block_crcs,
    )
    session.add(row)
    return row


def get(
    ctx: ServiceContext,
    name: str,
    out: Path,
    *,
    project: str = DEFAULT_PROJECT,
    progress: Callable[[int], Progress] | None = None,
    session: Session | None = None,
    force: bool = False,
) -> StoredArtifactView:
    """Write artifact ``project/name`` to ``out``: a file (an existing one only with ``force``),
    or a folder that appears whole, never over anything. ``session``: the caller's open
    transaction, when it holds one (the agent launching a job)."""
    with _within(ctx, session) as session:
        artifact = catalog.readable(ctx, session, project, name, Permission.ARTIFACT_READ)
        audit.append(session, ctx.audit_key, ctx.actor, "artifact.get", f"artifact/{project}/{name}")
        view = catalog.view_of(artifact, with_entries=True)
        blobs = [(entry.path, catalog.blob_of(entry.blob)) for entry in artifact.entries]
    store = open_tended_store(ctx)
    report = progress(view.size_bytes) if progress else None
    out = out.expanduser()
    if view.kind == "file":
        target = out / blobs[0][0] if out.is_dir() else out
        refuse_overwrite(target, force=force)
        store.blobs.get_file(blobs[0][1], target, report)
        return view
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise Conflict(f"{out} exists and is not an empty folder", hint="give a new path for the folder")
    staging = out.with_name(f".{out.name}.{os.getpid()}.part")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        for path, blob in blobs:
            store.blobs.get_file(blob, staging / path, report)
        if out.exists():
            out.rmdir()
        staging.replace(out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return view


@contextlib.contextmanager
def _within(ctx: ServiceContext, session: Session | None) -> Iterator[Session]:
    if session is not None:
        yield session
    else:
        with ctx.db.transaction() as own:
            yield own


def get_file(
    ctx: ServiceContext, name: str, file: str | None, out: Path, *, project: str = DEFAULT_PROJECT
) -> str:
    """One file of an artifact (the only one when ``file`` is None) to ``out``; -> its path in
    the artifact."""
    with ctx.db.transaction() as session:
        artifact = catalog.readable(ctx, session, project, name, Permission.ARTIFACT_READ)
        entries = {entry.path: entry for entry in artifact.entries}
        if file is None and len(entries) == 1:
            file = next(iter(entries))
        if file not in entries:
            shown = ", ".join(list(entries)[:10])
            raise NotFound(f"artifact {project}/{name} has no file {file!r}", hint=f"its files: {shown}")
        audit.append(
            session,
            ctx.audit_key,
            ctx.actor,
            "artifact.get",
            f"artifact/{project}/{name}",
            detail={"file": file},
        )
        blob = catalog.blob_of(entries[file].blob)
    open_tended_store(ctx).blobs.get_file(blob, out)
    return file


def materialize(
    ctx: ServiceContext, name: str, *, project: str, session: Session | None = None
) -> tuple[Path, str]:
    """A verified copy of an artifact in this node's cache, fetched once per content (a dataset
    that several jobs read, or a job that runs again), and the content digest it has."""
    with _within(ctx, session) as within:
        artifact = catalog.readable(ctx, within, project, name, Permission.ARTIFACT_READ)
        digest = catalog.content_digest(artifact)
        target = ctx.settings.cache_dir / "artifacts" / digest[:24]
        final = target if artifact.kind == "folder" else target / artifact.entries[0].path
        if not final.exists():  # both kinds appear whole or not at all
            if artifact.kind == "file":
                target.mkdir(parents=True, exist_ok=True)
            get(ctx, name, target, project=project, session=within)
    return final, digest


def open_tended_store(ctx: ServiceContext) -> Store:
    """The home's store, with what its reads find missing or damaged (and cannot settle there)
    marked for the scrubber; where a repair is owed and this process has an agent to start (the
    embedded CLI), the agent is started, and repairs in the background."""
    home = ctx.settings.home

    def damaged(found: ScrubTally) -> None:
        store_health.owe_for(home, found)
        _repair_if_owed(ctx)

    store = open_store(home, damaged=damaged)
    if store.backend.kind == "local" and not all(r["reachable"] for r in store.backend.describe()):
        store_health.owe(home, deep=False)  # a root gone: its copies are restored elsewhere
    _repair_if_owed(ctx)
    return store


def _repair_if_owed(ctx: ServiceContext) -> None:
    if ctx.start_agent is not None and store_health.owed(ctx.settings.home) is not None:
        ctx.start_agent(ctx.settings)


def stat(ctx: ServiceContext, name: str, project: str = DEFAULT_PROJECT) -> StoredArtifactView:
    with ctx.db.transaction() as session:
        return catalog.view_of(
            catalog.readable(ctx, session, project, name, Permission.ARTIFACT_READ), with_entries=True
        )


def list_artifacts(
    ctx: ServiceContext,
    project: str | None = None,
    prefix: str = "",
    *,
    limit: int | None = None,
    offset: int = 0,
) -> list[StoredArtifactView]:
    """By project and name; ``limit`` and ``offset`` page through them."""
    with ctx.db.transaction() as session:
        query = (
            select(StoredArtifact)
            .order_by(StoredArtifact.project, StoredArtifact.name)
            .limit(limit)
            .offset(offset)
        )
        if project:
            query = query.where(StoredArtifact.project == project)
        if prefix:
            query = query.where(StoredArtifact.name.startswith(prefix, autoescape=True))
        if not ctx.actor.is_admin:
            query = query.where(StoredArtifact.project.in_(list(rbac.projects_of(session, ctx.actor))))
        return [catalog.view_of(a, with_entries=False) for a in session.scalars(query)]


def delete(ctx: ServiceContext, name: str, project: str = DEFAULT_PROJECT) -> None:
    """Forget an artifact; its blobs are freed by the next ``gc`` after the grace period."""
    with ctx.db.transaction() as session:
        artifact = catalog.readable(ctx, session, project, name, Permission.ARTIFACT_DELETE)
        session.delete(artifact)
        manifests.remove(open_store(ctx.settings.home), project, name)
        audit.append(session, ctx.audit_key, ctx.actor, "artifact.delete", f"artifact/{project}/{name}")
