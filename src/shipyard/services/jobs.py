"""Job use cases: submit, list, show, cancel, logs."""

from __future__ import annotations

import contextlib
import logging
import queue
import secrets
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Connection, Table, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, joinedload
from sqlalchemy.orm.interfaces import ORMOption

from shipyard.db import Artifact, Database, Job, Metric, rows_changed
from shipyard.db.pipeline import pipelined
from shipyard.db.tables import utcnow
from shipyard.domain import ExitReason, JobState
from shipyard.domain.text import has_control_character
from shipyard.errors import Conflict, DatasetError, InvalidSpec, NotFound, Unschedulable
from shipyard.executors.base import Request
from shipyard.schemas.documents import read_document_file, shown
from shipyard.schemas.jobspec import (
    MAX_PATH,
    STORE_SCHEME,
    JobSpec,
    parse_job_spec,
    stored_job_spec,
    validate_job_spec,
)
from shipyard.schemas.launch import (
    CHECKPOINT_DIR,
    CHECKPOINT_POINTER,
    CHECKPOINT_STATE_FILE,
    latest_checkpoint,
)
from shipyard.schemas.presets import PRESETS
from shipyard.schemas.views import ArtifactView, AttemptView, JobDetail, JobView
from shipyard.services import agent, audit, data_roots, rbac, storage
from shipyard.services.context import ServiceContext
from shipyard.services.estimates import estimate_job
from shipyard.services.planning import hardware_catalog
from shipyard.services.summaries import summarize

_log = logging.getLogger("shipyard.jobs")
_JOBS = cast(Table, Job.__table__)


def load_spec_file(path: Path) -> JobSpec:
    """Read and validate a job spec file; relative paths inside it are taken from its folder."""
    spec = parse_job_spec(read_document_file(path), source=str(path))
    return absolutize(spec, path.resolve().parent)


def absolutize(spec: JobSpec, base: Path) -> JobSpec:
    def resolve(p: str) -> str:
        expanded = Path(p).expanduser()
        return str(expanded if expanded.is_absolute() else base / expanded)

    document = spec.model_dump(mode="json", by_alias=True)
    document["data"]["paths"] = [p if p.startswith(STORE_SCHEME) else resolve(p) for p in spec.data.paths]
    if spec.data.tokenizer.path:
        document["data"]["tokenizer"]["path"] = resolve(spec.data.tokenizer.path)
    if spec.model.path:
        document["model"]["path"] = resolve(spec.model.path)
    return validate_job_spec(document)


@dataclass(frozen=True, slots=True)
class Admitted:
    """A submission that passed every check, ready to be written."""

    ctx: ServiceContext
    spec: JobSpec
    request: Request
    estimate: dict[str, Any]
    resume_from: Path | None


def submit(
    ctx: ServiceContext,
    spec: JobSpec,
    *,
    resume: bool = False,
    resume_from: str | None = None,
    writer: SubmissionWriter | None = None,
) -> JobView:
    """Validate everything that can be known before launch, then queue the job (through
    ``writer`` when the server batches the writes of concurrent submissions)."""
    # The run directory is made by the agent that launches the job, on its own node.
    if writer is not None:
        return writer.submit(Submission(ctx, spec, resume, resume_from)).result()
    [view] = insert_jobs(ctx.db, [admit(ctx, spec, resume, resume_from)])
    if ctx.autostart_agent:
        agent.ensure_running(ctx.settings)
    return view


def admit(ctx: ServiceContext, spec: JobSpec, resume: bool, resume_from: str | None) -> Admitted:
    """Every check a submission must pass: permission, paths inside the project's data roots,
    data, model, fit on this node, resume point. The permission and the roots come first, so
    that no answer about a path reaches a caller who may not read it."""
    with ctx.db.read() as session:
        rbac.require(ctx, session, "job.submit", f"project/{spec.project}", spec.project)
        data_roots.confine(ctx, spec)
        spec.data.check_content()  # missing, empty or binary dataset: fail now, not in the job's log
        for name in spec.data.stored():  # present, readable by the submitter, not empty
            if storage.stat(ctx, name, spec.project).size_bytes == 0:
                raise DatasetError(f"dataset store:{name} is empty", hint="store text or JSONL files in it")
        _check_model(spec)
        request = Request.of(spec.resources)
        unplaceable = ctx.executor.check_feasible(request)
        if unplaceable is not None:
            inventory = ", ".join(f"{k}: {v}" for k, v in ctx.executor.inventory().items())
            raise Unschedulable(
                f"job {spec.name!r} can never run on this node: {unplaceable.reason}",
                hint=f"this node has {inventory} (cpu counts cores); lower resources.devices or "
                "resources.min_memory_gib, or list an accelerator type it has in resources.accelerator",
            )
        spec.training.grad_accum_steps(request.devices)
        estimate = estimate_job(spec, ctx.executor.devices, hardware_catalog(ctx.settings))
        checkpoint = _resume_point(ctx, session, spec, resume, resume_from)
    return Admitted(ctx, spec, request, estimate, checkpoint)


def write(connection: Connection, batch: list[Admitted]) -> list[JobView]:
    """Queue admitted submissions in the caller's transaction: the jobs in one multi-row insert,
    then their audit records (last, so the audit head, which every append locks, is held only
    until the commit). Core statements only: the hottest write needs no ORM session."""
    ids = _new_job_ids([a.spec.name for a in batch])
    now = utcnow()
    rows, views, entries = [], [], []
    for job_id, admitted in zip(ids, batch, strict=True):
        spec, request, ctx = admitted.spec, admitted.request, admitted.ctx
        row = {
            "id": job_id,
            "name": spec.name,
            "project": spec.project,
            "queue": spec.queue,
            "priority": spec.priority,
            "state": JobState.QUEUED,
            "spec": spec.model_dump(mode="json", by_alias=True),
            "devices": request.devices,
            "accelerator_types": list(request.accelerator_types),
            "run_dir": str(ctx.settings.runs_dir / job_id),
            "resume_from": str(admitted.resume_from) if admitted.resume_from else None,
            "pending_reason": "waiting for the local agent to pick it up",
            "estimate": admitted.estimate or None,
            "owner": ctx.actor.name,
            "submitted_at": now,
        }
        rows.append(row)
        views.append(_view(Job(**row), spec))
        detail = {"project": spec.project, "queue": spec.queue, "devices": request.devices}
        entries.append(audit.Entry(ctx.actor, "job.submit", f"job/{job_id}", detail=detail))
    with pipelined(connection):  # three round trips instead of six on PostgreSQL
        connection.execute(insert(_JOBS), rows)
        audit.append_all(connection, batch[0].ctx.audit_key, entries)
    return views


ID_DRAWS = 3


def insert_jobs(db: Database, batch: list[Admitted]) -> list[JobView]:
    """``write`` in a transaction of its own. An id already taken fails the insert on the key;
    the batch is then written again, with ids drawn anew."""
    for _ in range(ID_DRAWS - 1):
        with contextlib.suppress(IntegrityError), db.begin() as connection:
            return write(connection, batch)
    with db.begin() as connection:
        return write(connection, batch)


@dataclass(frozen=True, slots=True)
class Submission:
    """A submission as a request makes it, before any check."""

    ctx: ServiceContext
    spec: JobSpec
    resume: bool = False
    resume_from: str | None = None


class SubmissionWriter:
    """Admits and writes the submissions of one server process's concurrent requests together,
    in a thread of its own: one transaction, one advance of the audit head and one multi-row
    insert per batch instead of per job (group commit). A request's future is done once its
    batch commits, so its answer still means the job is stored; a submission that fails its
    checks fails alone, and a batch that fails to write is retried one submission at a time.

    The checks run here too, so that an async request hands its submission over once and
    awaits the answer: no trip through the request thread pool on the way."""

    def __init__(self, db: Database, *, max_batch: int = 64) -> None:
        self._db, self._max_batch = db, max_batch
        self._pending: queue.SimpleQueue[tuple[Submission, Future[JobView]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="submission-writer", daemon=True)
        self._thread.start()

    def submit(self, submission: Submission) -> Future[JobView]:
        done: Future[JobView] = Future()
        self._pending.put((submission, done))
        return done

    def close(self) -> None:
        self._pending.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while (first := self._pending.get()) is not None:
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    item = self._pending.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._pending.put(None)  # stop after this batch
                    break
                batch.append(item)
            self._commit(self._admit(batch))

    @staticmethod
    def _admit(batch: list[tuple[Submission, Future[JobView]]]) -> list[tuple[Admitted, Future[JobView]]]:
        admitted = []
        for s, done in batch:
            # A request cancelled while it waited (its client went away) is not written. Once
            # running, a future can no longer be cancelled, so its answer can always be set.
            if not done.set_running_or_notify_cancel():
                continue
            try:
                admitted.append((admit(s.ctx, s.spec, s.resume, s.resume_from), done))
            except Exception as exc:  # the request's error, raised where it awaits the answer
                done.set_exception(exc)
        return admitted

    def _commit(self, batch: list[tuple[Admitted, Future[JobView]]]) -> None:
        if not batch:
            return
        try:
            views = insert_jobs(self._db, [admitted for admitted, _ in batch])
        except Exception as exc:
            if len(batch) == 1:
                batch[0][1].set_exception(exc)
            else:
                for item in batch:
                    self._commit([item])
            return
        for (_, done), view in zip(batch, views, strict=True):
            done.set_result(view)
        ctx = batch[0][0].ctx
        if ctx.autostart_agent:
            try:
                agent.ensure_running(ctx.settings)
            except OSError as exc:  # the jobs are stored; the next submission tries again
                _log.warning("could not start the local agent: %s", exc)


def _new_job_ids(names: list[str]) -> list[str]:
    """NAME-8 hex digits each (6 digits collided within a few thousand submissions). Not looked
    up first: two jobs of one name draw the same id about once in four billion, and then the
    insert fails on the key and the submission is written again with new ids."""
    while True:
        candidates = [f"{name}-{secrets.token_hex(4)}" for name in names]
        if len(set(candidates)) == len(candidates):
            return candidates


def _check_model(spec: JobSpec) -> None:
    if spec.model.path:
        config = Path(spec.model.path) / "config.json"
        if not config.is_file():
            raise InvalidSpec(
                f"model.path {spec.model.path} is not a Hugging Face model folder (no config.json)",
                hint="give the folder that save_pretrained or a Shipyard export wrote",
            )
        return
    arch = PRESETS[spec.model.preset or ""]
    if spec.training.seq_len > arch.max_seq_len:
        raise InvalidSpec(
            f"training.seq_len {spec.training.seq_len} exceeds the max_seq_len {arch.max_seq_len} "
            f"of {spec.model.preset}",
            hint=f"set training.seq_len to at most {arch.max_seq_len}",
        )


def _resume_point(
    ctx: ServiceContext, session: Session, spec: JobSpec, resume: bool, resume_from: str | None
) -> Path | None:
    if resume_from:
        path = _resume_source(ctx, session, spec, resume_from)
        # A checkpoints folder means its newest checkpoint; anything else is one checkpoint.
        is_folder = path.name == CHECKPOINT_DIR or (path / CHECKPOINT_POINTER).exists()
        found = latest_checkpoint(path) if is_folder else path
        if found is None or not (found / CHECKPOINT_STATE_FILE).is_file():
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
    if job is None:
        raise NotFound(
            f"--resume-from {resume_from!r} is neither a checkpoint path nor a job id",
            hint="give a job id from `shipyard jobs list` or a checkpoint directory",
        )
    _get_allowed(ctx, session, job.id, "job.read")  # another project's checkpoints are its own
    return Path(job.run_dir) / CHECKPOINT_DIR


MAX_LISTED = 1000
"""Most jobs one listing returns."""
MAX_OFFSET = 2**62
"""Largest log offset asked for: inside a 64-bit file position."""


def list_jobs(ctx: ServiceContext, *, state: str | None = None, limit: int = 50) -> list[JobView]:
    if not 1 <= limit <= MAX_LISTED:
        raise InvalidSpec(
            f"--limit must be 1 to {MAX_LISTED}, got {limit}",
            hint="narrow the list with --state instead",
        )
    with ctx.db.read() as session:
        query = select(Job).order_by(Job.submitted_at.desc()).limit(limit)
        if not ctx.actor.is_admin:  # the jobs of one's projects, and one's own
            projects = list(rbac.projects_of(session, ctx.actor))
            query = query.where(or_(Job.project.in_(projects), Job.owner == ctx.actor.name))
        if state:
            if state not in set(JobState):
                raise InvalidSpec(f"unknown job state {state!r}", hint=f"use one of: {', '.join(JobState)}")
            query = query.where(Job.state == state)
        jobs = list(session.scalars(query))
        latest = _latest_metrics(session, jobs)  # one query, not two per job
        return [_view(job, latest=latest.get(job.id)) for job in jobs]


def get(ctx: ServiceContext, job_id: str) -> JobDetail:
    with ctx.db.read() as session:
        # The attempts come with the job, in one query: a view shows them all.
        job = _get_allowed(ctx, session, job_id, "job.read", joinedload(Job.attempts))
        metrics = list(session.scalars(select(Metric).where(Metric.job_id == job.id).order_by(Metric.id)))
        artifacts = session.scalars(select(Artifact).where(Artifact.job_id == job.id).order_by(Artifact.id))
        return JobDetail(
            **_view(job, latest={m.kind: m for m in metrics}).model_dump(),  # the newest of each kind
            attempts=[AttemptView.model_validate(a, from_attributes=True) for a in job.attempts],
            artifacts=[ArtifactView.model_validate(a, from_attributes=True) for a in artifacts],
            spec=job.spec,
            summary=summarize(job, metrics),
            estimate=job.estimate or {},
        )


def _get_allowed(
    ctx: ServiceContext, session: Session, job_id: str, permission: str, *options: ORMOption
) -> Job:
    """The job, if the caller may ``permission`` it (``job.cancel``: any job, or one's own)."""
    job = _get(session, job_id, *options)
    own = job.owner == ctx.actor.name
    if permission == "job.cancel":
        permission = "job.cancel.own" if own else "job.cancel.any"
    if not (own and permission in ("job.read", "job.logs", "job.cancel.own")):
        rbac.require(ctx, session, permission, f"job/{job_id}", job.project)
    return job


def _get(session: Session, job_id: str, *options: ORMOption) -> Job:
    job = session.get(Job, job_id, options=options)
    if job is None:
        raise NotFound(f"no job with id {job_id!r}", hint="`shipyard jobs list` shows job ids")
    return job


def cancel(ctx: ServiceContext, job_id: str) -> JobView:
    """A queued job is cancelled at once; a running one is asked to checkpoint and stop.

    The agent may start the job at the same moment, so each change is a guarded UPDATE on the
    state read: whichever writer comes second sees zero rows and looks again.
    """
    with ctx.db.transaction() as session:
        _get_allowed(ctx, session, job_id, "job.cancel")
        queued = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.state == JobState.QUEUED)
            .values(
                state=JobState.CANCELLED,
                exit_reason=ExitReason.CANCELLED,
                pending_reason=None,
                finished_at=utcnow(),
            )
        )
        if not rows_changed(queued):
            running = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.state == JobState.RUNNING)
                .values(cancel_requested=True)
            )
            if not rows_changed(running):
                state = session.scalar(select(Job.state).where(Job.id == job_id))
                raise Conflict(
                    f"job {job_id} already {state}", hint="only queued or running jobs can be cancelled"
                )
        audit.append(session, ctx.audit_key, ctx.actor, "job.cancel", f"job/{job_id}")
        session.expire_all()
        return _current_view(session, job_id)


@dataclass(frozen=True, slots=True)
class LogChunk:
    data: bytes
    next_offset: int
    job_ended: bool


def read_log(ctx: ServiceContext, job_id: str, offset: int = 0, *, must_exist: bool = True) -> LogChunk:
    """The bytes of the newest attempt's log from ``offset`` on (empty while the job waits)."""
    if not 0 <= offset <= MAX_OFFSET:
        raise InvalidSpec(f"log offset {offset} is out of range", hint="give a byte offset from 0")
    with ctx.db.transaction() as session:
        job = _get_allowed(ctx, session, job_id, "job.logs")
        ended = JobState(job.state).is_final
        if not job.attempts:
            if must_exist:
                raise Conflict(
                    f"job {job_id} has not started yet ({job.pending_reason or job.state})",
                    hint=f"wait, or run `shipyard jobs logs {job_id} --follow`",
                )
            return LogChunk(b"", offset, ended)
        path = Path(job.attempts[-1].log_path)
    if not path.exists():
        return LogChunk(b"", offset, ended)
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    return LogChunk(data, offset + len(data), ended)


def _view(job: Job, spec: JobSpec | None = None, latest: Mapping[str, Metric] | None = None) -> JobView:
    """The job as callers see it. ``latest``: its newest metric of each kind (none for a job made
    just now, whose ``spec`` is given so that it is not validated again)."""
    latest = latest or {}
    last_train, last_eval = latest.get("train"), latest.get("eval")
    spec = spec or stored_job_spec(job.spec)
    return JobView(
        id=job.id,
        name=job.name,
        project=job.project,
        queue=job.queue,
        priority=job.priority,
        state=job.state,
        pending_reason=job.pending_reason if job.state == JobState.QUEUED else None,
        devices=job.devices,
        accelerator_types=job.accelerator_types,
        step=last_train.step if last_train else 0,
        total_steps=spec.training.total_steps,
        loss=last_train.loss if last_train else None,
        eval_loss=last_eval.loss if last_eval else None,
        tokens_per_s=last_train.tokens_per_s if last_train else None,
        exit_reason=job.exit_reason,
        message=job.message,
        hint=job.hint,
        run_dir=job.run_dir,
        resume_from=job.resume_from,
        submitted_at=job.submitted_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )


def _latest_metrics(session: Session, jobs: list[Job]) -> dict[str, dict[str, Metric]]:
    """Each job's newest training and evaluation metric, in one query for all of them."""
    if not jobs:
        return {}
    newest = (
        select(func.max(Metric.id))
        .where(Metric.job_id.in_([job.id for job in jobs]), Metric.kind.in_(("train", "eval")))
        .group_by(Metric.job_id, Metric.kind)
    )
    latest: dict[str, dict[str, Metric]] = {}
    for metric in session.scalars(select(Metric).where(Metric.id.in_(newest))):
        latest.setdefault(metric.job_id, {})[metric.kind] = metric
    return latest


def _current_view(session: Session, job_id: str) -> JobView:
    job = _get(session, job_id)
    return _view(job, latest=_latest_metrics(session, [job]).get(job.id))


def status(ctx: ServiceContext, job_id: str) -> JobView:
    """The job's state and latest progress (cheaper than ``get``)."""
    with ctx.db.read() as session:
        return _current_view(session, job_id)
