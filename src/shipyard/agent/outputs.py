"""What happens to an attempt's outputs: its checkpoints recorded for the next attempt, its export
registered as a model version, and both copied into the artifact store."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from shipyard import audit
from shipyard.auth import Permission
from shipyard.db import Artifact, Job, User
from shipyard.domain import JobState
from shipyard.durable import write_text_atomic
from shipyard.errors import Conflict, NotFound, ShipyardError
from shipyard.executors.base import StoredCheckpoint
from shipyard.schemas.launch import (
    CHECKPOINT_MARKER,
    CHECKPOINT_POINTER,
    STORED_ONLY_MARKER,
    AttemptResult,
    is_stored_only,
)
from shipyard.services.accounts import rbac
from shipyard.services.context import LOCAL_PREFIX, ServiceContext
from shipyard.services.models import models
from shipyard.services.storage import storage

_log = logging.getLogger("shipyard.agent")


def commit_outputs(ctx: ServiceContext, at_most: int = 4) -> int:
    """Copy up to ``at_most`` recorded checkpoints and exports into the artifact store (outside
    any transaction: writing gigabytes must not hold the database); returns how many it took.
    A relaunch on another node, and every model download, then read them from there."""
    with ctx.db.transaction() as session:
        pending = session.execute(
            select(
                Artifact.id,
                Artifact.path,
                Artifact.kind,
                Artifact.step,
                Artifact.written,
                Job.id,
                Job.project,
                Job.owner,
            )
            .join(Job, Job.id == Artifact.job_id)
            .where(Artifact.stored_name.is_(None))
            .order_by(Artifact.id)
            .limit(at_most)
        ).all()
    for artifact_id, path, kind, step, written, job_id, project, owner in pending:
        name = f"jobs/{job_id}/{kind}/step-{step}"
        try:
            if written is not None:  # its nodes wrote the files: only the catalog is left to do
                storage.commit_written(ctx, written, name, project=project, owner=owner)
            else:
                storage.put(ctx, Path(path), name, project=project, owner=owner)
        except Conflict:
            pass  # committed by an earlier pass that died before recording it
        except NotFound:
            name = ""  # pruned before it could be committed; nothing to retry
        except OSError as exc:  # pruned while it was read (the attempt keeps checkpoint.keep)
            if Path(path).exists():
                _log.warning("could not commit %s to the artifact store: %s", path, exc)
            name = ""
        except ShipyardError as exc:  # a full or unreachable store: the job's outcome stands
            _log.warning("could not commit %s to the artifact store: %s", path, exc)
            name = ""
        with ctx.db.transaction() as session:
            session.execute(update(Artifact).where(Artifact.id == artifact_id).values(stored_name=name))
    _prune_superseded(ctx)
    return len(pending)


_KEEP = Job.spec[("checkpoint", "keep")].as_integer()


def _prune_superseded(ctx: ServiceContext) -> None:
    """Drop from the store the checkpoints of live jobs that ``checkpoint.keep`` newer ones
    replace (a cluster attempt commits every checkpoint it writes; the store keeps what the
    run folder would). Their rows stay, with no stored copy."""
    with ctx.db.transaction() as session:
        rows = session.execute(
            select(
                Artifact.id,
                Artifact.job_id,
                Artifact.stored_name,
                Job.project,
                Job.spec["checkpoint"]["keep"],
            )
            .join(Job, Job.id == Artifact.job_id)
            .where(
                Artifact.kind == "checkpoint", Artifact.stored_name.is_not(None), Artifact.stored_name != ""
            )
            .where(Job.state.in_([JobState.QUEUED, JobState.RUNNING]))
            .order_by(Artifact.job_id, Artifact.step.desc())
        ).all()
    kept: dict[str, int] = {}
    for artifact_id, job_id, stored_name, project, keep in rows:
        kept[job_id] = kept.get(job_id, 0) + 1
        if kept[job_id] <= max(1, int(keep or 1)):
            continue
        with contextlib.suppress(NotFound):  # deleted by hand meanwhile
            storage.delete(ctx, stored_name, project=project)
        with ctx.db.transaction() as session:
            session.execute(update(Artifact).where(Artifact.id == artifact_id).values(stored_name=""))


def record_checkpoint(
    session: Session, job: Job, path: Path, step: int, written: list[dict[str, Any]] | None = None
) -> bool:
    """Record a complete checkpoint of the job, once (the next pass commits it to the store);
    ``written``: the records of its files, which its nodes wrote into the store themselves.
    Whether an earlier transaction had recorded it already."""
    known = session.scalar(
        select(Artifact.id).where(
            Artifact.job_id == job.id, Artifact.kind == "checkpoint", Artifact.path == str(path)
        )
    )
    if known is not None:
        return True
    if written is None and is_stored_only(path):
        return False  # its records were lost with a pass that died: the next checkpoint replaces it
    size = _size(path) if written is None else sum(record["size_bytes"] for record in written)
    session.add(
        Artifact(
            job_id=job.id, kind="checkpoint", path=str(path), step=step, size_bytes=size, written=written
        )
    )
    return False


def keep_stored_only(checkpoints: Path, stored: StoredCheckpoint) -> Path:
    """The agent's record of a checkpoint whose nodes stored it: its folder in the run folder
    with its ``checkpoint.json`` and the stored-only marker (no shard), named the newest, so that
    the job's resume, ``--resume`` and the checks of a later submit find it as any checkpoint."""
    folder = checkpoints / stored.name
    if not folder.is_dir():
        staging = checkpoints / f".{stored.name}.stored"
        staging.mkdir(parents=True, exist_ok=True)
        if stored.description is not None:
            (staging / CHECKPOINT_MARKER).write_text(stored.description)
        total = sum(record["size_bytes"] for record in stored.files)
        (staging / STORED_ONLY_MARKER).write_text(
            f"{len(stored.files)} files, {total} bytes in the artifact store\n"
        )
        os.replace(staging, folder)
    write_text_atomic(checkpoints / CHECKPOINT_POINTER, stored.name)
    return folder


def register_outputs(
    ctx: ServiceContext,
    session: Session,
    job: Job,
    result: AttemptResult,
    export_written: list[dict[str, Any]] | None = None,
) -> None:
    """Record the final checkpoint and export, and publish the export as a new model version.
    ``export_written``: the records of the export's files, which its node stored itself."""
    if result.checkpoint:
        record_checkpoint(session, job, Path(result.checkpoint), result.step)
    if not result.export_dir:
        return
    export = Artifact(
        job_id=job.id,
        kind="export",
        path=result.export_dir,
        step=result.step,
        size_bytes=_size(Path(result.export_dir))
        if export_written is None
        else sum(record["size_bytes"] for record in export_written),
        lineage=result.lineage or None,
        written=export_written,
    )
    session.add(export)
    session.flush()
    if _may_publish(session, job):
        models.publish(ctx, session, job, export, job.name, result.summary)
    else:
        job.message = (
            f"export kept at {result.export_dir}; {job.owner} may not publish models in {job.project}, "
            f"a maintainer can: shipyard models register {job.id}"
        )


def _may_publish(session: Session, job: Job) -> bool:
    """Whether the job's owner may publish model versions in its project: then its export is
    published as it finishes. The embedded platform's local user is the home's admin."""
    owner = job.owner or ""
    if owner.startswith(LOCAL_PREFIX):
        return True
    user = session.get(User, owner)
    actor = audit.Actor(name=owner, source="agent", is_admin=bool(user and user.is_admin))
    return rbac.allowed(session, actor, Permission.MODEL_PUBLISH, job.project)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
