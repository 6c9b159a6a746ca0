"""The model registry: versions of a named model, each the export of one finished job, with a
stage. Numbering and the stage rules live here; who may publish, promote or delete, and the audit
records of it, are the service layer's (``services/models.py``)."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shipyard.db import Artifact, Job, ModelVersion
from shipyard.errors import InvalidSpec, NotFound
from shipyard.schemas.views import ModelVersionView

STAGES = ("none", "staging", "production", "archived")


def versions(session: Session, name: str | None, projects: Collection[str] | None) -> list[ModelVersion]:
    """Every version, newest first per name; only of ``projects`` unless None (all)."""
    query = select(ModelVersion).order_by(ModelVersion.name, ModelVersion.version.desc())
    if projects is not None:
        query = query.where(ModelVersion.project.in_(list(projects)))
    if name:
        query = query.where(ModelVersion.name == name)
    return list(session.scalars(query))


def find(session: Session, name: str, version: str) -> ModelVersion:
    """Version ``version`` of ``name`` (empty: the newest)."""
    query = select(ModelVersion).where(ModelVersion.name == name)
    if version:
        if not version.isdigit():
            raise InvalidSpec(
                f"model version {version!r} is not a number",
                hint="write NAME:VERSION, e.g. quickstart:1",
            )
        query = query.where(ModelVersion.version == int(version))
    found = session.scalars(query.order_by(ModelVersion.version.desc()).limit(1)).first()
    if found is None:
        raise NotFound(
            f"no model version {name}{':' + version if version else ''}",
            hint="`shipyard models list` shows the registered models; or give a model folder",
        )
    return found


def version_of(session: Session, name: str, export: Artifact) -> int | None:
    """The version of ``name`` that ``export`` already is, if any."""
    return session.scalar(
        select(ModelVersion.version).where(ModelVersion.name == name, ModelVersion.artifact_id == export.id)
    )


def add(session: Session, job: Job, export: Artifact, name: str, metrics: dict[str, float]) -> ModelVersion:
    """The next version of ``name``, made from ``export``."""
    latest = session.scalar(select(func.max(ModelVersion.version)).where(ModelVersion.name == name)) or 0
    version = ModelVersion(
        name=name,
        version=latest + 1,
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
    """Put ``version`` in ``stage``; returns the stage it left. One version of a name is in
    production at a time: the one there before goes to archived."""
    if stage not in STAGES:
        raise InvalidSpec(f"unknown stage {stage!r}", hint=f"use one of: {', '.join(STAGES)}")
    if stage == "production":
        for other in session.scalars(
            select(ModelVersion).where(ModelVersion.name == version.name, ModelVersion.stage == "production")
        ):
            other.stage = "archived"
    previous, version.stage = version.stage, stage
    return previous


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
