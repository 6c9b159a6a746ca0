"""Admission by quota, in Kueue's words.

A ClusterQueue owns a nominal quota of devices per accelerator type (a flavor, in Kueue) and
belongs to a cohort; LocalQueues (what a job names in ``queue:``) point at a ClusterQueue. A job
is admitted on a type while its ClusterQueue stays within its nominal quota there, or by
borrowing what other ClusterQueues of the cohort leave idle (up to a borrowing limit). When a
queue wants its own quota back, jobs that borrow it are reclaimed: preempted (they checkpoint
first) and requeued.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from shipyard.scheduling.model import Job
from shipyard.scheduling.status import Reason, Status
from shipyard.schemas.queues import QueueConfig

NO_LIMIT = 10**9


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterQueue:
    name: str
    nominal: Mapping[str, int]
    """Devices per accelerator type this queue is guaranteed."""
    cohort: str | None = None
    borrowing_limit: Mapping[str, int] | None = None
    """Most devices per type it may borrow from its cohort; ``None`` means no limit."""
    placement: str | None = None
    """The placer its jobs' gangs get (``framework.PLACERS``); ``None``: the cluster's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Queues:
    cluster_queues: Mapping[str, ClusterQueue]
    local_queues: Mapping[str, str] = field(default_factory=dict)
    """LocalQueue name -> ClusterQueue name; a ClusterQueue's own name also works."""
    catch_all: str | None = None
    """ClusterQueue for queue names nobody declared (None: such jobs wait with a reason)."""

    def cluster_queue_of(self, job: Job) -> ClusterQueue | None:
        return self.cluster_queue_named(job.queue)

    def cluster_queue_named(self, queue: str) -> ClusterQueue | None:
        """The ClusterQueue a job submitted to ``queue`` draws on (None: no queue takes it)."""
        name = self.local_queues.get(queue, queue)
        if name not in self.cluster_queues and self.catch_all is not None:
            name = self.catch_all
        return self.cluster_queues.get(name)

    def placements(self) -> dict[str, str]:
        """The placer of every queue name (local or cluster) whose cluster queue names one."""
        named = {cq.name: cq.placement for cq in self.cluster_queues.values() if cq.placement}
        local = {q: named[cq] for q, cq in self.local_queues.items() if cq in named}
        return {**named, **local}

    @classmethod
    def unlimited(cls, capacity: Mapping[str, int]) -> Queues:
        """One queue with no quota limit: admission never refuses (the default without a
        queue file); only the devices themselves limit what runs."""
        unbounded = dict.fromkeys(capacity, NO_LIMIT)
        return cls(
            cluster_queues={"default": ClusterQueue(name="default", nominal=unbounded)}, catch_all="default"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Devices in use per ClusterQueue and type, and how many of them are borrowed."""

    used: Mapping[str, Mapping[str, int]]
    borrowed: Mapping[str, Mapping[str, int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    jobs: tuple[Job, ...]
    """Admitted jobs, in the order given, each restricted to the types its quota allows now."""
    reasons: Mapping[str, Status]
    """Why each job that was not admitted waits."""
    reclaimed: tuple[str, ...]
    """Running jobs that borrow quota its owner now needs: preempt them."""
    usage: Usage


def queues_of(config: QueueConfig) -> Queues:
    """The scheduler's queues of a queue configuration (a job naming no queue, ``default``, goes
    to the first cluster queue unless one is named so)."""
    cluster_queues = {
        q.name: ClusterQueue(
            name=q.name,
            nominal=dict(q.nominal),
            cohort=q.cohort,
            borrowing_limit=dict(q.borrowing_limit) if q.borrowing_limit is not None else None,
            placement=q.placement,
        )
        for q in config.cluster_queues
    }
    local = dict(config.local_queues)
    if "default" not in local and "default" not in cluster_queues and cluster_queues:
        local["default"] = next(iter(cluster_queues))
    return Queues(cluster_queues=cluster_queues, local_queues=local)


def admit(jobs: Sequence[Job], queues: Queues) -> Admission:
    """Running jobs keep their quota; waiting ones are admitted by priority, then arrival."""
    used: dict[str, dict[str, int]] = {name: {} for name in queues.cluster_queues}
    admitted: list[Job] = []
    reasons: dict[str, Status] = {}
    running = [j for j in jobs if j.running_on is not None]
    waiting = [j for j in jobs if j.running_on is None]
    waiting.sort(key=lambda j: (-j.priority, j.arrival_s, j.id))
    for job in running:
        cq = queues.cluster_queue_of(job)
        if cq is not None and job.running_on is not None:
            used[cq.name][job.running_on] = used[cq.name].get(job.running_on, 0) + job.devices
        admitted.append(job)
    reclaim: list[str] = []
    # Each queue's room per type, computed again only where an admission used some of it:
    # thousands of waiting jobs would otherwise each sum their cohort's quota for every type.
    rooms: dict[tuple[str, str], int] = {}
    for job in waiting:
        cq = queues.cluster_queue_of(job)
        if cq is None:
            known = ", ".join(sorted({*queues.local_queues, *queues.cluster_queues}))
            message = f"queue {job.queue!r} does not exist (queues: {known})"
            reasons[job.id] = Status(Reason.NO_SUCH_QUEUE, message)
            continue
        allowed: list[str] = []
        short: list[str] = []
        for accelerator_type in sorted(cq.nominal):
            if not job.allows(accelerator_type):
                continue
            room = rooms.get((cq.name, accelerator_type))
            if room is None:
                room = rooms[(cq.name, accelerator_type)] = _room(queues, used, cq, accelerator_type)
            if room >= job.devices:
                allowed.append(accelerator_type)
            else:
                short.append(f"{accelerator_type}: {job.devices - room} more needed")
                reclaim += _reclaimable(queues, used, cq, accelerator_type, job, running)
        if not allowed:
            where = f"in cohort {cq.cohort}" if cq.cohort else f"in queue {cq.name}"
            detail = "; ".join(short) or "no quota for the types it asks for"
            reasons[job.id] = Status(Reason.QUOTA_EXHAUSTED, f"quota exhausted {where} ({detail})")
            continue
        # Count the job against the first type that has room, so later jobs see it.
        first = allowed[0]
        used[cq.name][first] = used[cq.name].get(first, 0) + job.devices
        for member in _cohort(queues, cq):  # their room is the cohort's idle quota too
            rooms.pop((member.name, first), None)
        admitted.append(replace(job, accelerator_types=tuple(allowed)))
    # In the order given (the policies' tie-breaks follow it), not the order of admission.
    by_id = {j.id: j for j in admitted}
    return Admission(
        jobs=tuple(by_id[j.id] for j in jobs if j.id in by_id),
        reasons=reasons,
        reclaimed=tuple(dict.fromkeys(reclaim)),
        usage=usage_of(queues, used),
    )


def most_ever(queues: Queues, cq: ClusterQueue, accelerator_type: str) -> int:
    """Devices of a type the queue could hold with the whole cohort idle: a gang larger than
    this on every type it allows waits for ever."""
    return _room(queues, {q: {} for q in queues.cluster_queues}, cq, accelerator_type)


def _cohort(queues: Queues, cq: ClusterQueue) -> list[ClusterQueue]:
    if cq.cohort is None:
        return [cq]
    return [q for q in queues.cluster_queues.values() if q.cohort == cq.cohort]


Used = Mapping[str, Mapping[str, int]]


def _room(queues: Queues, used: Used, cq: ClusterQueue, accelerator_type: str) -> int:
    """Devices of a type the queue may still take: its own idle quota plus what it may borrow,
    never more than the cohort has idle (quota lent out comes back only by reclaiming)."""
    own = cq.nominal.get(accelerator_type, 0) - used[cq.name].get(accelerator_type, 0)
    idle = sum(
        q.nominal.get(accelerator_type, 0) - used[q.name].get(accelerator_type, 0)
        for q in _cohort(queues, cq)
    )
    if cq.borrowing_limit is None:
        allowed = idle
    else:
        borrowed_now = max(0, -own)
        allowed = max(own, 0) + max(0, cq.borrowing_limit.get(accelerator_type, 0) - borrowed_now)
    return max(0, min(idle, allowed))


def _reclaimable(
    queues: Queues,
    used: Mapping[str, Mapping[str, int]],
    cq: ClusterQueue,
    accelerator_type: str,
    job: Job,
    running: Sequence[Job],
) -> list[str]:
    """Borrowers to preempt so that ``job`` fits in its own queue's nominal quota."""
    own = cq.nominal.get(accelerator_type, 0) - used[cq.name].get(accelerator_type, 0)
    if own < job.devices:
        return []  # over its own quota: it may only borrow, never reclaim
    borrowers = []
    for other in running:
        other_cq = queues.cluster_queue_of(other)
        if other_cq is None or other_cq.name == cq.name or other_cq.cohort != cq.cohort:
            continue
        if other.running_on != accelerator_type:
            continue
        over = used[other_cq.name].get(accelerator_type, 0) - other_cq.nominal.get(accelerator_type, 0)
        if over > 0:
            borrowers.append(other)
    # Lowest priority, most recently arrived first.
    borrowers.sort(key=lambda j: (j.priority, -j.arrival_s))
    freed, chosen = 0, []
    idle = _room(queues, used, cq, accelerator_type)
    for other in borrowers:
        if idle + freed >= job.devices:
            break
        chosen.append(other.id)
        freed += other.devices
    return chosen if idle + freed >= job.devices else []


def usage_of(queues: Queues, used: Mapping[str, Mapping[str, int]]) -> Usage:
    """Devices in use per ClusterQueue and type (every queue in ``used``), and what is borrowed."""
    borrowed = {
        name: {k: max(0, n - cq.nominal.get(k, 0)) for k, n in used[name].items() if n > cq.nominal.get(k, 0)}
        for name, cq in queues.cluster_queues.items()
    }
    return Usage(used={k: dict(v) for k, v in used.items()}, borrowed=borrowed)
