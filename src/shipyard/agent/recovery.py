"""The restart policy: whether a failed attempt's job runs again by itself, with what, and when;
and how the agent tells a hung attempt and a straggling rank from their heartbeats.

A failure that is the machine's (a signal, a lost process or node, a failed collective, a hang,
out of memory) is retried up to ``restarts.max`` times whatever step it hits, each retry after a
doubling backoff and from the job's newest checkpoint: the kernel's OOM killer or an operator's
kill at one step says nothing of the next attempt. One that is the job's own (a bad spec, a data
error, any other exception) is not retried, unless the spec lists ``error``, and then never when
it recurs at the same step: a retry would meet it again. Out of memory is recovered rather than
retried: the next attempt runs half the micro-batch with twice the gradient accumulation, so every
optimizer step sees the same samples.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shipyard.db import Attempt, Job, Metric
from shipyard.domain import ExitReason
from shipyard.schemas.jobspec import JobSpec, stored_job_spec
from shipyard.schemas.launch import Heartbeat
from shipyard.services.estimates.estimates import memory_levers

MAX_BACKOFF_S = 3600.0
STRAGGLER_RATIO = 1.5
"""A rank whose compute per step is this many times the ranks' median is a straggler."""
MACHINE_REASONS = frozenset(
    {
        ExitReason.SIGNAL,
        ExitReason.LOST,
        ExitReason.NODE_LOST,
        ExitReason.COLLECTIVE,
        ExitReason.HANG,
        ExitReason.OOM,
    }
)
"""Endings that are the machine's, not the job's: retried whatever step they hit."""
RETRIED_REASONS = MACHINE_REASONS | {ExitReason.ERROR}


@dataclass(frozen=True, slots=True)
class Retry:
    """Run the job again: from ``restart_at``, with ``micro_batch_size`` sequences per forward pass."""

    restart_at: datetime
    micro_batch_size: int
    reason: str
    """Why it waits, as ``jobs show`` prints it."""


@dataclass(frozen=True, slots=True)
class GiveUp:
    message: str
    hint: str


def micro_batch_of(job: Job, spec: JobSpec) -> int:
    """The micro-batch the job's next attempt runs (the spec's unless an out-of-memory halved it)."""
    return job.micro_batch_size or spec.training.micro_batch_size


def smaller_micro_batch(micro: int) -> int | None:
    """The largest divisor of ``micro`` at most half of it (so the global batch still divides)."""
    return next((d for d in range(micro // 2, 0, -1) if micro % d == 0), None)


def last_step(session: Session, attempt: Attempt) -> int:
    """The last optimizer step the attempt reached (the one it resumed at, before its first)."""
    return int(session.scalar(select(func.max(Metric.step)).where(Metric.attempt_id == attempt.id)) or 0)


def decide(
    session: Session, job: Job, attempt: Attempt, reason: ExitReason, what: str, now: datetime
) -> Retry | GiveUp | None:
    """What follows the failed ``attempt`` (``what`` says how it failed): a retry, giving up (the
    policy would retry it but may not), or None when the policy never retries such a failure."""
    spec = stored_job_spec(job.spec)
    policy = spec.restarts
    if reason not in RETRIED_REASONS or reason.value not in policy.on:
        return None
    step = last_step(session, attempt)
    earlier = [a for a in job.attempts if a.number < attempt.number]
    restarts = sum(1 for a in earlier if a.exit_reason in RETRIED_REASONS)
    resume = f"shipyard jobs submit SPEC --resume-from {job.id} once the cause is fixed"
    if restarts >= policy.max:
        return GiveUp(
            f"{what}; gave up after {restarts} restart{'s' * (restarts != 1)} (restarts.max {policy.max})",
            f"see `shipyard jobs logs {job.id}`; {resume}",
        )
    micro = attempt.micro_batch_size or spec.training.micro_batch_size
    repeated = [a for a in earlier if a.exit_reason == reason and (a.micro_batch_size or micro) == micro]
    # The job's own exception twice at one step is its code or data meeting the same batch.
    if reason not in MACHINE_REASONS and any(last_step(session, a) == step for a in repeated):
        return GiveUp(
            f"{what}; the same failure at the same step ({step}) as an earlier attempt: a retry "
            "would meet it again",
            f"see `shipyard jobs logs {job.id}`; {resume}",
        )
    next_micro, change = micro, ""
    if reason == ExitReason.OOM:
        smaller = smaller_micro_batch(micro)
        if smaller is None:
            return GiveUp(
                f"{what} with a micro-batch of {micro} sequence: nothing smaller is left to try",
                f"{memory_levers(spec)}lower training.seq_len, spread the model over more devices "
                "(parallelism: fsdp), or fine-tune with finetune.method lora or qlora",
            )
        world = attempt_world(attempt)
        accum = spec.training.global_batch_tokens // (micro * spec.training.seq_len * world)
        next_micro = smaller
        change = (
            f"; micro-batch {micro} -> {smaller}, gradient accumulation {accum} -> "
            f"{accum * micro // smaller}, so the global batch stays "
            f"{spec.training.global_batch_tokens} tokens"
        )
    wait = min(policy.backoff_s * 2**restarts, MAX_BACKOFF_S)
    return Retry(
        restart_at=now + timedelta(seconds=wait),
        micro_batch_size=next_micro,
        reason=f"restart {restarts + 1} of {policy.max} after attempt {attempt.number}: {what} "
        f"at step {step}{change}; resumes from its newest checkpoint",
    )


def attempt_world(attempt: Attempt) -> int:
    """Training processes of the attempt: one per device (a CPU attempt: its cores / threads)."""
    if attempt.accelerator_type == "cpu":
        return max(1, len(attempt.device_ids) // max(1, attempt.threads_per_process))
    return max(1, len(attempt.device_ids))


# --- heartbeats -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Progress:
    """What an attempt's heartbeats say at one look."""

    silent_s: float
    """Since the quietest rank last made progress or, while starting, said it is alive (or since
    the agent began watching, before the first heartbeat): one stopped rank is a hung attempt,
    even while the others beat as they wait for it."""
    limit_s: float
    """How long it may stay silent before it counts as hung."""
    step: int
    stragglers: list[dict[str, float]]
    compute_s: dict[str, float]

    @property
    def hung(self) -> bool:
        return self.silent_s > self.limit_s


@dataclass
class Silence:
    """How long each rank of an attempt has been silent, on the watcher's own monotonic clock: a
    rank is alive when its heartbeat changes, never by comparing the time written in it with the
    watcher's (a wall clock that jumps an hour would make every attempt look hung, or none)."""

    since: float
    """When the watching began (the attempt's launch, or an agent's first look after a restart)."""
    _changed: dict[int, tuple[tuple[float, int, str], float]] = field(default_factory=dict)

    def observe(self, beats: list[Heartbeat], now: float) -> float:
        """Seconds the quietest rank has been silent at ``now``."""
        for beat in beats:
            seen = (beat.at, beat.step, beat.phase)
            before = self._changed.get(beat.rank)
            if before is None or before[0] != seen:
                self._changed[beat.rank] = (seen, now)
        return max(0.0, now - min((at for _, at in self._changed.values()), default=self.since))


def progress(beats: list[Heartbeat], silent_s: float, spec: JobSpec) -> Progress:
    """Hung: a rank silent for max(hang_factor × the median step time, startup_grace_s)."""
    policy = spec.restarts
    newest = max(beats, key=lambda b: b.step, default=None)
    median_step = max((b.median_step_s or 0.0 for b in beats), default=0.0)
    computes = {str(b.rank): b.median_compute_s for b in beats if b.median_compute_s}
    stragglers = []
    if len(computes) > 1:
        typical = statistics.median(computes.values())
        for rank, seconds in computes.items():
            if typical > 0 and seconds / typical >= STRAGGLER_RATIO:
                stragglers.append({"rank": int(rank), "ratio": round(seconds / typical, 2)})
    return Progress(
        silent_s=silent_s,
        limit_s=max(policy.hang_factor * median_step, policy.startup_grace_s),
        step=newest.step if newest else 0,
        stragglers=stragglers,
        compute_s={rank: round(seconds, 4) for rank, seconds in computes.items()},
    )
