"""How an attempt ended, in the words the job's history keeps: the exit record its runtime wrote,
the engine's account of it, and the reason recovery acts on."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from shipyard.db import Attempt, Job
from shipyard.domain import ExitReason, JobState
from shipyard.executors.base import (
    EngineEnding,
    Exited,
    NodeLost,
    Vanished,
)
from shipyard.schemas.launch import (
    EXIT_FILE,
    AttemptResult,
    ExitRecord,
)
from shipyard.services.context import ServiceContext


@dataclass(frozen=True, slots=True)
class Ended:
    """How an attempt ended, and where that leaves its job."""

    attempt_state: JobState
    attempt_reason: ExitReason
    job_state: JobState
    message: str | None = None
    """The job's message (for a preempted job, why it waits)."""
    hint: str | None = None


def exit_record(job: Job, attempt: Attempt) -> ExitRecord | None:
    """What the attempt's parent (``training.parent``) wrote of how its processes ended, if it
    is this attempt's parent that wrote it."""
    path = Path(job.run_dir) / EXIT_FILE
    try:
        record = ExitRecord.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return None
    return record if record.parent_pid == attempt.pid else None


def how_it_ended(
    ctx: ServiceContext,
    job: Job,
    attempt: Attempt,
    status: Exited | Vanished | NodeLost,
    result: AttemptResult | None,
    parent_saw: ExitRecord | None = None,
) -> Ended:
    hint = f"see `shipyard jobs logs {job.id}`; resubmit with --resume to continue from its last checkpoint"
    if isinstance(status, NodeLost):
        lost = f"a node of its attempt ({', '.join(status.nodes)}) left the cluster"
        return Ended(JobState.FAILED, ExitReason.NODE_LOST, JobState.FAILED, lost, hint)
    if attempt.exit_reason == ExitReason.HANG:  # the agent stopped it (see _watch)
        hung = (attempt.health or {}).get("hang")
        return Ended(JobState.FAILED, ExitReason.HANG, JobState.FAILED, hung, hint)
    if result is not None and result.status == "completed":
        return Ended(JobState.SUCCEEDED, ExitReason.COMPLETED, JobState.SUCCEEDED, result.message)
    if isinstance(status, Exited) and status.engine_ended == "withdrawn":
        withdrawn = "cancelled while its engine held it in its queue, before it started"
        return Ended(JobState.CANCELLED, ExitReason.CANCELLED, JobState.CANCELLED, withdrawn)
    if isinstance(status, Exited) and status.engine_ended is not None and not job.cancel_requested:
        return _ended_by_engine(status.engine_ended, result)
    if result is not None and result.status == "cancelled":
        if job.preempt_requested and not job.cancel_requested and job.resize_message:
            resized = f"{job.resize_message} (at step {result.step}; resumes from its checkpoint)"
            return Ended(JobState.CANCELLED, ExitReason.RESIZED, JobState.QUEUED, resized)
        if job.preempt_requested and not job.cancel_requested:
            waiting = f"preempted by the scheduler at step {result.step}; resumes from its checkpoint"
            return Ended(JobState.CANCELLED, ExitReason.PREEMPTED, JobState.QUEUED, waiting)
        resume = f"shipyard jobs submit SPEC --resume-from {job.id}"
        return Ended(JobState.CANCELLED, ExitReason.CANCELLED, JobState.CANCELLED, result.message, resume)
    if result is not None:
        reason = _FAILURES.get(result.failure or "", ExitReason.ERROR)
        hint = result.hint or f"see `shipyard jobs logs {job.id}`"
        return Ended(JobState.FAILED, reason, JobState.FAILED, result.message, hint)
    if attempt.signalled_at is not None:
        killed = f"did not stop within {ctx.settings.cancel_grace_s:g}s of SIGTERM and was killed"
        return Ended(JobState.CANCELLED, ExitReason.KILLED, JobState.CANCELLED, killed)
    # No result: the process (or a rank under torchrun, which then exits non-zero) was killed.
    if isinstance(status, Vanished):
        unseen = "the training process ended while no agent watched it; its exit status is unknown"
        return Ended(JobState.FAILED, ExitReason.LOST, JobState.FAILED, unseen, hint)
    if parent_saw is not None and parent_saw.signal == "SIGKILL" and parent_saw.oom_kills:
        # The kernel's OOM killer: on a CPU the host's memory is the device's, and a smaller
        # micro-batch is the cure; on a GPU it is the host's own (data loading, pinned buffers).
        oom = (
            f"the training process was killed by the kernel's OOM killer (SIGKILL; its memory "
            f"cgroup counted {parent_saw.oom_kills} OOM kill{'s' * (parent_saw.oom_kills != 1)} "
            "while it ran)"
        )
        reason = ExitReason.OOM if attempt.accelerator_type == "cpu" else ExitReason.SIGNAL
        return Ended(JobState.FAILED, reason, JobState.FAILED, oom, hint)
    return Ended(JobState.FAILED, ExitReason.SIGNAL, JobState.FAILED, describe_exit(status), hint)


def _ended_by_engine(ending: EngineEnding, result: AttemptResult | None) -> Ended:
    """An attempt its engine ended (a batch system's limit or preemption): the machine's side,
    so the job waits to continue from its newest checkpoint, or, out of memory, fails under the
    restart policy's OOM rule."""
    at = f" at step {result.step}" if result is not None else ""
    if ending == "out_of_memory":
        oom = "the engine ended it for using more host memory than its allocation has"
        return Ended(JobState.FAILED, ExitReason.OOM, JobState.FAILED, oom)
    if ending == "preempted":
        waiting = f"preempted by the engine's own scheduler{at}; resumes from its checkpoint"
        return Ended(JobState.CANCELLED, ExitReason.PREEMPTED, JobState.QUEUED, waiting)
    limit = f"its allocation reached the engine's time limit{at}; resumes from its checkpoint"
    return Ended(JobState.CANCELLED, ExitReason.TIME_LIMIT, JobState.QUEUED, limit)


_FAILURES = {"oom": ExitReason.OOM, "collective": ExitReason.COLLECTIVE}


def launched(attempt: Attempt) -> bool:
    return attempt.handle is not None or attempt.pid is not None


def describe_exit(status: Exited) -> str:
    if status.signal is not None:
        try:
            name = f"{signal.Signals(status.signal).name} (signal {status.signal})"
        except ValueError:
            name = f"signal {status.signal}"
        return (
            f"the training process was killed by {name}, which Shipyard did not send, before it "
            "reported a result"
        )
    code = status.code
    return f"the training process exited with code {code} without reporting a result (a rank was killed)"
