"""Why not: the one status type of the scheduling framework (a stable code a program matches
on, and the message a person reads), shared by filters, quota, the policy and executors."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Reason(StrEnum):
    NO_SUCH_ACCELERATOR = "no_such_accelerator"
    """No node has a device of any type the job allows."""
    GANG_TOO_LARGE = "gang_too_large"
    """The job asks for more devices of one type than the cluster has."""
    INSUFFICIENT_MEMORY = "insufficient_memory"
    """Every allowed type's devices have less memory than the job needs."""
    INSUFFICIENT_DEVICES = "insufficient_devices"
    """Too few free devices of every allowed type now."""
    RANKED_BEHIND = "ranked_behind"
    """There is room, but the policy gave it to jobs it ranks first."""
    NO_SUCH_QUEUE = "no_such_queue"
    QUOTA_EXHAUSTED = "quota_exhausted"
    RECLAIMED = "reclaimed"
    """Preempted: its queue borrowed quota that the owner needs back."""
    PREEMPTED = "preempted"
    """Preempted by the policy; it resumes from its checkpoint."""
    RESIZED = "resized"
    """An elastic job the scheduler resized; it resumes from its checkpoint on its new gang."""
    NODE_LOST = "node_lost"
    """Its last attempt lost a node; it resumes from its last stored checkpoint elsewhere."""
    NODES_DOWN = "nodes_down"
    """Only nodes the cluster knows but has lost (down) could run it: it waits for them."""
    CORDONED = "cordoned"
    """Leased on a node that is unfit for new work (low disk, a failing GPU)."""
    RESTARTING = "restarting"
    """Its last attempt failed in a way the restart policy retries; it waits out the backoff."""
    UNPLACEABLE = "unplaceable"
    """Leased, but the executor found no devices for it on the node."""
    WAITING = "waiting"
    """Not yet seen by a scheduling cycle."""
    HELD_BY_ENGINE = "held_by_engine"
    """Admitted and handed to its engine (a Slurm allocation), which holds it in its own queue."""


@dataclass(frozen=True, slots=True)
class Status:
    """Why a job does not run: what the cycle's plugins, the quota, the policy and the executors
    all answer with, so one job's reason reads the same wherever it was decided."""

    code: Reason
    message: str
    transient: bool = False
    """For an executor's refusal: whether a later pass may succeed (devices busy right now)."""

    def noted(self, note: str) -> Status:
        return Status(self.code, f"{self.message}; {note}", self.transient)


def unplaceable(message: str, *, transient: bool) -> Status:
    """An executor found no devices for an attempt: now (``transient``) or ever on its nodes."""
    return Status(Reason.UNPLACEABLE, message, transient)
