"""The local agent's use cases: start the queued jobs the scheduler picks, preempt the ones it
drops, watch attempts, copy their metrics, stop cancelled ones, and record how each ended.

``tick`` is one pass; ``shipyard.daemon`` runs it in a loop. Every ``submit`` makes sure one agent
runs per ``$SHIPYARD_HOME`` (a file lock tells), so jobs start without a command of their own.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session, object_session

from shipyard.db import Artifact, Attempt, Job, Metric, User, rows_changed
from shipyard.domain import ExitReason, JobState
from shipyard.errors import Conflict, NotFound, ShipyardError
from shipyard.executors.base import Placement, Request, Unplaceable
from shipyard.schemas.jobspec import STORE_SCHEME, JobSpec, stored_job_spec, validate_job_spec
from shipyard.schemas.launch import (
    CHECKPOINT_DIR,
    METRICS_FILE,
    RESULT_FILE,
    AttemptResult,
    LaunchPlan,
    latest_checkpoint,
)
from shipyard.services import audit, data_roots, models, rbac, storage, telemetry
from shipyard.services.context import LOCAL_PREFIX, ServiceContext
from shipyard.services.scheduler import LiveJob, plan_round
from shipyard.settings import Settings

AGENT_LOCK = "agent.lock"
AGENT_LOG = "agent.log"


_log = logging.getLogger("shipyard.agent")


def utcnow() -> datetime:
    return datetime.now(UTC)


# --- one agent per home ---------------------------------------------------------------------


def is_running(settings: Settings) -> bool:
    """Whether an agent holds this home's lock."""
    path = settings.home / AGENT_LOCK
    if not path.exists():
        return False
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


_SPAWNED: dict[Path, float] = {}
SPAWN_GRACE_S = 15.0
"""An agent takes a few seconds to start and take its lock; a busy server must not start
another one on every submission meanwhile (each costs a Python start on a loaded machine)."""


def ensure_running(settings: Settings) -> None:
    """Start a background agent for this home unless one runs (a second one exits at once)."""
    if is_running(settings):
        return
    now = time.monotonic()
    if now - _SPAWNED.get(settings.home, -SPAWN_GRACE_S) < SPAWN_GRACE_S:
        return
    _SPAWNED[settings.home] = now
    settings.home.mkdir(parents=True, exist_ok=True)
    with open(settings.home / AGENT_LOG, "ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", "shipyard.daemon"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={
                **os.environ,
                "SHIPYARD_HOME": str(settings.home),
                "SHIPYARD_DB_URL": settings.db_url,
            },
            start_new_session=True,
        )


# --- one pass -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pass:
    """What one agent pass saw: whether work remains, and a fingerprint of the jobs' states so
    the agent can poll slowly while nothing changes (a busy poller steals cycles from training)."""

    active: bool
    fingerprint: frozenset[tuple[str, str, bool]]


def tick(ctx: ServiceContext, agent_id: str) -> Pass:
    """One pass of the agent over every queued and running job."""
    started = time.perf_counter()
    with ctx.db.transaction() as session:
        for attempt in _running(session):
            _ingest_metrics(session, attempt)
            _finish_if_exited(ctx, session, attempt)
        for attempt in _running(session):
            _stop_if_cancelled(ctx, attempt)
        scheduling = time.perf_counter()
        live = _admit(ctx, session, agent_id)
        done = time.perf_counter()
    telemetry.record_pass(ctx, agent_id, pass_s=done - started, schedule_s=done - scheduling)
    _commit_outputs(ctx)
    # The jobs as this pass's scheduling read them: a job it launched shows as running from the
    # next pass on, which then polls fast once more.
    seen = frozenset((j.id, j.state, j.cancel_requested) for j in live.values())
    return Pass(active=bool(live), fingerprint=seen)


def _commit_outputs(ctx: ServiceContext, at_most: int = 4) -> None:
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


def _running(session: Session) -> list[Attempt]:
    return list(session.scalars(select(Attempt).where(Attempt.state == JobState.RUNNING)))


def _admit(ctx: ServiceContext, session: Session, agent_id: str) -> dict[str, LiveJob]:
    """Ask the scheduler which jobs run now; start those it leases, preempt those it drops
    (once they held their devices for a round), and tell every waiting job why it waits.
    Returns the live jobs as the scheduler read them."""
    now = utcnow()
    plan, _, rows = plan_round(ctx, session, now)
    busy_devices: dict[str, set[int]] = {}
    busy_cores: set[int] = set()
    for attempt in _running(session):
        if attempt.accelerator_type == "cpu":
            busy_cores.update(attempt.device_ids)
        else:
            busy_devices.setdefault(attempt.accelerator_type, set()).update(attempt.device_ids)
    for job_id in plan.preempted:
        _preempt_if_due(ctx, session.get_one(Job, job_id), now)
    queued = sorted(
        (r for r in rows.values() if r.state == JobState.QUEUED),
        key=lambda r: (r.submitted.submitted_at, r.id),
    )
    reasons: dict[str, str] = {}
    for waiting in queued:
        lease = plan.leases.get(waiting.id)
        if lease is None:
            reasons[waiting.id] = plan.pending_reasons.get(waiting.id, "waiting for the scheduler")
            continue
        job = session.get_one(Job, waiting.id)
        spec = stored_job_spec(job.spec)
        request = Request.of(spec.resources, [lease.accelerator_type])
        placed = ctx.executor.place(request, busy_devices, busy_cores)
        if isinstance(placed, Unplaceable):
            reasons[waiting.id] = f"0/1 nodes: {placed.reason}"
            continue
        if not _claim(session, job):
            continue  # cancelled between our read and now
        _launch(ctx, job, placed, agent_id)
        if placed.accelerator_type == "cpu":
            busy_cores.update(placed.core_ids)
        else:
            busy_devices.setdefault(placed.accelerator_type, set()).update(placed.device_ids)
    changed = [
        {"job_id": job_id, "reason": reason}
        for job_id, reason in reasons.items()
        if rows[job_id].pending_reason != reason
    ]
    if changed:  # most reasons stay as they were from one pass to the next
        session.execute(_SET_REASON, changed)
    return rows


_JOBS = cast(Table, Job.__table__)
_SET_REASON = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("job_id"), _JOBS.c.state == JobState.QUEUED)
    .values(pending_reason=bindparam("reason"))
)


def _preempt_if_due(ctx: ServiceContext, job: Job, now: datetime) -> None:
    """SIGTERM (the runtime checkpoints, then exits) once the attempt held its devices a round."""
    attempt = next((a for a in job.attempts if a.state == JobState.RUNNING), None)
    if attempt is None or attempt.pid is None or job.preempt_requested or job.cancel_requested:
        return
    started = attempt.started_at if attempt.started_at.tzinfo else attempt.started_at.replace(tzinfo=UTC)
    if (now - started).total_seconds() < ctx.settings.round_s:
        return
    job.preempt_requested = True
    ctx.executor.terminate(attempt.pid)
    attempt.signalled_at = now


def _claim(session: Session, job: Job) -> bool:
    """queued -> running, only if nobody changed the job since we read it (a cancel, say).

    On PostgreSQL the row is first locked with ``FOR UPDATE SKIP LOCKED``: an agent never waits
    on a job another agent is claiming, it moves on (SQLite has one writer at a time anyway).
    """
    free = session.scalar(
        select(Job.id).where(Job.id == job.id, Job.state == JobState.QUEUED).with_for_update(skip_locked=True)
    )
    if free is None:
        session.refresh(job)
        return False
    claimed = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.state == JobState.QUEUED, Job.cancel_requested.is_(False))
        .values(state=JobState.RUNNING)
    )
    session.refresh(job)
    return rows_changed(claimed)


def _launch(ctx: ServiceContext, job: Job, placed: Placement, agent_id: str) -> None:
    number = len(job.attempts) + 1
    run_dir = Path(job.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RESULT_FILE).unlink(missing_ok=True)  # a stale result would be read as this attempt's
    resume_from = job.resume_from
    if number > 1:  # a relaunch continues from the job's own newest checkpoint
        session = object_session(job)
        assert session is not None
        own = latest_checkpoint(run_dir / CHECKPOINT_DIR) or _fetch_checkpoint(
            ctx, session, job, run_dir / CHECKPOINT_DIR
        )
        resume_from = str(own) if own else resume_from
    spec, inputs = _with_fetched_data(ctx, job)
    roots = data_roots.roots_of_owner(ctx, job.owner or "", job.project)
    if roots is not None:  # and the verified copies of its store: datasets, not the whole cache
        given = job.spec["data"]["paths"]
        roots += [Path(local) for local, path in zip(spec.data.paths, given, strict=True) if path != local]
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
    ).write(run_dir)
    log_path = run_dir / "logs" / f"attempt-{number}.log"
    metrics = run_dir / METRICS_FILE
    try:
        pid = ctx.executor.launch(placed, run_dir, log_path)
    except OSError as exc:  # the job cannot start at all: say why instead of retrying forever
        job.state, job.exit_reason, job.pending_reason = JobState.FAILED, ExitReason.ERROR, None
        job.message = f"could not start the training process: {exc}"
        job.hint = "check that Shipyard's training extra is installed: pip install 'shipyard[train]'"
        job.finished_at = utcnow()
        return
    ids = list(placed.device_ids) if placed.accelerator_type != "cpu" else list(placed.core_ids)
    job.attempts.append(
        Attempt(
            number=number,
            state=JobState.RUNNING,
            accelerator_type=placed.accelerator_type,
            device_ids=ids,
            threads_per_process=placed.threads_per_process,
            pid=pid,
            agent_id=agent_id,
            log_path=str(log_path),
            metrics_offset=metrics.stat().st_size if metrics.exists() else 0,
            inputs=inputs or None,
        )
    )
    job.state = JobState.RUNNING
    job.pending_reason = None
    job.started_at = job.started_at or utcnow()
    session = object_session(job)
    assert session is not None
    audit.append(
        session,
        ctx.audit_key,
        ctx.actor,
        "job.start",
        f"job/{job.id}",
        detail={"attempt": number, "accelerator": placed.accelerator_type, "devices": ids},
    )


def _ingest_metrics(session: Session, attempt: Attempt) -> None:
    """Copy the complete lines the runtime appended to metrics.jsonl since the last look."""
    path = Path(attempt.job.run_dir) / METRICS_FILE
    if not path.exists():
        return
    if path.stat().st_size < attempt.metrics_offset:
        attempt.metrics_offset = 0  # a fresh start truncated the file
    with open(path, "rb") as f:
        f.seek(attempt.metrics_offset)
        chunk = f.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    for line in complete.splitlines():
        record = json.loads(line)
        session.add(
            Metric(
                job_id=attempt.job_id,
                attempt_id=attempt.id,
                kind=record.get("kind", "train"),
                step=record.get("step", 0),
                loss=record.get("loss"),
                tokens_per_s=record.get("tokens_per_s"),
                mfu=record.get("mfu"),
                values=record,
            )
        )
    attempt.metrics_offset += len(complete)


def _stop_if_cancelled(ctx: ServiceContext, attempt: Attempt) -> None:
    job = attempt.job
    if not (job.cancel_requested or job.preempt_requested) or attempt.pid is None:
        return
    now = utcnow()
    if attempt.signalled_at is None:
        ctx.executor.terminate(attempt.pid)
        attempt.signalled_at = now
    elif (now - attempt.signalled_at).total_seconds() > ctx.settings.cancel_grace_s:
        ctx.executor.kill(attempt.pid)


def _finish_if_exited(ctx: ServiceContext, session: Session, attempt: Attempt) -> None:
    assert attempt.pid is not None
    exit_code = ctx.executor.poll(attempt.pid)
    if exit_code is None:
        return
    _ingest_metrics(session, attempt)  # lines written between the last look and the exit
    job = attempt.job
    result_path = Path(job.run_dir) / RESULT_FILE
    result = AttemptResult.model_validate_json(result_path.read_text()) if result_path.exists() else None
    now = utcnow()
    attempt.exit_code = exit_code
    attempt.finished_at = job.finished_at = now
    if result is not None and result.checkpoint and result.status != "completed":
        _record_checkpoint(session, job, result)  # the next attempt, here or elsewhere, resumes from it
    if result is not None and result.status == "completed":
        attempt.state, attempt.exit_reason = JobState.SUCCEEDED, ExitReason.COMPLETED
        job.state, job.exit_reason = JobState.SUCCEEDED, ExitReason.COMPLETED
        _register_outputs(ctx, session, job, result)
    elif (
        result is not None
        and result.status == "cancelled"
        and job.preempt_requested
        and not job.cancel_requested
    ):
        attempt.state, attempt.exit_reason = JobState.CANCELLED, ExitReason.PREEMPTED
        job.state, job.preempt_requested, job.finished_at = JobState.QUEUED, False, None
        job.pending_reason = f"preempted by the scheduler at step {result.step}; resumes from its checkpoint"
    elif result is not None and result.status == "cancelled":
        attempt.state, attempt.exit_reason = JobState.CANCELLED, ExitReason.CANCELLED
        job.state, job.exit_reason, job.message = (
            JobState.CANCELLED,
            ExitReason.CANCELLED,
            result.message,
        )
        job.hint = f"shipyard jobs submit SPEC --resume-from {job.id}"
    elif result is not None:
        attempt.state, attempt.exit_reason = JobState.FAILED, ExitReason.ERROR
        job.state, job.exit_reason = JobState.FAILED, ExitReason.ERROR
        job.message, job.hint = result.message, result.hint or f"see `shipyard jobs logs {job.id}`"
    elif attempt.signalled_at is not None:
        attempt.state, attempt.exit_reason = JobState.CANCELLED, ExitReason.KILLED
        job.state, job.exit_reason = JobState.CANCELLED, ExitReason.KILLED
        job.message = f"did not stop within {ctx.settings.cancel_grace_s:g}s of SIGTERM and was killed"
    else:
        reason = ExitReason.LOST if exit_code == -1 and attempt.agent_id else ExitReason.ERROR
        attempt.state, attempt.exit_reason = JobState.FAILED, reason
        job.state, job.exit_reason = JobState.FAILED, reason
        job.message = _describe_exit(exit_code)
        job.hint = (
            f"see `shipyard jobs logs {job.id}`; resubmit with --resume to continue from its last checkpoint"
        )
    audit.append(
        session,
        ctx.audit_key,
        ctx.actor,
        "job.finish",
        f"job/{job.id}",
        outcome=attempt.exit_reason or attempt.state,
        detail={"attempt": attempt.number, "exit_code": exit_code, "job_state": job.state},
    )


def _describe_exit(code: int) -> str:
    if code < -1:
        return f"the training process was killed by signal {-code} before it reported a result"
    if code == -1:
        return "the training process ended while no agent watched it; its exit status is unknown"
    return f"the training process exited with code {code} without reporting a result"


def _record_checkpoint(session: Session, job: Job, result: AttemptResult) -> None:
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


def _register_outputs(ctx: ServiceContext, session: Session, job: Job, result: AttemptResult) -> None:
    """Record the final checkpoint and export, and publish the export as a new model version."""
    if result.checkpoint:
        _record_checkpoint(session, job, result)
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
    return rbac.allowed(session, actor, "model.publish", job.project)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
