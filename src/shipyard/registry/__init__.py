"""The model registry: versions of a project's named model, each the export of one finished job,
with a stage. A name is its project's: ``research/shared`` and ``vision/shared`` are two models.
Numbering and the stage rules live here; who may publish, promote or delete, and the audit
records of it, are the service layer's (``services/models/models.py``)."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import func, select
from sqlalchemy.orm import Session, joinedload

from shipyard.db import Artifact, Job, ModelVersion
from shipyard.errors import InvalidSpec, NotFound
from shipyard.schemas.views import ModelVersionView

STAGES = ("none", "staging", "production", "archived")


def versions(
    session: Session,
    name: str | None,
    projects: Collection[str] | None,
    project: str | None = None,
    job_id: str | None = None,
) -> list[ModelVersion]:
    """Every version, by project and name, newest first; only of ``projects`` unless None (all),
    and only of ``project``, ``name`` and the job ``job_id`` published when given. Each with its
    artifact, read in the same query."""
    query = (
        select(ModelVersion)
        .options(joinedload(ModelVersion.artifact))
        .order_by(ModelVersion.project, ModelVersion.name, ModelVersion.version.desc())
    )
    if job_id:
        query = query.where(ModelVersion.job_id == job_id)
    if projects is not None:
        query = query.where(ModelVersion.project.in_(list(projects)))
    if project:
        query = query.where(ModelVersion.project == project)
    if name:
        query = query.where(ModelVersion.name == name)
    return list(session.scalars(query))


def projects_with(session: Session, name: str, projects: Collection[str] | None) -> list[str]:
    """The projects (of ``projects``, or all) that have a model called ``name``."""
    query = select(ModelVersion.project).where(ModelVersion.name == name).distinct()
    if projects is not None:
        query = query.where(ModelVersion.project.in_(list(projects)))
    return sorted(session.scalars(query))


def find(session: Session, project: str, name: str, version: str) -> ModelVersion:
    """Version ``version`` of ``project``'s model ``name`` (empty: the newest)."""
    query = select(ModelVersion).where(ModelVersion.project == project, ModelVersion.name == name)
    if version:
        if not version.isdigit():
            raise InvalidSpec(
                f"model version {version!r} is not a number",
                hint="write [PROJECT/]NAME:VERSION, e.g. research/quickstart:1",
            )
        query = query.where(ModelVersion.version == int(version))
    found = session.scalars(query.order_by(ModelVersion.version.desc()).limit(1)).first()
    if found is None:
        raise missing(name, version, project)
    return found


def missing(name: str, version: str = "", project: str | None = None) -> NotFound:
    """The answer for a model that does not exist, or that the caller may not see: the same."""
    where = f"{project}/" if project else ""
    return NotFound(
        f"no model version {where}{name}{':' + version if version else ''}",
        hint="`shipyard models list` shows the registered models; or give a model folder",
    )


def version_of(session: Session, project: str, name: str, export: Artifact) -> int | None:
    """The version of ``project``'s ``name`` that ``export`` already is, if any."""
    return session.scalar(
        select(ModelVersion.version).where(
            ModelVersion.project == project, ModelVersion.name == name, ModelVersion.artifact_id == export.id
        )
    )


def add(session: Session, job: Job, export: Artifact, name: str, metrics: dict[str, float]) -> ModelVersion:
    """The next version of the job's project's model ``name``, made from ``export``."""
    latest = session.scalar(
        select(func.max(ModelVersion.version)).where(
            ModelVersion.project == job.project, ModelVersion.name == name
        )
    )
    version = ModelVersion(
        name=name,
        version=(latest or 0) + 1,
        project=job.project,
        job_id=job.id,
        artifact_id=export.id,
        step=export.step,
        metrics=metrics,
    )
    session.add(version)
    session.flush()
    return version


def move(session: Session, version: ModelVersion, stage: str) -> str:
    """Put ``version`` in ``stage``; returns the stage it left. One version of a project's model
    is in production at a time: the one there before goes to archived (another project's model
    of the same name is another model, and never moves)."""
    if stage not in STAGES:
        raise InvalidSpec(f"unknown stage {stage!r}", hint=f"use one of: {', '.join(STAGES)}")
    if stage == "production":
        for other in session.scalars(
            select(ModelVersion).where(
                ModelVersion.project == version.project,
                ModelVersion.name == version.name,
                ModelVersion.stage == "production",
            )
        ):
            other.stage = "archived"
    previous, version.stage = version.stage, stage
    return previous


def label(version: ModelVersion) -> str:
    """``PROJECT/NAME:VERSION``: how a version is named wherever it is shown or recorded."""
    return f"{version.project}/{version.name}:{version.version}"


def view(version: ModelVersion) -> ModelVersionView:
    return ModelVersionView(
        name=version.name,
        version=version.version,
        project=version.project,
        job_id=version.job_id,
        step=version.step,
        path=version.artifact.path,
        size_bytes=version.artifact.size_bytes,
        metrics=version.metrics,
        created_at=version.created_at,
        stage=version.stage,
    )
