"""The local agent's use cases: start the queued jobs the scheduler picks, preempt the ones it
drops, watch attempts, copy their metrics, stop cancelled ones, and record how each ended.

``tick`` is one pass; ``shipyard.daemon`` runs it in a loop, and starts one agent per
``$SHIPYARD_HOME`` when jobs are queued (``daemon.supervisor``), so they start without a command of
their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, joinedload

from shipyard import audit
from shipyard.agent import launching, recovery, telemetry
from shipyard.agent.endings import exit_record, how_it_ended, launched
from shipyard.agent.handles import handle_from, handle_of
from shipyard.agent.ingest import RECORDED, collect
from shipyard.agent.leasing import preempt, start_leased
from shipyard.agent.outputs import record_checkpoint, register_outputs
from shipyard.db import Attempt, Job
from shipyard.domain import ExitReason, JobState
from shipyard.durable import write_text_atomic
from shipyard.executors.base import (
    AttemptHandle,
    AttemptStatus,
    Exited,
    NodeLost,
    Running,
    Synced,
    Vanished,
    Waiting,
)
from shipyard.scheduling.status import Reason
from shipyard.schemas.jobspec import JobSpec, stored_job_spec
from shipyard.schemas.launch import (
    RESULT_FILE,
    STACKS_DIR,
    AttemptResult,
    Heartbeat,
)
from shipyard.services.caches.submitted_jobs import aware
from shipyard.services.context import ServiceContext
from shipyard.services.estimates.measurements import record_measurements
from shipyard.services.storage import storage

_log = logging.getLogger("shipyard.agent")
T = TypeVar("T")


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
    known = list(ctx.executor.known_nodes())  # the pass's one read of the inventory
    telemetry.record_inventory(ctx, known)  # for the server, which does not ask the engine
    # This machine's own health (a cluster's nodes are the cluster's to judge).
    problems = telemetry.node_problems(ctx) if ctx.executor.shares_run_folders else []
    cordoned = {node.id: problems for node in known if node.up} if problems else {}
    looks = _look(ctx)  # the engine asked outside any transaction: it may take seconds
    # One session for the pass, a short transaction for each thing it records: a record that
    # raises rolls back its own outcome only (the attempt is blamed, see ``Quarantine``).
    with ctx.db.session() as session:
        running = _running(ctx, session)
        session.commit()  # the snapshot's read ends here
        watched = [a for a in running if not _quarantine.holds(a.id)]
        released = False
        for attempt in watched:
            look = looks.get(attempt.id)
            if look is None:  # launched after the look: the next pass looks at it
                continue
            draining = handle_of(ctx, attempt).node in cordoned
            record = functools.partial(_record_outcome, ctx, session, attempt, look, draining=draining)
            if _on_its_own(session, attempt, record):
                _release(ctx, handle_of(ctx, attempt))
                released = True
        _quarantine.record(ctx)
        if released:  # what they held is free now: read before it counted as another's
            known = list(ctx.executor.known_nodes())
        running = [a for a in running if a.state == JobState.RUNNING]
        scheduling = time.perf_counter()
        # A set-aside attempt still holds its devices: ``running``, not ``watched``.
        try:  # the session may have begun already: reading again what a rollback expired
            live, prepared, preempted = start_leased(ctx, session, agent_id, running, known, cordoned)
            session.commit()
        except BaseException:
            session.rollback()
            raise
        for attempt in preempted:  # decided and recorded: now signalled, each on its own
            _on_its_own(session, attempt, functools.partial(_stop_if_cancelled, ctx, attempt))
    # The attempts are recorded: the engines are asked outside any transaction, each answer
    # recorded on its own (one that raises is found vanished at the next pass, the rest start).
    for launch in prepared:
        try:
            launching.start(ctx, launch)
        except Exception:
            _log.exception("job %s: the launch of its attempt failed", launch.job_id)
    done = time.perf_counter()
    telemetry.record_pass(
        ctx, agent_id, pass_s=done - started, schedule_s=done - scheduling, problems=problems, nodes=known
    )
    telemetry.sample_devices(ctx, known)
    # The jobs as this pass's scheduling read them: a job it launched shows as running from the
    # next pass on, which then polls fast once more.
    seen = frozenset((j.id, j.state, j.cancel_requested) for j in live.values())
    return Pass(active=bool(live), fingerprint=seen)


QUARANTINE_AFTER = 3
"""Passes in a row an attempt's record may raise in before the agent sets it aside."""
QUARANTINE_S = 600.0
"""How long an attempt stays set aside before the agent looks at it again."""


class Quarantine:
    """Attempts whose records keep raising (a damaged run folder, a record no code path
    expected): each such pass rolls back that attempt's outcome alone, and after
    ``QUARANTINE_AFTER`` passes in a row the agent sets the attempt aside for ``QUARANTINE_S``
    and writes why into its health, so it stops costing every pass a failure and a log."""

    def __init__(self) -> None:
        self._failures: dict[int, tuple[int, str]] = {}
        self._until: dict[int, float] = {}
        self._unrecorded: set[int] = set()

    def holds(self, attempt_id: int) -> bool:
        return self._until.get(attempt_id, 0.0) > time.monotonic()

    @contextlib.contextmanager
    def blaming(self, attempt_id: int) -> Iterator[None]:
        try:
            yield
        except OperationalError:
            raise  # the database went away or is locked: nobody's record is to blame
        except Exception as exc:
            failures = self._failures.get(attempt_id, (0, ""))[0] + 1
            error = f"{type(exc).__name__}: {exc}"
            self._failures[attempt_id] = (failures, error)
            if failures >= QUARANTINE_AFTER:
                self._until[attempt_id] = time.monotonic() + QUARANTINE_S
                self._unrecorded.add(attempt_id)
                _log.error(
                    "attempt %s raised in %d passes in a row (%s): set aside for %gs",
                    attempt_id, failures, error, QUARANTINE_S,
                )  # fmt: skip
            raise

    def cleared(self, attempt_ids: Iterable[int]) -> None:
        """A pass went through: these attempts' records no longer raise."""
        for attempt_id in attempt_ids:
            self._failures.pop(attempt_id, None)
            self._until.pop(attempt_id, None)

    def record(self, ctx: ServiceContext) -> None:
        """Why each newly set-aside attempt is, in its health (``jobs show``), in a transaction of
        its own: the one that raised was rolled back."""
        if not self._unrecorded:
            return
        with ctx.db.transaction() as session:
            for attempt_id in self._unrecorded:
                attempt = session.get(Attempt, attempt_id)
                if attempt is not None:
                    failures, error = self._failures[attempt_id]
                    attempt.health = {
                        **(attempt.health or {}),
                        "quarantined": f"set aside for {QUARANTINE_S:g}s after {failures} passes in a row "
                        f"failed on its record: {error}",
                    }
        self._unrecorded.clear()


_quarantine = Quarantine()
"""One agent loop runs in a process: its attempts set aside."""


def _record_outcome(
    ctx: ServiceContext, session: Session, attempt: Attempt, look: _Look, *, draining: bool
) -> bool:
    """Record what the engine said of one running attempt (its metrics, checkpoint, end), then
    stop it if it is to stop and watch its ranks' beats; whether it ended (the caller frees what
    it held, its end being committed)."""
    if look.error is not None:
        raise look.error
    collect(ctx, session, attempt, look.synced)
    if _finish_if_exited(ctx, session, attempt, look):
        return True
    if draining and ctx.settings.unhealthy_node == "drain":
        preempt(attempt)
    _stop_if_cancelled(ctx, attempt)
    _watch(ctx, attempt)
    return False


def _on_its_own(session: Session, attempt: Attempt, record: Callable[[], T]) -> T | None:
    """Run what records one attempt's outcome in a transaction of its own; what it returned, or
    None where it raised: then its outcome is rolled back, the attempt blamed (``Quarantine``),
    and the pass goes on with the others."""
    try:
        with _quarantine.blaming(attempt.id):
            outcome = record()
            session.commit()
    except OperationalError:
        session.rollback()
        raise  # the database went away or is locked: the pass fails, no record is to blame
    except Exception:
        session.rollback()  # the session's objects are read again where next used
        _log.exception("attempt %s: recording its outcome failed", attempt.id)
        return None
    _quarantine.cleared([attempt.id])
    return outcome


def _release(ctx: ServiceContext, handle: AttemptHandle) -> None:
    """What an ended attempt held (a placement group, a reservation), freed once its end is
    committed."""
    try:
        ctx.executor.release(handle)
    except Exception:
        _log.exception("attempt %s: releasing what it held failed", handle.handle)


def _running(ctx: ServiceContext, session: Session) -> list[Attempt]:
    """Running attempts on the executor's nodes (those of other executors are theirs to watch),
    with their jobs, in one query (one per attempt took most of a pass over 2,000 of them)."""
    attempts = session.scalars(
        select(Attempt)
        .where(Attempt.state == JobState.RUNNING)
        # A job's spec and estimate are large and never change: read when needed (``_spec_of``).
        .options(joinedload(Attempt.job).defer(Job.spec).defer(Job.estimate))
    )
    return [a for a in attempts if ctx.executor.runs(handle_of(ctx, a))]


@dataclass(frozen=True, slots=True)
class _Look:
    """What the engine answered of one running attempt: its status, then what it brought over
    (asked after the status, so that an attempt seen ended has all it wrote)."""

    status: AttemptStatus | None = None
    synced: Synced = field(default_factory=Synced)
    error: Exception | None = None
    """What asking raised: its outcome is not recorded, the attempt blamed (``Quarantine``)."""


def _look(ctx: ServiceContext) -> dict[int, _Look]:
    """Ask the engine about every running attempt, outside any transaction (a cluster's answer
    may take seconds; the pass's transaction must not wait on it)."""
    with ctx.db.read() as session:  # columns, not objects: what asking needs, read fast
        rows = session.execute(
            select(Attempt.id, Attempt.node, Attempt.handle, Attempt.pid, Job.run_dir)
            .join(Job, Job.id == Attempt.job_id)
            .where(Attempt.state == JobState.RUNNING)
        ).all()
    looks = {}
    for attempt_id, node, engine_name, pid, run_dir in rows:
        handle = handle_from(ctx, node, engine_name, pid)
        if _quarantine.holds(attempt_id) or not ctx.executor.runs(handle):
            continue
        try:
            status = ctx.executor.status(handle)
            synced = Synced() if isinstance(status, NodeLost) else ctx.executor.sync(handle, Path(run_dir))
            looks[attempt_id] = _Look(status, synced)
        except Exception as exc:
            looks[attempt_id] = _Look(error=exc)
    return looks


def _stop_if_cancelled(ctx: ServiceContext, attempt: Attempt) -> None:
    job = attempt.job
    if not (job.cancel_requested or job.preempt_requested) or not launched(attempt):
        return
    now = ctx.clock.now()
    if attempt.signalled_at is None:
        ctx.executor.stop(handle_of(ctx, attempt))
        attempt.signalled_at = now
    elif (now - attempt.signalled_at).total_seconds() > ctx.settings.cancel_grace_s:
        ctx.executor.stop(handle_of(ctx, attempt), force=True)


HANG_DUMP_S = 2.0
"""Between asking a hung attempt for its stacks (SIGUSR1) and killing it."""


def _watch(ctx: ServiceContext, attempt: Attempt) -> None:
    """Read the attempt's heartbeats: record its ranks' compute time and stragglers, and stop it
    as hung when no rank made progress for longer than its restart policy allows (first every
    rank's Python stacks go into its log, then, a look later, it is killed)."""
    job = attempt.job
    if not launched(attempt) or job.cancel_requested or job.preempt_requested:
        return
    if job.pending_code == Reason.HELD_BY_ENGINE:  # not started: its silence counts from its start
        _WATCHED.pop(_watch_key(attempt), None)
        return
    now = ctx.clock.now()
    if attempt.exit_reason == ExitReason.HANG:  # its stacks were asked for at an earlier look
        assert attempt.signalled_at is not None
        if (now - aware(attempt.signalled_at)).total_seconds() >= HANG_DUMP_S:
            ctx.executor.stop(handle_of(ctx, attempt), force=True)
        return
    spec = _spec_of(job)
    beats = Heartbeat.read_all(Path(job.run_dir))
    looked = time.monotonic()
    silence = _WATCHED.setdefault(_watch_key(attempt), recovery.Silence(since=looked))
    seen = recovery.progress(beats, silence.observe(beats, looked), spec)
    health: dict[str, Any] = {"compute_s": seen.compute_s, "stragglers": seen.stragglers}
    if seen.hung:
        limit = spec.restarts
        health["hang"] = (
            f"hung: no progress for {seen.silent_s:.0f}s after step {seen.step} (the limit is "
            f"{seen.limit_s:.0f}s: the larger of {limit.hang_factor:g} median steps and "
            f"restarts.startup_grace_s {limit.startup_grace_s:g}s); every rank's stacks are in its log"
        )
        health["silent_s"], health["limit_s"] = round(seen.silent_s, 1), round(seen.limit_s, 1)
        _log.warning("job %s attempt %s %s", job.id, attempt.number, health["hang"])
        stacks = ctx.executor.dump_stacks(handle_of(ctx, attempt))
        if stacks is not None:
            _keep_stacks(attempt, stacks)
        attempt.exit_reason, attempt.signalled_at = ExitReason.HANG, now
    if health != attempt.health:
        attempt.health = health


_SPECS: dict[str, JobSpec] = {}
"""The specs of the running jobs this agent process watches, parsed once (a spec never changes)."""


def _spec_of(job: Job) -> JobSpec:
    if job.id not in _SPECS:
        _SPECS[job.id] = stored_job_spec(job.spec)
    return _SPECS[job.id]


_WATCHED: dict[str, recovery.Silence] = {}
"""Each running attempt's ranks as this agent process has seen them beat (one agent loop runs in
a process); an agent that starts anew watches from its first look, with the grace of a start."""


def _watch_key(attempt: Attempt) -> str:
    return f"{attempt.job.run_dir}#{attempt.number}"


def _keep_stacks(attempt: Attempt, stacks: str) -> None:
    """A hung attempt's stacks, read from outside it: kept beside its run (``stacks/``) and
    added to its log, where ``jobs logs`` shows them."""
    try:
        folder = Path(attempt.job.run_dir) / STACKS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(folder / f"attempt-{attempt.number}.txt", stacks)
        with open(attempt.log_path, "a") as log:
            log.write(f"\n--- attempt {attempt.number} hung: every rank's stacks, read from outside ---\n")
            log.write(stacks)
    except OSError as exc:  # a full or gone disk: the hang is handled all the same
        _log.warning("job %s: could not keep the hung attempt's stacks: %s", attempt.job_id, exc)


def _finish_if_exited(ctx: ServiceContext, session: Session, attempt: Attempt, look: _Look) -> bool:
    """Record the attempt's end if the engine said it ended; whether it did (the caller frees
    what it held once this is committed)."""
    assert launched(attempt)
    status, synced = look.status, look.synced
    job = attempt.job
    if isinstance(status, Waiting):  # admitted, held in the engine's own queue: say why
        if (job.pending_reason, job.pending_code) != (status.reason, Reason.HELD_BY_ENGINE):
            job.pending_reason, job.pending_code = status.reason, Reason.HELD_BY_ENGINE
        return False
    if job.pending_code == Reason.HELD_BY_ENGINE:  # the engine let it go
        job.pending_reason = job.pending_code = None
    if isinstance(status, Running):
        if status.found is not None:  # its launch's answer was never recorded: now it is
            attempt.handle, attempt.pid = status.found.handle, status.found.pid
            attempt.node = status.found.stored_nodes  # where the engine placed it, if it chose
        return False
    assert status is not None
    _WATCHED.pop(_watch_key(attempt), None)
    _SPECS.pop(attempt.job_id, None)
    RECORDED.pop(attempt.id, None)
    result_path = Path(job.run_dir) / RESULT_FILE
    result = AttemptResult.model_validate_json(result_path.read_text()) if result_path.exists() else None
    parent_saw = exit_record(job, attempt)
    if isinstance(status, Vanished) and parent_saw is not None:  # adopted: its parent waited for it
        status = Exited.of(parent_saw.exit_code)
    attempt.exit_code = status.exit_code if isinstance(status, Exited) else None
    attempt.finished_at = ctx.clock.now()
    if result is not None and result.checkpoint and result.status != "completed":
        # The next attempt, here or elsewhere, resumes from it.
        record_checkpoint(session, job, Path(result.checkpoint), result.step)
    ended = how_it_ended(ctx, job, attempt, status, result, parent_saw)
    attempt.state, attempt.exit_reason = ended.attempt_state, ended.attempt_reason
    if ended.attempt_reason == ExitReason.RESIZED:
        attempt.message = job.resize_message
    record_measurements(session, job, attempt)
    after = None
    if ended.job_state == JobState.FAILED:
        after = recovery.decide(
            session, job, attempt, ended.attempt_reason, ended.message or "", ctx.clock.now()
        )
        if isinstance(after, recovery.GiveUp):
            ended = dataclasses.replace(ended, message=after.message, hint=after.hint)
    if isinstance(after, recovery.Retry):
        code = Reason.NODE_LOST if ended.attempt_reason == ExitReason.NODE_LOST else Reason.RESTARTING
        job.move(JobState.QUEUED, pending_reason=after.reason, pending_code=code)
        job.restart_at, job.micro_batch_size = after.restart_at, after.micro_batch_size
    elif ended.job_state == JobState.QUEUED:
        code = Reason.RESIZED if ended.attempt_reason == ExitReason.RESIZED else Reason.PREEMPTED
        job.preempt_requested, job.resize_message = False, None
        job.move(JobState.QUEUED, pending_reason=ended.message, pending_code=code)
    else:
        job.move(ended.job_state, exit_reason=ended.attempt_reason, message=ended.message, hint=ended.hint)
    if ended.job_state == JobState.SUCCEEDED:
        assert result is not None
        export = None if synced.export is None else storage.sealed(ctx, list(synced.export))
        register_outputs(ctx, session, job, result, export)
    audit.append(
        session,
        ctx.audit_key,
        ctx.actor,
        "job.finish",
        f"job/{job.id}",
        outcome=attempt.exit_reason or attempt.state,
        detail={"attempt": attempt.number, "exit_code": attempt.exit_code, "job_state": job.state},
    )
    return True
