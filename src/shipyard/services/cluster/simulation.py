"""Simulation use cases: read the throughput file and the workload, build the cluster, run."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shipyard.errors import InvalidSpec
from shipyard.hardware.catalog import catalog
from shipyard.planner.shapes import positive
from shipyard.scheduling.framework import profile_named
from shipyard.scheduling.model import Job, RoundPlan, Throughputs
from shipyard.scheduling.policies import DEFAULT_POLICY, policy_named
from shipyard.scheduling.quota import Queues, most_ever, queues_of
from shipyard.schemas.documents import read_document_file
from shipyard.schemas.queues import parse_queue_config
from shipyard.sim.simulator import GAVEL_MECHANISM, SimConfig, SimResult, cluster_nodes, simulate
from shipyard.sim.workload import (
    TraceJob,
    generate_gavel_jobs,
    load_throughputs,
    load_trace,
    with_fabric_slowdown,
)

GAVEL_PRICES_USD_PER_H = {"v100": 0.74, "p100": 0.43, "k80": 0.135}
"""GCP preemptible prices Gavel's simulator uses for its three types (scheduler/utils.py)."""
EXTRA_JOBS = 2000
"""Jobs generated past the measurement window, so the window's last jobs still share the cluster."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimRequest:
    throughputs: Path
    cluster: str
    devices_per_node: int = 4
    policy: str = DEFAULT_POLICY
    workload: str | None = "gavel"
    multi_gpu: bool = False
    rate_per_h: float | None = None
    static_jobs: int | None = None
    jobs: int | None = None
    trace: Path | None = None
    trace_format: str = "gavel"
    seed: int = 0
    window: str | None = None
    round_s: float = 360.0
    restart_cost_s: float = 0.0
    prices: str | None = None
    spread_slowdown: bool = True
    mechanism: str = "shipyard"
    """The round mechanism: Shipyard's, or ``gavel`` (its simulator's, ``GAVEL_MECHANISM``)."""
    queues: Path | None = None
    """A queue configuration (``shipyard queues config`` writes one): quotas, cohorts, borrowing."""
    queue_mix: str | None = None
    """``research=0.7,prod=0.3``: the share of jobs that wait in each local queue (else default)."""
    nodes_per_rack: int = 0
    """Nodes of each rack (0: racks unknown); a gang over several racks then runs slower still
    (``workload.with_fabric_slowdown``)."""
    placement: str = "topology"
    """The placer plugin: ``topology`` (fewest racks) or ``pack`` (fewest nodes, racks unseen)."""


def parse_pairs(text: str, flag: str, number: Callable[[str], float]) -> dict[str, float]:
    """``v100=36,p100=36`` -> {"v100": 36, "p100": 36}, with the flag named in errors."""
    pairs: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        try:
            if not sep:
                raise ValueError
            pairs[name.strip()] = number(value)
        except ValueError:
            raise InvalidSpec(
                f"{flag}: {part!r} is not TYPE=NUMBER", hint=f"e.g. {flag} v100=36,p100=36,k80=36"
            ) from None
    if not pairs:
        raise InvalidSpec(f"{flag} is empty", hint=f"e.g. {flag} v100=36,p100=36,k80=36")
    return pairs


def parse_window(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    start, sep, end = text.partition(":")
    try:
        window = (int(start), int(end))
        if not sep or window[0] < 0 or window[1] <= window[0]:
            raise ValueError
    except ValueError:
        raise InvalidSpec(
            f"--window {text!r} is not START:END with START < END", hint="e.g. --window 4000:5000"
        ) from None
    return window


MECHANISMS: dict[str, dict[str, Any]] = {"shipyard": {}, "gavel": GAVEL_MECHANISM}
"""Round mechanisms by name: SimConfig options over Shipyard's defaults."""
MAX_JOBS = 1_000_000
"""Jobs of one simulation: far past any trace, and a bound on its time and memory."""
MAX_DEVICES = 1_000_000


def run(
    request: SimRequest,
    progress: Callable[[int, int], None] | None = None,
    on_round: Callable[[float, Sequence[Job], RoundPlan], None] | None = None,
) -> SimResult:
    policy = policy_named(request.policy)
    throughputs = load_throughputs(request.throughputs)
    known = sorted({k for _, _, k in throughputs.packed})
    cluster = {k: int(v) for k, v in parse_pairs(request.cluster, "--cluster", int).items()}
    for accelerator_type, count in cluster.items():
        if accelerator_type not in known:
            raise InvalidSpec(
                f"--cluster: type {accelerator_type!r} has no throughputs in {request.throughputs}",
                hint=f"types in that file: {', '.join(known)}",
            )
        positive(f"--cluster {accelerator_type}", count, at_most=MAX_DEVICES)
    positive("--gpus-per-node", request.devices_per_node, at_most=1024)
    if request.nodes_per_rack:
        positive("--nodes-per-rack", request.nodes_per_rack, at_most=MAX_DEVICES)
        throughputs = with_fabric_slowdown(throughputs)
    profile = profile_named(request.placement)
    positive("--round-s", request.round_s, at_most=1e7)
    if not 0 <= request.restart_cost_s <= 1e7:  # NaN fails too
        raise InvalidSpec(
            f"--restart-cost-s must be at least 0 and at most 1e+07, got {request.restart_cost_s:g}",
            hint="e.g. --restart-cost-s 10",
        )
    if request.mechanism not in MECHANISMS:
        raise InvalidSpec(
            f"--mechanism {request.mechanism!r} is not known", hint=f"use one of: {', '.join(MECHANISMS)}"
        )
    window = parse_window(request.window)
    if window is not None and window[1] > MAX_JOBS:
        raise InvalidSpec(f"--window ends past job {MAX_JOBS:,}", hint="simulate at most a million jobs")
    jobs = _jobs(request, throughputs, window)
    if window is not None and window[1] > len(jobs):
        source = f"trace {request.trace}" if request.trace is not None else "workload"
        raise InvalidSpec(
            f"--window {request.window} ends past the {len(jobs):,} jobs of the {source}",
            hint=f"measure jobs within 0:{len(jobs)}, or generate more (--jobs)",
        )
    largest = max(cluster.values())
    too_big = [j for j in jobs if j.devices > largest]
    if too_big:
        raise InvalidSpec(
            f"{len(too_big)} job(s) need up to {max(j.devices for j in too_big)} devices of one type; "
            f"the largest type in --cluster has {largest}",
            hint="give the cluster more devices of one type",
        )
    prices = dict(GAVEL_PRICES_USD_PER_H)
    prices.update({k: s.hourly_usd for k, s in catalog().items() if s.hourly_usd is not None})
    if request.prices:
        prices.update(parse_pairs(request.prices, "--prices", float))
    queues = _queues(request)
    if queues is not None:
        jobs = _in_queues(jobs, queues, request)
    config = SimConfig(
        queues=queues,
        round_s=request.round_s,
        restart_cost_s=request.restart_cost_s,
        window=window,
        seed=request.seed,
        prices=prices,
        spread_slowdown=request.spread_slowdown,
        profile=profile,
        **MECHANISMS[request.mechanism],
    )
    nodes = cluster_nodes(cluster, request.devices_per_node, request.nodes_per_rack)
    return simulate(jobs, nodes, throughputs, policy, config, progress=progress, on_round=on_round)


QUEUE_MIX_SEED = 7
"""Offset of the random stream that puts jobs in queues (apart from the workload's own)."""


def _queues(request: SimRequest) -> Queues | None:
    if request.queues is None:
        if request.queue_mix is not None:
            raise InvalidSpec("--queue-mix needs --queues FILE", hint="give the queue configuration too")
        return None
    text = read_document_file(request.queues, what="queue file")
    return queues_of(parse_queue_config(text, source=str(request.queues)))


def _in_queues(jobs: list[TraceJob], queues: Queues, request: SimRequest) -> list[TraceJob]:
    """Each job in a local queue drawn by the mix's shares (the same jobs for the same seed)."""
    if request.queue_mix is None:
        return jobs
    mix = parse_pairs(request.queue_mix, "--queue-mix", float)
    known = sorted({*queues.local_queues, *queues.cluster_queues})
    example = "e.g. --queue-mix research=0.7,prod=0.3"
    for name, share in mix.items():
        if name not in known:
            where = f"queues in {request.queues}: {', '.join(known)}"
            raise InvalidSpec(f"--queue-mix: no queue {name!r} in {request.queues}", hint=where)
        if not 0 <= share <= 1e6:
            raise InvalidSpec(f"--queue-mix {name}={share:g} is not a share", hint=example)
    if sum(mix.values()) <= 0:
        raise InvalidSpec("--queue-mix gives every queue a share of 0", hint=example)
    draw = random.Random(request.seed + QUEUE_MIX_SEED)
    names, weights = list(mix), list(mix.values())
    placed = [dataclasses.replace(job, queue=draw.choices(names, weights)[0]) for job in jobs]
    _refuse_never_admitted(placed, queues, request)
    return placed


def _refuse_never_admitted(jobs: list[TraceJob], queues: Queues, request: SimRequest) -> None:
    """A gang larger than its queue could ever hold would wait for ever (and so would the run)."""
    for index, job in enumerate(jobs):
        cq = queues.cluster_queue_named(job.queue)
        if cq is None:
            continue  # waits with its reason, as in the live agent; measured jobs then never end
        most = {k: most_ever(queues, cq, k) for k in sorted(cq.nominal)}
        if any(n >= job.devices for n in most.values()):
            continue
        holds = ", ".join(f"{n} {k}" for k, n in most.items())
        raise InvalidSpec(
            f"job {index} ({job.devices} devices, queue {job.queue!r}) can never be admitted: "
            f"{cq.name} holds at most {holds} with its cohort idle",
            hint=f"raise {cq.name}'s nominal quota or borrowing limit in {request.queues}",
        )


def _jobs(request: SimRequest, throughputs: Throughputs, window: tuple[int, int] | None) -> list[TraceJob]:
    if request.trace is not None:
        return load_trace(request.trace, request.trace_format, throughputs, seed=request.seed)
    if request.workload != "gavel":
        raise InvalidSpec(
            f"--workload {request.workload!r} is not known", hint="use --workload gavel, or --trace PATH"
        )
    if request.static_jobs is not None:
        positive("--static-jobs", request.static_jobs, at_most=MAX_JOBS)
        return generate_gavel_jobs(
            throughputs,
            count=request.static_jobs,
            rate_per_h=None,
            multi_gpu=request.multi_gpu,
            seed=request.seed,
        )
    if request.jobs is not None:
        positive("--jobs", request.jobs, at_most=MAX_JOBS)
    if request.rate_per_h is None or not 0 < request.rate_per_h <= 1e6:
        raise InvalidSpec(
            "--workload gavel needs a positive --rate (jobs per hour) or --static-jobs N",
            hint="e.g. --rate 2.4 --window 4000:5000",
        )
    count = request.jobs or (window[1] + EXTRA_JOBS if window else 1000)
    return generate_gavel_jobs(
        throughputs,
        count=count,
        rate_per_h=request.rate_per_h,
        multi_gpu=request.multi_gpu,
        seed=request.seed,
    )
