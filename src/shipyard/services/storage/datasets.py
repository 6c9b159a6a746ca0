"""Datasets: the stored artifacts jobs trained on (``data.paths: [store:NAME]``), each with who
read which content and the model versions that came of it. Metadata, so every role of the
project may read it (``dataset.read``); the bytes themselves need ``artifact.read``."""

from __future__ import annotations

from sqlalchemy import select

from shipyard.auth import PERMISSIONS, Permission
from shipyard.db import Attempt, Job, ModelVersion, StoredArtifact
from shipyard.schemas.jobspec import STORE_SCHEME
from shipyard.schemas.views import DatasetReadView, DatasetView
from shipyard.services.accounts import rbac
from shipyard.services.context import ServiceContext
from shipyard.services.storage import catalog


def list_datasets(ctx: ServiceContext, project: str | None = None) -> list[DatasetView]:
    with ctx.db.transaction() as session:
        readable = None
        if not ctx.actor.is_admin:
            roles = rbac.projects_of(session, ctx.actor).items()
            readable = {p for p, role in roles if Permission.DATASET_READ in PERMISSIONS[role]}
        query = select(Attempt.job_id, Attempt.number, Attempt.inputs, Job.project).join(Job)
        if project is not None:
            query = query.where(Job.project == project)
        reads: dict[tuple[str, str], list[DatasetReadView]] = {}
        for job_id, number, inputs, job_project in session.execute(query.order_by(Attempt.id)):
            if not inputs or (readable is not None and job_project not in readable):
                continue
            for path, digest in inputs.items():
                key = (job_project, path.removeprefix(STORE_SCHEME))
                read = DatasetReadView(job=job_id, attempt=number, digest=digest)
                reads.setdefault(key, []).append(read)
        jobs = {read.job for found in reads.values() for read in found}
        published: dict[str, list[str]] = {}
        for model_project, name, version, job_id in session.execute(
            select(ModelVersion.project, ModelVersion.name, ModelVersion.version, ModelVersion.job_id).where(
                ModelVersion.job_id.in_(jobs)
            )
        ):
            published.setdefault(job_id, []).append(f"{model_project}/{name}:{version}")
        datasets = []
        for (dataset_project, name), found in sorted(reads.items()):
            artifact = session.scalars(
                select(StoredArtifact).where(
                    StoredArtifact.project == dataset_project, StoredArtifact.name == name
                )
            ).first()
            datasets.append(
                DatasetView(
                    project=dataset_project,
                    name=name,
                    digest=catalog.content_digest(artifact) if artifact else None,
                    size_bytes=artifact.size_bytes if artifact else None,
                    read_by=found,
                    models=sorted({m for read in found for m in published.get(read.job, [])}),
                )
            )
        return datasets
