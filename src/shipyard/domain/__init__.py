"""Words of the platform as types: ids, states and reasons (docs/architecture.md names them)."""

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
    RESIZED = "resized"
    """The scheduler changed an elastic job's size; the runtime checkpointed, the job requeued to
    resume on the new gang."""
    KILLED = "killed"
    """Did not stop within the grace period and was killed."""
    ERROR = "error"
    """The runtime raised; the message is in the attempt's log and exit detail."""
    LOST = "lost"
    """The process vanished without a result (agent restarted, machine rebooted)."""
    NODE_LOST = "node_lost"
    """A node of the attempt left the cluster; the job requeued to resume from its checkpoint."""
    SIGNAL = "signal"
    """Killed by a signal nobody in Shipyard sent (the kernel's OOM killer, an operator)."""
    COLLECTIVE = "collective"
    """A collective of the process group failed (NCCL, gloo): a peer died or the network broke."""
    HANG = "hang"
    """No step for longer than the restart policy allows; its stacks were dumped into its log."""
    OOM = "oom"
    """Out of device memory; a retry halves the micro-batch and doubles gradient accumulation."""
    TIME_LIMIT = "time_limit"
    """Its engine's time limit (a Slurm allocation's) ended it after the runtime checkpointed at
    the warning; the job requeued to continue in a new allocation."""
