"""What Sia's program knows of each job's speed when it decides, as Sia's simulator keeps it.

Sia does not know a job's curve: it records the step time of every configuration the job ran
on (``job.py: update_params``), fits Pollux's model to them per GPU type (``sim.pollux``), and
scores each candidate configuration with that fit at the job's fixed batch. A type the job has
not run on borrows the fit of the first type it has (in the cluster's order), its gang counted
in that type's nodes, scaled by the two types' one-GPU speeds in Sia's profiles
(``sia.py: _compute_goodputs_v2``, ``cluster.py: compute_throughput_ratios``). A job that never
ran has no fit: Sia then offers it one GPU of any type, all alike (the simulator's own rule).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from shipyard.sim.pollux import PerfParams, fit
from shipyard.sim.sia_workload import Application, SiaWorkload, placement_of

Config = tuple[str, int]
"""(GPU type, GPUs)."""
RESTART_PENALTY_S = {"deepspeech2": 25, "imagenet": 250, "cifar10": 30, "bert": 120, "yolov3": 45}
"""What Sia's program charges a restart (``sia.py: get_restart_penalty``; 30 s otherwise), which is
not what its job model makes a restart cost (``sia_workload.RESTART_S``)."""


class SiaBeliefs:
    """Each job's fitted speeds, learned from the configurations the simulator ran it on."""

    def __init__(
        self,
        jobs: Sequence[tuple[str, int]],
        apps: Mapping[tuple[str, str], Application],
        per_node: Mapping[str, int],
    ) -> None:
        """``jobs``: each job's (application, global batch), in the simulator's order;
        ``apps``: (application, GPU type) -> its profiles; ``per_node``: GPUs per node by type,
        in the cluster's order."""
        self.jobs = list(jobs)
        self.apps = apps
        self.per_node = dict(per_node)
        self._profiles: dict[tuple[int, str], dict[tuple[int, int, float], tuple[float, float]]] = {}
        self._fits: dict[tuple[int, str], PerfParams] = {}
        self._rates: dict[int, dict[Config, float]] = {}
        """Each job's rates since its last fit (asked every round, changed only by a new fit)."""

    def ran(self, index: int, gpu: str, count: int) -> None:
        """The job ran a round on ``count`` GPUs of ``gpu``: its step time there joins its profile."""
        name, batch = self.jobs[index]
        placement = placement_of(count, self.per_node[gpu])
        iteration = self.apps[(name, gpu)].iteration(placement, batch)
        if iteration is None:
            return
        profile = self._profiles.setdefault((index, gpu), {})
        key = (len(placement), count, float(iteration.atomic_bsz))
        if key not in profile:
            profile[key] = (iteration.step_s, iteration.sync_s)
            self._fits[(index, gpu)] = fit(profile)
            self._rates.pop(index, None)

    def restart_s(self, index: int) -> float:
        """Seconds Sia's program believes a restart of the job costs."""
        return float(RESTART_PENALTY_S.get(self.jobs[index][0], 30))

    def rates(self, index: int, configs: Sequence[Config]) -> dict[Config, float] | None:
        """Iterations per second the fit gives each configuration; None before the job ran."""
        fitted = [gpu for gpu in self.per_node if (index, gpu) in self._fits]
        if not fitted:
            return None
        name, batch = self.jobs[index]
        out = self._rates.setdefault(index, {})
        for gpu, count in configs:
            if (gpu, count) in out:
                continue
            source = gpu if gpu in fitted else fitted[0]
            nodes = math.ceil(count / self.per_node[source])
            speed = _samples_per_s(
                self._fits[(index, source)], self.apps[(name, source)], nodes, count, batch
            )
            out[(gpu, count)] = (
                speed * _one_gpu_ratio(self.apps[(name, gpu)], self.apps[(name, source)]) / batch
            )
        return out


def beliefs_of(workload: SiaWorkload) -> SiaBeliefs:
    """Sia's knowledge of the workload's jobs before any ran."""
    return SiaBeliefs(workload.batches, workload.apps, workload.per_node)


def _samples_per_s(params: PerfParams, app: Application, nodes: int, replicas: int, batch: int) -> float:
    """Pollux's throughput at a fixed global batch (``GoodputFunction.optimize`` with batch size
    tuning off); 0 where the per-GPU batch falls outside what the type was profiled with."""
    eps = 1e-8
    local = batch / replicas
    accum = math.ceil(local / app.max_local_bsz_app - eps) - 1
    if replicas == 1 and local > app.init_batch + eps:
        accum = max(accum, 1)
    atomic = math.ceil(local / (accum + 1) - eps)
    if not app.min_local_bsz <= atomic <= app.max_local_bsz_app:
        return 0.0
    return batch / params.step_s(nodes, replicas, atomic, accum)


def _one_gpu_ratio(target: Application, source: Application) -> float:
    """How much faster one GPU of the target type runs the application than one of the source's:
    the largest per-GPU batch over the longest step, of each type's one-GPU profiles."""
    if target is source:
        return 1.0

    def speed(app: Application) -> float:
        one = [r for r in app.placements if r["num_replicas"] == 1]
        return max(r["local_bsz"] for r in one) / max(r["step_time"] for r in one)

    return speed(target) / speed(source)
