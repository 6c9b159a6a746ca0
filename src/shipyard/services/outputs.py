"""What happens to an attempt's outputs: its checkpoints recorded for the next attempt, its export
registered as a model version, and both copied into the artifact store."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from shipyard import audit
from shipyard.auth import Permission
from shipyard.db import Artifact, Job, User
from shipyard.errors import Conflict, NotFound, ShipyardError
from shipyard.schemas.launch import AttemptResult
from shipyard.services import models, rbac, storage
from shipyard.services.context import LOCAL_PREFIX, ServiceContext

_log = logging.getLogger("shipyard.agent")


def commit_outputs(ctx: ServiceContext, at_most: int = 4) -> None:
    """Copy finished checkpoints and exports into the artifact store (outside the pass's
    transaction: writing gigabytes must not hold the database). A relaunch on another node, and
    every model download, then read them from there."""
    with ctx.db.transaction() as session:
        pending = session.execute(
            select(Artifact.id, Artifact.path, Artifact.kind, Artifact.step, Job.id, Job.project, Job.owner)
            .join(Job, Job.id == Artifact.job_id)
            .where(Artifact.stored_name.is_(None))
            .order_by(Artifact.id)
            .limit(at_most)
        ).all()
    for artifact_id, path, kind, step, job_id, project, owner in pending:
        name = f"jobs/{job_id}/{kind}/step-{step}"
        try:
            storage.put(ctx, Path(path), name, project=project, owner=owner)
        except Conflict:
            pass  # committed by an earlier pass that died before recording it
        except NotFound:
            name = ""  # pruned before it could be committed; nothing to retry
        except ShipyardError as exc:  # a full or unreachable store: the job's outcome stands
            _log.warning("could not commit %s to the artifact store: %s", path, exc)
            name = ""
        with ctx.db.transaction() as session:
            session.execute(update(Artifact).where(Artifact.id == artifact_id).values(stored_name=name))


def record_checkpoint(session: Session, job: Job, result: AttemptResult) -> None:
    assert result.checkpoint is not None
    session.add(
        Artifact(
            job_id=job.id,
            kind="checkpoint",
            path=result.checkpoint,
            step=result.step,
            size_bytes=_size(Path(result.checkpoint)),
        )
    )


def register_outputs(ctx: ServiceContext, session: Session, job: Job, result: AttemptResult) -> None:
    """Record the final checkpoint and export, and publish the export as a new model version."""
    if result.checkpoint:
        record_checkpoint(session, job, result)
    if not result.export_dir:
        return
    export = Artifact(
        job_id=job.id,
        kind="export",
        path=result.export_dir,
        step=result.step,
        size_bytes=_size(Path(result.export_dir)),
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
