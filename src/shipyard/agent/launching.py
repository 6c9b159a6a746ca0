"""Launching a leased job's next attempt: its launch plan (data fetched from the store, the
checkpoint to resume from, the data roots it may read), then the executor's launch."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from shipyard import audit
from shipyard.db import Artifact, Attempt, Job
from shipyard.domain import ExitReason, JobState
from shipyard.errors import LaunchFailed, StorageError
from shipyard.executors.base import Placement, StoreAccess, StoredInput
from shipyard.scheduling.status import Reason
from shipyard.schemas.estimate import Estimate
from shipyard.schemas.jobspec import STORE_SCHEME, JobSpec, stored_job_spec, validate_job_spec
from shipyard.schemas.launch import (
    CHECKPOINT_DIR,
    EXIT_FILE,
    HEARTBEAT_DIR,
    METRICS_FILE,
    RESULT_FILE,
    LaunchPlan,
    is_stored_only,
    latest_checkpoint,
)
from shipyard.services.context import ServiceContext
from shipyard.services.estimates.estimates import planned_layout
from shipyard.services.models import sources as model_sources
from shipyard.services.storage import data_roots, storage

LAUNCH_RETRY_S = 30.0
"""How long a job whose launch failed for a passing cause waits before it is tried again."""


def _with_fetched_data(ctx: ServiceContext, job: Job) -> tuple[JobSpec, dict[str, str]]:
    """The job's spec with each ``store:NAME`` dataset replaced by its verified local copy, and
    the content digest of each such dataset (recorded with the attempt, for lineage)."""
    spec = stored_job_spec(job.spec)
    if not spec.data.stored():
        return spec, {}
    session = object_session(job)
    assert session is not None
    document = spec.model_dump(mode="json", by_alias=True)
    paths, inputs = [], {}
    for path in spec.data.paths:
        if path.startswith(STORE_SCHEME):
            name = path.removeprefix(STORE_SCHEME)
            local, inputs[path] = storage.materialize(ctx, name, project=job.project, session=session)
            path = str(local)
        paths.append(path)
    document["data"]["paths"] = paths
    return validate_job_spec(document), inputs


def _fetch_checkpoint(ctx: ServiceContext, session: Session, job: Job, into: Path) -> Path | None:
    """The job's newest checkpoint from the artifact store, when this node has none of its own
    (the job ran elsewhere before)."""
    stored = session.scalars(
        select(Artifact)
        .where(Artifact.job_id == job.id, Artifact.kind == "checkpoint", Artifact.stored_name != "")
        .where(Artifact.stored_name.is_not(None))
        .order_by(Artifact.step.desc())
        .limit(1)
    ).first()
    if stored is None or stored.stored_name is None:
        return None
    target = into / Path(stored.path).name
    if not target.exists():
        storage.get(ctx, stored.stored_name, target, project=job.project, session=session)
    return target


def _with_micro_batch(spec: JobSpec, micro_batch_size: int | None) -> JobSpec:
    """The spec with the micro-batch the restart policy chose after an out-of-memory (the same
    global batch: gradient accumulation grows as the micro-batch shrinks)."""
    if micro_batch_size is None or micro_batch_size == spec.training.micro_batch_size:
        return spec
    training = spec.training.model_copy(update={"micro_batch_size": micro_batch_size})
    return spec.model_copy(update={"training": training})


def _as_launched(spec: JobSpec, estimate: Estimate | None, placed: Placement) -> JobSpec:
    """The spec as this attempt runs it: the planner's layout for the type, and for an elastic
    job the size it was placed at (the planner's layout only at the size it planned for)."""
    if not spec.resources.elastic:
        return planned_layout(spec, estimate, placed.accelerator_type)
    nodes = len(placed.nodes)
    per_node = placed.world_size // nodes
    at_size = spec.sized(nodes, per_node)
    return (
        planned_layout(at_size, estimate, placed.accelerator_type)
        if (nodes, per_node) == (spec.resources.nodes, spec.resources.devices)
        else at_size
    )


@dataclass(frozen=True, slots=True)
class Prepared:
    """An attempt recorded, not yet handed to the engine: what ``start`` needs, outside any
    transaction."""

    job_id: str
    attempt_id: int
    placement: Placement
    run_dir: Path
    log_path: Path
    store: StoreAccess | None = None
    """How its nodes reach the store, where they do not share the agent's folders."""
    from_store: tuple[str, Path] | None = None
    """(project, folder): the checkpoint it resumes from, which only the store holds (a cluster's
    nodes stored it), read back into its folder before the launch."""
    to_store: Path | None = None
    """The checkpoint folder of this machine its nodes resume from (``--resume-from FOLDER``),
    written into the store before the launch."""


def prepare(ctx: ServiceContext, job: Job, placed: Placement, agent_id: str) -> Prepared:
    """Write the attempt's launch plan and record the attempt, under the handle the engine will
    know it by, in the caller's transaction (the claim's): once that commits, an agent that dies
    before the engine answers finds the attempt and asks the engine about it, never launching
    twice nor leaving a process no record names."""
    number = len(job.attempts) + 1
    run_dir = Path(job.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in (RESULT_FILE, EXIT_FILE):  # an earlier attempt's would be read as this one's
        (run_dir / stale).unlink(missing_ok=True)
    shutil.rmtree(run_dir / HEARTBEAT_DIR, ignore_errors=True)  # and its ranks' heartbeats
    session = object_session(job)
    assert session is not None
    resume_from = job.resume_from
    nodes_own_data = not ctx.executor.shares_run_folders
    if number > 1:  # a relaunch continues from the job's own newest checkpoint
        own = latest_checkpoint(run_dir / CHECKPOINT_DIR)
        if own is None and not nodes_own_data:
            own = _fetch_checkpoint(ctx, session, job, run_dir / CHECKPOINT_DIR)
        resume_from = str(own) if own else resume_from
    from_store = to_store = None
    if not nodes_own_data and resume_from is not None and is_stored_only(Path(resume_from)):
        from_store = (job.project, Path(resume_from))  # read back at the launch, not in here
    store = None
    roots = data_roots.roots_of_owner(ctx, job.owner or "", job.project)
    if nodes_own_data:  # its nodes read what it needs from the store and write theirs there
        spec, inputs, fetched = _inputs_for_nodes(ctx, session, job)
        resume = _resume_for_nodes(ctx, session, job, resume_from)
        if isinstance(resume, Path):  # written at the launch, outside this transaction
            to_store, resume = resume, None
        store = StoreAccess(storage.transfer_for(ctx, job.project), resume, fetched)
        resume_from = None  # each node names its own copies
    else:
        spec, inputs = _with_fetched_data(ctx, job)
        model = model_sources.local(ctx, session, spec, job.project)
        spec = model.spec
        if roots is not None:  # and the verified copies of its store: inputs, not the whole cache
            given = job.spec["data"]["paths"]
            roots += [
                Path(local) for local, path in zip(spec.data.paths, given, strict=True) if path != local
            ]
            roots += [model.fetched] if model.fetched else []
    estimate = Estimate.stored(job.estimate)
    spec = _as_launched(_with_micro_batch(spec, job.micro_batch_size), estimate, placed)
    LaunchPlan(
        job_id=job.id,
        attempt=number,
        spec=spec,
        run_dir=str(run_dir),
        cache_dir=str(ctx.settings.cache_dir),
        accelerator_type=placed.accelerator_type,
        torch_device=placed.torch_device,
        world_size=placed.world_size,
        threads_per_process=placed.threads_per_process,
        peak_tflops_bf16=placed.peak_tflops_bf16,
        peak_tflops_fp32=placed.peak_tflops_fp32,
        resume_from=resume_from,
        data_roots=None if roots is None else [str(root.resolve()) for root in roots],
        expected_s=_expected_s(estimate, placed.accelerator_type, spec.training.total_steps),
    ).write(run_dir)
    log_path = run_dir / "logs" / f"attempt-{number}.log"
    metrics = run_dir / METRICS_FILE
    expected = ctx.executor.expected_handle(placed, run_dir)
    attempt = Attempt(
        number=number,
        state=JobState.RUNNING,
        accelerator_type=placed.accelerator_type,
        device_ids=list(placed.device_ids) if placed.accelerator_type != "cpu" else list(placed.core_ids),
        threads_per_process=placed.threads_per_process,
        node=expected.stored_nodes,
        handle=expected.handle,
        agent_id=agent_id,
        log_path=str(log_path),
        metrics_offset=metrics.stat().st_size if metrics.exists() else 0,
        inputs=inputs or None,
        micro_batch_size=spec.training.micro_batch_size,
        world_size=placed.world_size,
    )
    job.attempts.append(attempt)
    job.restart_at = None
    job.started_at = job.started_at or ctx.clock.now()
    session.flush()  # the attempt's id
    return Prepared(job.id, attempt.id, placed, run_dir, log_path, store, from_store, to_store)


def _expected_s(estimate: Estimate | None, accelerator_type: str, steps: int) -> float | None:
    """The planner's time for the whole run on the type (a resumed attempt's is shorter: an
    engine's time limit derived from it errs long)."""
    figures = None if estimate is None else estimate.by_accelerator.get(accelerator_type)
    return figures.step_time_s * steps if figures is not None and figures.step_time_s else None


def _inputs_for_nodes(
    ctx: ServiceContext, session: Session, job: Job
) -> tuple[JobSpec, dict[str, str], dict[str, StoredInput]]:
    """The job's spec as stored (``store:`` references kept), the content digest of each
    ``store:`` dataset (recorded with the attempt, for lineage), and what each node fetches into
    its own cache: those datasets (``data:N``) and the base model (``model``)."""
    spec = stored_job_spec(job.spec)
    inputs, fetched = {}, {}
    for index, path in enumerate(spec.data.paths):
        if path.startswith(STORE_SCHEME):
            name = path.removeprefix(STORE_SCHEME)
            fetched[f"data:{index}"], inputs[path] = storage.node_input(ctx, session, name, job.project)
    model = model_sources.for_nodes(ctx, session, spec, job.project)
    if model is not None:
        fetched["model"] = model
    return spec, inputs, fetched


def _make_whole(ctx: ServiceContext, project: str, folder: Path) -> None:
    """A checkpoint the nodes of a cluster stored, which only the store holds (the home ran on a
    cluster before, and runs on this machine now): its files read back into its folder, each
    verified, the folder swapped in whole, so this machine's runtime resumes from it."""
    with ctx.db.read() as session:
        row = _stored_checkpoint(session, folder)
        written = None if row is None else row.written
    if written is None:
        raise _lost_record(folder)
    try:
        whole = storage.transfer_for(ctx, project).read(
            storage.handed(ctx, written), folder.with_name(f".{folder.name}.whole")
        )
    except (OSError, StorageError) as exc:
        raise LaunchFailed(
            f"checkpoint {folder.name} could not be read back from the artifact store: {exc}",
            hint="`shipyard storage scrub` checks the store; or resume from another checkpoint",
            transient=False,
        ) from exc
    aside = folder.with_name(f".{folder.name}.stored-only")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(folder, aside)
    os.replace(whole, folder)
    shutil.rmtree(aside, ignore_errors=True)


def _stored_checkpoint(session: Session, folder: Path) -> Artifact | None:
    """The record of a checkpoint whose nodes stored it, by its folder (any job's)."""
    return session.scalars(
        select(Artifact).where(
            Artifact.kind == "checkpoint", Artifact.path == str(folder), Artifact.written.is_not(None)
        )
    ).first()


def _lost_record(folder: Path) -> LaunchFailed:
    return LaunchFailed(
        f"checkpoint {folder.name} is in the artifact store but its record was lost",
        hint="resume from another checkpoint of the job (`shipyard jobs show` lists them)",
        transient=False,
    )


def _resume_for_nodes(
    ctx: ServiceContext, session: Session, job: Job, resume_from: str | None
) -> tuple[str, list[dict[str, Any]]] | Path | None:
    """The checkpoint a cluster attempt resumes from, as the records of its files in the store:
    one its nodes stored (this job's, or the job ``--resume`` names), else the newest this job
    stored; a folder of this machine (``--resume-from FOLDER``) as its path, for the launch to
    store (moving a checkpoint's bytes has no place in the scheduling transaction)."""
    newest = (
        select(Artifact)
        .where(Artifact.kind == "checkpoint", Artifact.written.is_not(None))
        .order_by(Artifact.step.desc())
        .limit(1)
    )
    if resume_from is None:
        row = session.scalars(newest.where(Artifact.job_id == job.id)).first()
        return None if row is None else (Path(row.path).name, storage.handed(ctx, row.written or []))
    path = Path(resume_from)
    row = _stored_checkpoint(session, path)
    return path if row is None else (path.name, storage.handed(ctx, row.written or []))


def _stored_for_nodes(prepared: Prepared) -> Prepared:
    """The attempt with the checkpoint folder of this machine that its nodes resume from written
    into the store (``--resume-from FOLDER``)."""
    folder, store = prepared.to_store, prepared.store
    assert folder is not None and store is not None
    if is_stored_only(folder):  # the store has its files, but nothing says which
        raise _lost_record(folder)
    try:
        files = store.mover.write(folder)
    except (OSError, StorageError) as exc:
        raise LaunchFailed(
            f"checkpoint {folder} could not be written into the artifact store: {exc}",
            hint="`shipyard storage scrub` checks the store; the job is tried again",
            transient=isinstance(exc, StorageError),
        ) from exc
    resume = (folder.name, files)
    return dataclasses.replace(prepared, store=dataclasses.replace(store, resume=resume), to_store=None)


def start(ctx: ServiceContext, prepared: Prepared) -> None:
    """Hand the recorded attempt to the engine, outside any transaction (a cluster may take a
    minute to reserve nodes), and record what it answered in a short transaction of its own."""
    crash_point(ctx, "attempt_recorded")
    try:
        if prepared.from_store is not None:
            _make_whole(ctx, *prepared.from_store)
        if prepared.to_store is not None:
            prepared = _stored_for_nodes(prepared)
        launched = ctx.executor.launch(
            prepared.placement, prepared.run_dir, prepared.log_path, store=prepared.store
        )
    except LaunchFailed as exc:
        with ctx.db.transaction() as session:
            attempt = session.get_one(Attempt, prepared.attempt_id)
            job = attempt.job
            session.delete(attempt)  # never started: a reservation, not an attempt
            if exc.transient:  # the job waits, saying why, and the next passes try again
                again = f"{exc.message}; tried again in {LAUNCH_RETRY_S:g}s"
                job.move(JobState.QUEUED, pending_reason=again, pending_code=Reason.UNPLACEABLE)
                job.restart_at = ctx.clock.now() + timedelta(seconds=LAUNCH_RETRY_S)
            else:  # it cannot start at all: say why instead of retrying forever
                job.move(JobState.FAILED, exit_reason=ExitReason.ERROR, message=exc.message, hint=exc.hint)
        return
    crash_point(ctx, "engine_accepted")
    with ctx.db.transaction() as session:
        attempt = session.get_one(Attempt, prepared.attempt_id)
        attempt.pid, attempt.handle, attempt.node = launched.pid, launched.handle, launched.stored_nodes
        audit.append(
            session,
            ctx.audit_key,
            ctx.actor,
            "job.start",
            f"job/{prepared.job_id}",
            detail={
                "attempt": attempt.number,
                "accelerator": attempt.accelerator_type,
                "devices": attempt.device_ids,
                "node": prepared.placement.node,
            },
        )
    crash_point(ctx, "outcome_recorded")


CRASH_ENV = "SHIPYARD_AGENT_CRASH_AT"
"""A fault injected on purpose, as ``$SHIPYARD_FAULTS`` is for the runtime: the agent kills itself
(SIGKILL) the first time it reaches the named point of a launch (``claimed``,
``attempt_recorded``, ``engine_accepted``, ``outcome_recorded``), once per home. How the crash
tests stop it exactly there."""


def crash_point(ctx: ServiceContext, name: str) -> None:
    if os.environ.get(CRASH_ENV) != name:
        return
    marker = ctx.settings.home / f".crashed-at-{name}"
    if not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
