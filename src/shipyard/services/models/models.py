"""Model versions: the exports of finished jobs, by name and version."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shipyard import audit, registry
from shipyard.auth import Permission
from shipyard.db import Artifact, Job, Metric, ModelVersion
from shipyard.domain import JobState
from shipyard.domain.text import has_control_character
from shipyard.errors import Conflict, ExecutorError, InvalidSpec, NotFound
from shipyard.schemas.documents import shown
from shipyard.schemas.estimate import Estimate
from shipyard.schemas.views import Completion, ModelComparisonView, ModelLineageView, ModelVersionView
from shipyard.services.accounts import rbac
from shipyard.services.context import ServiceContext
from shipyard.services.jobs.access import allowed_job
from shipyard.services.jobs.summaries import summarize
from shipyard.services.storage import catalog, storage


@dataclass(frozen=True, slots=True)
class ModelRef:
    """``[PROJECT/]NAME[:VERSION]``: a project's model, its newest version when none is named."""

    project: str | None
    name: str
    version: str

    @classmethod
    def parse(cls, ref: str) -> ModelRef:
        project, _, rest = ref.rpartition("/")
        name, _, version = rest.partition(":")
        return cls(project or None, name, version)


def list_versions(
    ctx: ServiceContext, name: str | None = None, project: str | None = None, *, job_id: str | None = None
) -> list[ModelVersionView]:
    """The versions of the models the caller may see (every role of a project reads its models);
    ``job_id``: those that job published."""
    with ctx.db.transaction() as session:
        visible = rbac.visible_projects(session, ctx.actor)
        return [registry.view(v) for v in registry.versions(session, name, visible, project, job_id)]


def register(ctx: ServiceContext, job_id: str, name: str | None = None) -> ModelVersionView:
    """Publish the export of a finished job as the next version of its project's model ``name``
    (default: the job's name), with the job's lineage; maintainers and owners of the project."""
    with ctx.db.transaction() as session:
        job = allowed_job(ctx, session, job_id, Permission.JOB_READ)
        ref = ModelRef.parse(name or job.name)
        if ref.version or ref.project not in (None, job.project):
            raise InvalidSpec(
                f"job {job_id} is in project {job.project!r}: its export becomes a version of a model "
                f"of that project, not {name!r}",
                hint=f"give a model name alone, e.g. {job.name}",
            )
        name = ref.name
        rbac.require(ctx, session, Permission.MODEL_PUBLISH, f"model/{job.project}/{name}", job.project)
        export = session.scalar(
            select(Artifact)
            .where(Artifact.job_id == job.id, Artifact.kind == "export")
            .order_by(Artifact.step.desc())
            .limit(1)
        )
        if job.state != JobState.SUCCEEDED or export is None:
            raise Conflict(
                f"job {job_id} left no export to register (it is {job.state})",
                hint="register a job that succeeded with training.export on",
            )
        already = registry.version_of(session, job.project, name, export)
        if already is not None:
            label = f"{job.project}/{name}:{already}"
            raise Conflict(f"job {job_id}'s export is already {label}", hint=f"use {label}")
        metrics = list(session.scalars(select(Metric).where(Metric.job_id == job.id).order_by(Metric.id)))
        return registry.view(publish(ctx, session, job, export, name, summarize(job, metrics)))


def publish(
    ctx: ServiceContext, session: Session, job: Job, export: Artifact, name: str, metrics: dict[str, float]
) -> ModelVersion:
    """Add the next version of ``name`` from ``export``, audited as ``model.publish`` (the caller
    has checked the permission)."""
    version = registry.add(session, job, export, name, metrics)
    audit.append(
        session,
        ctx.audit_key,
        ctx.actor,
        "model.publish",
        f"model/{registry.label(version)}",
        detail={"job": job.id, "project": job.project, "step": export.step},
    )
    return version


def resolve(ctx: ServiceContext, ref: str) -> tuple[str, Path]:
    """``NAME`` (newest version), ``NAME:VERSION`` or a model folder -> (label, folder)."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return str(path), path
    with ctx.db.transaction() as session:
        found, label = allowed_version(ctx, session, ref, Permission.MODEL_DOWNLOAD)
        return label, export_folder(ctx, session, found)


def export_folder(ctx: ServiceContext, session: Session, version: ModelVersion) -> Path:
    """The version's export: the job's folder on this node, else a copy fetched (once, verified)
    from the artifact store into the cache."""
    artifact = version.artifact
    folder = Path(artifact.path)
    if folder.is_dir() or not (artifact.stored_name or artifact.written):
        return folder
    cached = ctx.settings.cache_dir / "models" / version.job_id / f"step-{version.step}"
    if cached.is_dir():
        return cached
    if artifact.stored_name:
        storage.get(ctx, artifact.stored_name, cached, project=version.project, session=session)
    else:  # its node stored it a moment ago; the catalog commits it at the end of the pass
        files = storage.handed(ctx, artifact.written or [])
        storage.transfer_for(ctx, version.project).read(files, cached)
    return cached


MAX_PROMPT_BYTES = 64 << 10
"""A prompt travels on the sampler's command line, which the kernel caps (ARG_MAX)."""


def generate(
    ctx: ServiceContext,
    ref: str,
    prompt: str,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.8,
    top_k: int = 50,
    seed: int = 0,
) -> Completion:
    """Sample a completion in a child process (the runtime, which holds torch)."""
    for flag, value, low, high in (
        ("--max-new-tokens", max_new_tokens, 1, 1 << 16),
        ("--temperature", temperature, 0, 100),
        ("--top-k", top_k, 0, 1 << 20),
        ("--seed", seed, 0, 2**32 - 1),
        ("the prompt's length", len(prompt.encode()), 0, MAX_PROMPT_BYTES),
    ):
        if not low <= value <= high:  # NaN fails too
            raise InvalidSpec(
                f"{flag} must be {low} to {high:,}, got {value}", hint=f"give {flag} in that range"
            )
    label, folder = resolve(ctx, ref)
    if not (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
        raise NotFound(
            f"{folder} holds no model (no config.json or adapter_config.json)",
            hint="give a model folder or NAME[:VERSION]",
        )
    command = [
        sys.executable,
        "-m",
        "shipyard.training.generate",
        str(folder),
        "--prompt",
        prompt,
        "--max-new-tokens",
        str(max_new_tokens),
        "--temperature",
        str(temperature),
        "--top-k",
        str(top_k),
        "--seed",
        str(seed),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise ExecutorError(
            f"sampling from {label} failed: {done.stderr.strip()[-500:] or 'no output'}",
            hint="check that the training extra is installed (pip install 'shipyard[train]')",
        ) from None
    if "error" in answer:
        raise InvalidSpec(answer["error"], hint=answer.get("hint"))
    return Completion(model=label, prompt=prompt, completion=answer["completion"], tokens=answer["tokens"])


def lineage(ctx: ServiceContext, ref: str, *, project: str | None = None) -> ModelLineageView:
    """Where a version comes from: its job and attempts, dataset (with its content digest when
    stored), base model, checkpoint step, and the planner's estimate beside what was measured."""
    with ctx.db.transaction() as session:
        found, label = allowed_version(ctx, session, ref, Permission.MODEL_READ, project=project)
        job = session.get(Job, found.job_id)
        assert job is not None
        spec = job.spec
        last = job.attempts[-1] if job.attempts else None
        origin = found.artifact.lineage or {}
        return ModelLineageView(
            model=label,
            project=found.project,
            stage=found.stage,
            created_at=found.created_at.isoformat(),
            job=job.id,
            owner=job.owner,
            attempts=len(job.attempts),
            accelerator_type=last.accelerator_type if last else None,
            checkpoint_step=found.step,
            base_model=next(
                filter(None, (spec.get("model", {}).get(k) for k in ("path", "version", "preset"))), None
            ),
            base_model_digest=origin.get("base_digest"),
            method=origin.get("method"),
            adapter=origin.get("adapter"),
            dataset_digest=origin.get("dataset_digest"),
            dataset=[
                catalog.dataset_lineage(
                    session, job.project, p, [a.inputs[p] for a in job.attempts if a.inputs and p in a.inputs]
                )
                for p in spec.get("data", {}).get("paths", [])
            ],
            stored_as=found.artifact.stored_name or None,
            metrics=found.metrics,
            estimate=Estimate.stored(job.estimate),
        )


def compare(
    ctx: ServiceContext, first: str, second: str, *, project: str | None = None
) -> ModelComparisonView:
    """Two versions' lineage side by side, with the fields that differ."""
    a, b = lineage(ctx, first, project=project), lineage(ctx, second, project=project)
    return compared(a, b)


def compared(a: ModelLineageView, b: ModelLineageView) -> ModelComparisonView:
    """The fields in which two lineages differ (the model's name and creation time aside)."""
    flat_a, flat_b = flatten(a.model_dump(mode="json")), flatten(b.model_dump(mode="json"))
    differing = {
        key: [flat_a.get(key), flat_b.get(key)]
        for key in sorted(flat_a.keys() | flat_b.keys())
        if flat_a.get(key) != flat_b.get(key) and key not in ("model", "created_at")
    }
    return ModelComparisonView(a=a, b=b, differences=differing)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts and lists as one level of dotted keys (``metrics.eval_loss``, ``dataset.0.path``)."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flatten(item, f"{prefix}{key}.").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in flatten(item, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): value}


def allowed_version(
    ctx: ServiceContext, session: Session, ref: str, permission: Permission, *, project: str | None = None
) -> tuple[ModelVersion, str]:
    """The version ``[PROJECT/]NAME[:VERSION]`` names, if the caller holds ``permission`` on its
    project -> (version, ``PROJECT/NAME:VERSION``). Without a project named (in ``ref`` or as
    ``project``), the name is looked up in the projects the caller may see, and must be in one.
    A model of a project the caller may not see is answered as one that does not exist."""
    wanted = ModelRef.parse(ref)
    project = _project_of(ctx, session, wanted, wanted.project or project)
    found = registry.find(session, project, wanted.name, wanted.version)
    label = registry.label(found)
    missing = registry.missing(wanted.name, wanted.version, project)  # what ``find`` says of none
    rbac.require_visible(
        ctx, session, permission, f"model/{label}", project, seen_with=Permission.MODEL_READ, missing=missing
    )
    return found, label


def project_of(ctx: ServiceContext, name: str, project: str | None) -> str:
    """The project of the model ``name`` that the caller means: ``project``, else the one project
    the caller may see that has such a model."""
    with ctx.db.read() as session:
        return _project_of(ctx, session, ModelRef(project, name, ""), project)


def _project_of(ctx: ServiceContext, session: Session, wanted: ModelRef, project: str | None) -> str:
    if project is not None:
        return project
    candidates = registry.projects_with(session, wanted.name, rbac.visible_projects(session, ctx.actor))
    if not candidates:
        raise registry.missing(wanted.name, wanted.version)
    if len(candidates) > 1:
        raise Conflict(
            f"model {wanted.name!r} is a model of several projects you can see: {', '.join(candidates)}",
            hint=f"name the project, e.g. {candidates[0]}/{wanted.name}",
        )
    return candidates[0]


def promote(ctx: ServiceContext, ref: str, stage: str, *, project: str | None = None) -> ModelVersionView:
    """Move a version to a stage; one version of a name is in production at a time (the one there
    before goes to archived)."""
    if stage not in registry.STAGES:  # before the permission: a typo is not a refusal to audit
        raise InvalidSpec(f"unknown stage {stage!r}", hint=f"use one of: {', '.join(registry.STAGES)}")
    with ctx.db.transaction() as session:
        found, label = allowed_version(ctx, session, ref, Permission.MODEL_PROMOTE, project=project)
        previous = registry.move(session, found, stage)
        audit.append(
            session,
            ctx.audit_key,
            ctx.actor,
            "model.promote",
            f"model/{label}",
            detail={"from": previous, "to": stage},
        )
        return registry.view(found)


def download(ctx: ServiceContext, ref: str, file: str, *, project: str | None = None) -> Path:
    """One file of a version's export, for streaming; permission-checked and audited."""
    if file.startswith("/") or ".." in file.split("/") or has_control_character(file) or len(file) > 4096:
        raise InvalidSpec(
            f"{shown(file)} is not a file of a model", hint="give a path inside the model, e.g. config.json"
        )
    with ctx.db.transaction() as session:
        found, label = allowed_version(ctx, session, ref, Permission.MODEL_DOWNLOAD, project=project)
        folder = export_folder(ctx, session, found).resolve()
        path = (folder / file).resolve()
        if folder not in path.parents or not path.is_file():
            raise NotFound(
                f"model {label} has no file {file!r}", hint=f"its files: {', '.join(files(folder))}"
            )
        audit.append(
            session,
            ctx.audit_key,
            ctx.actor,
            "model.download",
            f"model/{label}",
            detail={"file": file, "bytes": path.stat().st_size},
        )
        return path


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def delete(ctx: ServiceContext, ref: str, *, project: str | None = None) -> None:
    """Forget a version (its files stay with the job that made them). Retention: a version in
    production must be archived first."""
    if not ModelRef.parse(ref).version:
        raise InvalidSpec(
            "delete names one version: [PROJECT/]NAME:VERSION", hint="e.g. research/quickstart:2"
        )
    with ctx.db.transaction() as session:
        found, label = allowed_version(ctx, session, ref, Permission.MODEL_DELETE, project=project)
        if found.stage == "production":
            raise Conflict(
                f"model {label} is in production", hint=f"promote another version or archive {label} first"
            )
        session.delete(found)
        audit.append(session, ctx.audit_key, ctx.actor, "model.delete", f"model/{label}")
