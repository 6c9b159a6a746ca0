"""Model versions: the exports of finished jobs, by name and version."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shipyard import audit, registry
from shipyard.auth import Permission
from shipyard.db import Artifact, Job, Metric, ModelVersion
from shipyard.domain import JobState
from shipyard.errors import Conflict, ExecutorError, InvalidSpec, NotFound
from shipyard.schemas.views import Completion, ModelComparisonView, ModelLineageView, ModelVersionView
from shipyard.services import rbac, storage
from shipyard.services.context import ServiceContext
from shipyard.services.summaries import summarize


def list_versions(ctx: ServiceContext, name: str | None = None) -> list[ModelVersionView]:
    with ctx.db.transaction() as session:
        # model.read: every role of the model's project holds it
        projects = None if ctx.actor.is_admin else rbac.projects_of(session, ctx.actor)
        return [registry.view(v) for v in registry.versions(session, name, projects)]


def register(ctx: ServiceContext, job_id: str, name: str | None = None) -> ModelVersionView:
    """Publish the export of a finished job as the next version of model ``name`` (default: the
    job's name), with the job's lineage; maintainers and owners of the job's project only."""
    with ctx.db.transaction() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}", hint="`shipyard jobs list` shows the jobs")
        name = name or job.name
        rbac.require(ctx, session, Permission.MODEL_PUBLISH, f"model/{name}", job.project)
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
        already = registry.version_of(session, name, export)
        if already is not None:
            raise Conflict(f"job {job_id}'s export is already {name}:{already}", hint=f"use {name}:{already}")
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
        f"model/{name}:{version.version}",
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
    folder = Path(version.artifact.path)
    if folder.is_dir() or not version.artifact.stored_name:
        return folder
    cached = ctx.settings.cache_dir / "models" / version.job_id / f"step-{version.step}"
    if not cached.is_dir():
        storage.get(ctx, version.artifact.stored_name, cached, project=version.project, session=session)
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


def lineage(ctx: ServiceContext, ref: str) -> ModelLineageView:
    """Where a version comes from: its job and attempts, dataset (with its content digest when
    stored), base model, checkpoint step, and the planner's estimate beside what was measured."""
    with ctx.db.transaction() as session:
        found, label = allowed_version(ctx, session, ref, Permission.MODEL_READ)
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
                storage.dataset_lineage(
                    session, job.project, p, [a.inputs[p] for a in job.attempts if a.inputs and p in a.inputs]
                )
                for p in spec.get("data", {}).get("paths", [])
            ],
            stored_as=found.artifact.stored_name or None,
            metrics=found.metrics,
            estimate=job.estimate or {},
        )


def compare(ctx: ServiceContext, first: str, second: str) -> ModelComparisonView:
    """Two versions' lineage side by side, with the fields that differ."""
    a, b = lineage(ctx, first), lineage(ctx, second)
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
    ctx: ServiceContext, session: Session, ref: str, permission: Permission
) -> tuple[ModelVersion, str]:
    """The version ``NAME[:VERSION]`` names, if the caller holds ``permission`` on its project."""
    name, _, number = ref.partition(":")
    found = registry.find(session, name, number)
    label = f"{found.name}:{found.version}"
    rbac.require(ctx, session, permission, f"model/{label}", found.project)
    return found, label


def promote(ctx: ServiceContext, ref: str, stage: str) -> ModelVersionView:
    """Move a version to a stage; one version of a name is in production at a time (the one there
    before goes to archived)."""
    if stage not in registry.STAGES:  # before the permission: a typo is not a refusal to audit
        raise InvalidSpec(f"unknown stage {stage!r}", hint=f"use one of: {', '.join(registry.STAGES)}")
    with ctx.db.transaction() as session:
        found, label = allowed_version(ctx, session, ref, Permission.MODEL_PROMOTE)
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


def download(ctx: ServiceContext, ref: str, file: str) -> Path:
    """One file of a version's export, for streaming; permission-checked and audited."""
    with ctx.db.transaction() as session:
        found, label = allowed_version(ctx, session, ref, Permission.MODEL_DOWNLOAD)
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


def delete(ctx: ServiceContext, ref: str) -> None:
    """Forget a version (its files stay with the job that made them). Retention: a version in
    production must be archived first."""
    if ":" not in ref:
        raise InvalidSpec("delete names one version: NAME:VERSION", hint="e.g. quickstart:2")
    with ctx.db.transaction() as session:
        found, label = allowed_version(ctx, session, ref, Permission.MODEL_DELETE)
        if found.stage == "production":
            raise Conflict(
                f"model {label} is in production", hint=f"promote another version or archive {label} first"
            )
        session.delete(found)
        audit.append(session, ctx.audit_key, ctx.actor, "model.delete", f"model/{label}")
