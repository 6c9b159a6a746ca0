"""Words of the platform as types: ids, states and reasons (see DESIGN.md, "Words")."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ExitReason", "JobState"]


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class ExitReason(StrEnum):
    """Why an attempt ended; stored with the attempt and shown by ``jobs show``."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    """Stopped on request; the runtime checkpointed before exiting."""
    PREEMPTED = "preempted"
    """The scheduler gave the devices to another job; the runtime checkpointed, the job requeued."""
    KILLED = "killed"
    """Did not stop within the grace period and was killed."""
    ERROR = "error"
    """The runtime raised; the message is in the attempt's log and exit detail."""
    LOST = "lost"
    """The process vanished without a result (agent restarted, machine rebooted)."""
    NODE_LOST = "node_lost"
    """A node of the attempt left the cluster; the job requeued to resume from its checkpoint."""
