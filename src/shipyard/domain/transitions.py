"""How a job moves between states: which moves exist, and what each one sets. Every path that
changes a job's state (submit, claim, launch, exit, preemption, cancel) goes through
``job_transition``, so a final state always has its reason and finish time, and a waiting job's
reason never outlives its wait."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from shipyard.domain import ExitReason, JobState
from shipyard.errors import Conflict

MOVES: Mapping[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.QUEUED}),
}
"""From each state, where a job may go: a running job goes back to queued when it is preempted."""


def job_transition(
    before: str,
    after: JobState,
    *,
    at: datetime,
    exit_reason: ExitReason | None = None,
    message: str | None = None,
    hint: str | None = None,
    pending_reason: str | None = None,
    pending_code: str | None = None,
) -> dict[str, Any]:
    """The columns a job's move from ``before`` to ``after`` sets (for an ORM row or a guarded
    UPDATE alike); ``Conflict`` for a move that does not exist."""
    if after not in MOVES.get(JobState(before), frozenset()):
        raise Conflict(f"a {before} job cannot become {after}", hint="look at the job: its state changed")
    changes: dict[str, Any] = {"state": after, "pending_reason": None, "pending_code": None}
    if after.is_final:
        if exit_reason is None:
            raise ValueError(f"a move to {after} needs its exit reason")
        changes.update(exit_reason=exit_reason, finished_at=at)
    elif after == JobState.QUEUED:
        changes.update(pending_reason=pending_reason, pending_code=pending_code, finished_at=None)
    if message is not None:
        changes["message"] = message
    if hint is not None:
        changes["hint"] = hint
    return changes
