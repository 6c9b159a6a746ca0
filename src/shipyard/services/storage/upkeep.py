"""The artifact store's upkeep (cluster admins): scrub and repair, garbage collection, status,
master-key rotation, adding and removing roots, and the throughput check."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import exists, func, select

from shipyard import audit
from shipyard.auth import Permission
from shipyard.db import StoredArtifact, StoredBlob, StoredEntry
from shipyard.errors import Conflict, InvalidSpec, NotFound
from shipyard.schemas.documents import validate_document
from shipyard.schemas.storage_views import GcReport, RecoveryReport, ScrubReport, StorageStatus
from shipyard.services.accounts import rbac
from shipyard.services.context import ServiceContext
from shipyard.services.storage import health as store_health
from shipyard.services.storage import manifests, scrubber
from shipyard.services.storage.catalog import blob_of
from shipyard.storage import config as storage_config
from shipyard.storage.backend import ScrubTally
from shipyard.storage.blobs import Progress
from shipyard.storage.config import RootConfig
from shipyard.storage.crypto import Keyring
from shipyard.storage.opening import Store, master_keys, open_store


def scrub(
    ctx: ServiceContext,
    *,
    repair: bool,
    verify: bool = True,
    progress: Callable[[int], Progress] | None = None,
    store: Store | None = None,
) -> ScrubReport:
    """Verify every replica of every blob; with ``repair``, rewrite the missing and corrupt ones
    from healthy copies and move copies where failure domains want them. Without ``verify`` only
    presence is checked (a rebalance after the roots changed)."""
    _require_admin(ctx, Permission.STORAGE_SCRUB)
    started = time.perf_counter()
    with ctx.db.transaction() as session:
        rows = [
            (blob_of(row), row.replicas)
            for row in session.scalars(select(StoredBlob).order_by(StoredBlob.name))
        ]
    store = store or open_store(ctx.settings.home)
    report = progress(len(rows)) if progress else None
    tally = ScrubTally()
    for blob, replicas in rows:
        tally.add(store.blobs.scrub(blob, replicas, repair=repair, verify=verify))
        if report:
            report(1)
    lost_artifacts: list[str] = []
    if tally.lost_names:
        with ctx.db.transaction() as session:
            lost_artifacts = [
                f"{a.project}/{a.name}"
                for a in session.scalars(
                    select(StoredArtifact)
                    .join(StoredEntry)
                    .where(StoredEntry.blob_name.in_(tally.lost_names))
                    .distinct()
                )
            ]
    with ctx.db.transaction() as session:
        copies = manifests.heal(store, session, repair=repair)
    counts = {
        "corrupt": tally.corrupt,
        "missing": tally.missing,
        "lost": tally.lost,
        "manifests_missing": copies.missing,
    }
    scrubber.record_scrub(ctx, repair=repair, counts=counts, background=False)
    return ScrubReport(
        checked=tally.checked,
        corrupt=tally.corrupt,
        missing=tally.missing,
        repaired=tally.repaired,
        lost=tally.lost,
        bytes_verified=tally.bytes_verified,
        seconds=round(time.perf_counter() - started, 3),
        lost_artifacts=lost_artifacts,
        manifests_missing=copies.missing,
        manifests_repaired=copies.repaired,
    )


def gc(ctx: ServiceContext, *, grace_s: float | None = None) -> GcReport:
    """Remove blobs no artifact references and objects the catalog never recorded (a writer
    that died), once older than the grace period (so writes in flight are never touched)."""
    _require_admin(ctx, Permission.STORAGE_GC)
    store = open_store(ctx.settings.home)
    grace = store.config.gc_grace_s if grace_s is None else grace_s
    cutoff = ctx.clock.now().timestamp() - grace
    referenced = exists().where(StoredEntry.blob_name == StoredBlob.name)
    blobs_removed = bytes_freed = orphans = 0
    with ctx.db.transaction() as session:
        unreferenced = session.scalars(select(StoredBlob).where(~referenced)).all()
        for row in unreferenced:
            if row.created_at.timestamp() >= cutoff:
                continue
            session.delete(row)
            store.backend.remove(row.name)
            blobs_removed += 1
            bytes_freed += row.size_bytes
        known = set(session.scalars(select(StoredBlob.name)))
        known |= {
            manifests.name_of(project, name)
            for project, name in session.execute(select(StoredArtifact.project, StoredArtifact.name))
        }
    for name, mtime in list(store.backend.objects()):
        if name not in known and mtime < cutoff and store.backend.remove_stale(name, cutoff):
            orphans += 1
    with ctx.db.transaction() as session:
        audit.append(
            session,
            ctx.audit_key,
            ctx.actor,
            "storage.gc",
            "storage",
            detail={"blobs_removed": blobs_removed, "bytes_freed": bytes_freed, "orphans_removed": orphans},
        )
    return GcReport(blobs_removed=blobs_removed, bytes_freed=bytes_freed, orphans_removed=orphans)


SHORTFALL_MAX_AGE_S = 60.0
_shortfalls: dict[Path, tuple[_Shortfall, float]] = {}
"""Each home's last count of the copies its blobs lack, and when: a page shows it again within a
minute rather than looking at every blob's files on every view."""


def status(ctx: ServiceContext, *, fresh: bool = True) -> StorageStatus:
    """The store's totals and health; ``fresh=False``: the copies short as counted within the last
    minute (the count looks at every blob's files)."""
    store = open_store(ctx.settings.home)
    with ctx.db.transaction() as session:
        artifacts, logical = session.execute(
            select(func.count(StoredArtifact.id), func.coalesce(func.sum(StoredArtifact.size_bytes), 0))
        ).one()
        blobs, stored, encrypted = session.execute(
            select(
                func.count(StoredBlob.name),
                func.coalesce(func.sum(StoredBlob.size_bytes), 0),
                func.count(StoredBlob.key_id),
            )
        ).one()
    key: str | None = None
    with contextlib.suppress(NotFound):  # no encrypted blob yet
        key = master_keys(ctx.settings.home, store.config, create=False).active_id
    known = _shortfalls.get(ctx.settings.home)
    if fresh or known is None or time.monotonic() - known[1] > SHORTFALL_MAX_AGE_S:
        known = _shortfalls[ctx.settings.home] = (_shortfall(ctx, store), time.monotonic())
    short = known[0]
    rate = store.config.scrub.rate_mb_s * 2**20
    owed = store_health.owed(ctx.settings.home)
    return StorageStatus(
        backend=store.backend.kind,
        roots=store.backend.describe(),
        default_replicas=store.config.replicas,
        artifacts=artifacts,
        blobs=blobs,
        bytes=logical,
        stored_bytes=stored,
        encrypted_blobs=encrypted,
        active_key=key,
        background_scrub=dataclasses.asdict(scrubber.last_pass(ctx)),
        short_blobs=short.blobs,
        missing_copies=short.copies,
        bytes_to_copy=short.bytes,
        time_to_whole_s=short.bytes / rate if short.copies else None,
        repair_owed_since=owed.since if owed else None,
    )


@dataclasses.dataclass
class _Shortfall:
    blobs: int = 0
    copies: int = 0
    bytes: int = 0


def _shortfall(ctx: ServiceContext, store: Store) -> _Shortfall:
    """Blobs short of their copies on local roots, seen as the light pass sees them (an object
    store keeps its own copies: none are counted there)."""
    short = _Shortfall()
    if store.backend.kind != "local":
        return short
    with ctx.db.read() as session:
        rows = [(blob_of(row), row.replicas) for row in session.scalars(select(StoredBlob))]
    for blob, replicas in rows:
        found = store.blobs.scrub(blob, replicas, repair=False, verify=False)
        missing = found.missing + found.lost * replicas
        if missing:
            short.blobs, short.copies = short.blobs + 1, short.copies + missing
            short.bytes += missing * blob.size_bytes
    return short


def rotate_key(ctx: ServiceContext) -> dict[str, object]:
    """A new master key; every data key is re-wrapped with it (the data is not rewritten), then
    the old keys are dropped from the key file."""
    _require_admin(ctx, Permission.STORAGE_ROTATE_KEY)
    config = storage_config.load(ctx.settings.home)
    old = master_keys(ctx.settings.home, config)
    if not isinstance(old, Keyring):
        raise InvalidSpec("the master key lives in a KMS", hint="rotate it there; its key ids change with it")
    ring = old.rotated()
    with ctx.db.transaction() as session:
        rows = session.scalars(select(StoredBlob).where(StoredBlob.key_id.is_not(None))).all()
        for row in rows:
            assert row.key_id is not None and row.wrapped_key is not None
            data_key = ring.unwrap(row.key_id, row.wrapped_key, row.name)
            row.key_id, row.wrapped_key = ring.wrap(data_key, row.name)
        audit.append(
            session,
            ctx.audit_key,
            ctx.actor,
            "storage.rotate_key",
            "storage",
            detail={"key": ring.active_id, "rewrapped": len(rows)},
        )
    ring.retired()
    return {"key": ring.active_id, "previous": old.active_id, "rewrapped": len(rows)}


# -- roots ----------------------------------------------------------------------------------------


def add_root(
    ctx: ServiceContext, path: Path, *, rack: str | None, node: str | None, disk: str | None
) -> ScrubReport:
    """Add a root and rebalance: blobs whose copies share a failure domain the new root widens,
    or that have fewer copies than asked, get them now."""
    _require_admin(ctx, Permission.STORAGE_ROOTS)
    path = path.expanduser().resolve()
    config = storage_config.load(ctx.settings.home)
    if any(root.path == path for root in config.roots):
        raise Conflict(f"{path} is a root already", hint="`shipyard storage status` lists the roots")
    if not path.parent.is_dir():
        raise NotFound(
            f"{path.parent} does not exist", hint="mount the disk first, or give an existing folder"
        )
    domains = {k: v for k, v in {"rack": rack, "node": node, "disk": disk}.items() if v}
    root = validate_document(RootConfig, {"path": path, **domains}, source="the root", hint=DOMAIN_HINT)
    if path.exists() and not path.is_dir():
        raise InvalidSpec(f"{path} is a file, not a folder", hint="give a folder on the disk to use")
    path.mkdir(exist_ok=True)
    if not os.access(path, os.W_OK):
        raise InvalidSpec(
            f"{path} is not writable by this user", hint="fix its owner or mode, then add it again"
        )
    default = storage_config.default_root(ctx.settings.home)
    if not config.roots and default.path.is_dir() and any(default.path.iterdir()):
        config.roots.append(default)  # the built-in root becomes an explicit one: its blobs stay found
    config.roots.append(root)
    storage_config.save(ctx.settings.home, config)
    return scrub(ctx, repair=True, verify=False)


DOMAIN_HINT = "name --rack, --node and --disk with letters, digits, '.', '_' and '-'"


def remove_root(ctx: ServiceContext, path: Path) -> ScrubReport:
    """Copy every blob off a root onto the others (as placement wants), then forget the root."""
    _require_admin(ctx, Permission.STORAGE_ROOTS)
    path = path.expanduser().resolve()
    config = storage_config.load(ctx.settings.home)
    leaving = [root for root in config.roots if root.path == path]
    if not leaving:
        raise NotFound(f"{path} is not a root", hint="`shipyard storage status` lists the roots")
    staying = config.model_copy(update={"roots": [root for root in config.roots if root.path != path]})
    if not staying.roots:
        raise Conflict(f"{path} is the last root", hint="add another root before removing this one")
    moved = scrub(
        ctx, repair=True, verify=False, store=open_store(ctx.settings.home, staying, retiring=leaving)
    )
    if moved.lost:
        raise Conflict(
            f"{moved.lost} blob(s) have no copy left to move off {path}; the root stays: "
            + ", ".join(moved.lost_artifacts),
            hint="restore those artifacts or delete them, then remove the root again",
        )
    storage_config.save(ctx.settings.home, staying)
    return moved


def recover(ctx: ServiceContext) -> RecoveryReport:
    """Put back into the catalog every artifact whose manifest the store holds and the catalog
    lacks (cluster admins): after the database was lost, or restored from an older backup."""
    _require_admin(ctx, Permission.STORAGE_SCRUB)
    store = open_store(ctx.settings.home)
    found = recovered = 0
    unreadable: list[str] = []
    for object_name, manifest in manifests.stored(store):
        found += 1
        if isinstance(manifest, str):
            unreadable.append(f"{object_name}: {manifest}")
            continue
        with ctx.db.transaction() as session:
            recovered += manifests.restore(session, manifest)
    with ctx.db.transaction() as session:
        audit.append(
            session,
            ctx.audit_key,
            ctx.actor,
            "storage.recover",
            "storage",
            outcome="ok" if not unreadable else "partial",
            detail={"manifests": found, "recovered": recovered, "unreadable": len(unreadable)},
        )
    return RecoveryReport(
        manifests=found,
        recovered=recovered,
        already_known=found - recovered - len(unreadable),
        unreadable=unreadable,
    )


def _require_admin(ctx: ServiceContext, permission: Permission) -> None:
    with ctx.db.transaction() as session:
        rbac.require(ctx, session, permission, "storage")


def bench(ctx: ServiceContext, size_bytes: int) -> list[dict[str, object]]:
    """Throughput of the store beside a plain fsync'd file, on the disk of the first root."""
    from shipyard.services.storage import bench as storage_bench

    store = open_store(ctx.settings.home)
    described = store.backend.describe()
    parent = Path(str(described[0]["path"])) if store.backend.kind == "local" else ctx.settings.home
    return storage_bench.run(parent, size_bytes)
