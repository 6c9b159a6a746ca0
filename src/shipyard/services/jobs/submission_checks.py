"""Submission checks: everything that can be known before a job is queued — permission, paths
inside the project's data roots, data, model, fit on the executor's nodes, resume point."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from shipyard.auth import Permission
from shipyard.db import Job
from shipyard.domain.text import has_control_character
from shipyard.errors import DatasetError, InvalidSpec, NotFound, Unschedulable
from shipyard.executors.base import Request, capacity_of
from shipyard.hardware.catalog import Catalog
from shipyard.schemas.dataset_files import check_data, files_of
from shipyard.schemas.documents import shown
from shipyard.schemas.estimate import Estimate
from shipyard.schemas.jobspec import JobSpec
from shipyard.schemas.launch import (
    CHECKPOINT_DIR,
    CHECKPOINT_POINTER,
    checkpoint_description,
    is_checkpoint,
    latest_checkpoint,
)
from shipyard.schemas.layout import tp_degrees
from shipyard.schemas.presets import PRESETS
from shipyard.schemas.records import check_records
from shipyard.schemas.spec_base import MAX_PATH
from shipyard.services.accounts import rbac
from shipyard.services.context import ServiceContext
from shipyard.services.estimates.calibrate import cluster_calibration
from shipyard.services.estimates.estimates import estimate_job, job_arch, on_shipyard_llama
from shipyard.services.estimates.measurements import with_measurements
from shipyard.services.estimates.planning import hardware_catalog
from shipyard.services.models import sources as model_sources
from shipyard.services.models.base_models import check_base_model, check_resume_base
from shipyard.services.storage import data_roots, storage


@dataclass(frozen=True, slots=True)
class Checked:
    """A submission that passed every check, ready to be written."""

    ctx: ServiceContext
    spec: JobSpec
    request: Request
    estimate: Estimate | None
    resume_from: Path | None
    idempotency_key: str | None = None
    """The client's name for this submission: the job keeps it, and the same key again finds it."""
    warnings: tuple[str, ...] = ()
    """What the spec allows but probably does not mean, said in the answer to the submission."""


def check_submission(ctx: ServiceContext, spec: JobSpec, resume: bool, resume_from: str | None) -> Checked:
    """Every check a submission must pass: permission, paths inside the project's data roots,
    data, model, fit on this node, resume point. The permission and the roots come first, so
    that no answer about a path reaches a caller who may not read it."""
    with ctx.db.read() as session:
        rbac.require(ctx, session, Permission.JOB_SUBMIT, f"project/{spec.project}", spec.project)
        spec = model_sources.pinned(ctx, session, spec)
        data_roots.confine(ctx, spec)
        check_data(spec.data)  # missing, empty or binary dataset: fail now, not in the job's log
        if spec.data.format != "text":  # every instruction or chat record, a bad one by its line
            check_records(spec.data, files_of(spec.data))
        for name in spec.data.stored():  # present, readable by the submitter, not empty
            if storage.stat(ctx, name, spec.project).size_bytes == 0:
                raise DatasetError(f"dataset store:{name} is empty", hint="store text or JSONL files in it")
        catalog = hardware_catalog(ctx.settings)
        local = model_sources.local(ctx, session, spec, spec.project).spec  # the base model, here
        _check_model(local, catalog)
        smallest = spec.sized(*spec.elastic_layouts[0])  # an elastic job must fit at its smallest
        request = Request.of(smallest.resources)
        unplaceable = ctx.inventory.check_feasible(request)
        if unplaceable is not None:
            nodes = ctx.inventory.nodes()
            if request.nodes > 1 and len(nodes) == 1:  # a cluster's own reason names its nodes
                raise Unschedulable(
                    f"job {spec.name!r} asks for resources.nodes: {request.nodes}, and this platform "
                    "has 1 node",
                    hint="lower resources.nodes, or join machines into a Ray cluster: `shipyard node "
                    "start --head` on one, `shipyard node start --address HEAD:6380` on each other "
                    "(docs/operations.md: Two machines (and more))",
                )
            inventory = ", ".join(f"{k}: {v}" for k, v in capacity_of(nodes).items())
            where = "this node" if len(nodes) == 1 else f"these {len(nodes)} nodes"
            raise Unschedulable(
                f"job {spec.name!r} can never run on {where}: {unplaceable.message}",
                hint=f"{where} {'has' if len(nodes) == 1 else 'have'} {inventory} in all (cpu counts "
                "cores); lower resources.devices, resources.nodes or resources.min_memory_gib, or "
                "list an accelerator type they have in resources.accelerator",
            )
        smallest.training.grad_accum_steps(request.devices * request.nodes)
        planned = estimate_job(local, ctx.inventory.nodes(), catalog, cluster_calibration(session))
        estimate = with_measurements(session, local, planned)
        checkpoint = _resume_point(ctx, session, spec, resume, resume_from)
        if checkpoint is not None:
            check_resume_base(local, checkpoint)
            check_resume_shape(local, checkpoint)
    return Checked(
        ctx,
        spec,
        request,
        estimate,
        checkpoint,
        warnings=recovery_warnings(spec, estimate.step_time_s if estimate else 0.0),
    )


def recovery_warnings(spec: JobSpec, planned_step_s: float) -> tuple[str, ...]:
    """A checkpoint interval longer than the run (a failure restarts from step 0), a startup
    grace shorter than the planned step (its first step could be taken for a hang)."""
    warnings = []
    steps, interval = spec.training.total_steps, spec.checkpoint.interval
    if interval > steps:
        warnings.append(
            f"checkpoint.interval ({interval}) is longer than the run ({steps} steps): nothing is "
            "checkpointed before the end, so a failure restarts from step 0; give a smaller interval"
        )
    step_s, grace = planned_step_s, spec.restarts.startup_grace_s
    if spec.restarts.on and step_s > grace:
        warnings.append(
            f"restarts.startup_grace_s ({grace:g}s) is shorter than one step as planned ({step_s:.0f}s): "
            "the first step could be taken for a hang; raise it above the step time"
        )
    return tuple(warnings)


def _check_model(spec: JobSpec, catalog: Catalog) -> None:
    _check_tensor_parallel(spec)
    if spec.model.path:
        check_base_model(spec, catalog)
        return
    arch = PRESETS[spec.model.preset or ""]
    if spec.training.seq_len > arch.max_seq_len:
        raise InvalidSpec(
            f"training.seq_len {spec.training.seq_len} exceeds the max_seq_len {arch.max_seq_len} "
            f"of {spec.model.preset}",
            hint=f"set training.seq_len to at most {arch.max_seq_len}",
        )


def _check_tensor_parallel(spec: JobSpec) -> None:
    """A tensor-parallel degree splits the attention and key/value heads, and the devices of a
    node, evenly; and it splits Shipyard's own LLaMA only."""
    tp = spec.training.parallelism.tp
    if tp is None or tp == 1:
        return
    if not on_shipyard_llama(spec):
        raise InvalidSpec(
            f"training.parallelism.tp {tp}: tensor parallelism splits Shipyard's LLaMA (presets, and "
            "full fine-tuning of plain LLaMA folders); this job trains through transformers",
            hint="give tp: 1 and shard the model with dp_shard (FSDP2) instead",
        )
    arch = job_arch(spec)
    valid = tp_degrees(arch.n_heads, arch.n_kv_heads, spec.resources.devices)
    if tp not in valid:
        raise InvalidSpec(
            f"training.parallelism.tp {tp} does not split the model's {arch.n_heads} attention heads, "
            f"{arch.n_kv_heads} key/value heads and the {spec.resources.devices} devices of a node evenly",
            hint=f"valid tp: {', '.join(map(str, valid))}",
        )


def _resume_point(
    ctx: ServiceContext, session: Session, spec: JobSpec, resume: bool, resume_from: str | None
) -> Path | None:
    if resume and resume_from:
        raise InvalidSpec(
            "--resume and --resume-from were both given: they name different checkpoints",
            hint=f"--resume for the newest checkpoint of the last job named {spec.name!r}, or "
            "--resume-from JOB_ID|FOLDER for that one",
        )
    if resume_from:
        path = _resume_source(ctx, session, spec, resume_from)
        # A checkpoints folder means its newest checkpoint; anything else is one checkpoint.
        is_folder = path.name == CHECKPOINT_DIR or (path / CHECKPOINT_POINTER).exists()
        found = latest_checkpoint(path) if is_folder else path
        if found is None or not is_checkpoint(found):
            raise NotFound(f"no checkpoint at {path}", hint="resume from a job that saved a checkpoint")
        return found
    if not resume:
        return None
    earlier = session.scalars(
        select(Job)
        .where(Job.name == spec.name, Job.project == spec.project)
        .order_by(Job.submitted_at.desc())
    )
    for job in earlier:
        found = latest_checkpoint(Path(job.run_dir) / CHECKPOINT_DIR)
        if found is not None:
            return found
    raise NotFound(
        f"--resume: no earlier job named {spec.name!r} in project {spec.project!r} left a checkpoint",
        hint="submit without --resume to start from scratch",
    )


def _resume_source(ctx: ServiceContext, session: Session, spec: JobSpec, resume_from: str) -> Path:
    """``--resume-from``: a checkpoint folder, or the id of a job whose checkpoints the caller
    may read. Through the server, a folder must lie inside the project's data roots and anything
    without a slash is a job id: a job's run folder is the platform's, not the caller's."""
    if has_control_character(resume_from) or len(resume_from) > MAX_PATH:
        raise InvalidSpec(
            f"--resume-from {shown(resume_from)} is neither a path nor a job id",
            hint="give a job id from `shipyard jobs list` or a checkpoint directory",
        )
    roots = data_roots.roots_for(ctx, spec.project)
    looks_like_path = "/" in resume_from or resume_from.startswith((".", "~"))
    if roots is not None and looks_like_path:
        data_roots.require_inside(ctx, roots, spec.project, "--resume-from", resume_from)
    if roots is None or looks_like_path:
        path = Path(resume_from).expanduser() if roots is None else Path(resume_from)
        if path.exists() or roots is not None:
            return path
    job = session.get(Job, resume_from)
    missing = NotFound(
        f"--resume-from {resume_from!r} is neither a checkpoint path nor a job id",
        hint="give a job id from `shipyard jobs list` or a checkpoint directory",
    )
    if job is None:
        raise missing
    # A job's checkpoints are its weights: reading them takes what downloading them would, in
    # the job's own project (a viewer who may see the job may not train on its weights).
    rbac.require_visible(
        ctx, session, Permission.JOB_CHECKPOINTS, f"job/{job.id}", job.project,
        seen_with=Permission.JOB_READ, missing=missing,
    )  # fmt: skip
    return Path(job.run_dir) / CHECKPOINT_DIR


def check_resume_shape(spec: JobSpec, checkpoint: Path) -> None:
    """A checkpoint reshards onto any device count and parallelism, but only onto the model and
    the fine-tuning method that wrote it: another shape, or adapters where full weights were
    trained (or the other way round), has nothing to read its tensors into."""
    written = checkpoint_description(checkpoint)
    if not written.get("model"):
        return  # an earlier Shipyard's checkpoint: the runtime checks it as it loads
    arch = job_arch(spec)
    now = {
        "dim": arch.dim,
        "n_layers": arch.n_layers,
        "n_heads": arch.n_heads,
        "n_kv_heads": arch.n_kv_heads,
        "ffn_dim": arch.ffn_dim,
    }
    differ = [f"{k} {written['model'].get(k)} -> {v}" for k, v in now.items() if written["model"].get(k) != v]
    adapters = spec.adapters
    if bool(written.get("adapters_only")) != adapters:
        what = {True: "adapters", False: "every weight"}
        differ.append(f"trained {what[bool(written.get('adapters_only'))]} -> {what[adapters]}")
    elif adapters and spec.finetune and written.get("lora", {}).get("rank") != spec.finetune.lora.rank:
        differ.append(
            f"finetune.lora.rank {written.get('lora', {}).get('rank')} -> {spec.finetune.lora.rank}"
        )
    if differ:
        raise InvalidSpec(
            f"checkpoint {checkpoint} cannot be resharded onto this job: {'; '.join(differ)}",
            hint="resume onto the model and fine-tuning method that wrote it (any device count and "
            "parallelism work), or submit without --resume",
        )
