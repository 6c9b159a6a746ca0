"""Sia's workloads (SOSP 2023) as the simulator's jobs, on Sia's heterogeneous cluster.

Sia's simulator (``sia-simulator`` in the ``siasosp23/artifacts`` repository) advances each job
by its goodput: the iterations per second of its placement (``applications.py:
get_throughput``, from the profiled ``placements-*.csv`` and ``scalability-*.csv`` of each GPU
type, interpolated), times the statistical efficiency of its batch at its epoch
(``job.py: step``, from the gradient statistics of ``validation-*.csv``), times a calibration
factor fitted to its physical runs (``simulator_config.SLOWDOWNS``). With the batch size fixed
(``--disable_bsz_tuning``, which Shipyard's jobs always are: the global batch is the spec's), the
efficiency depends on the epoch alone, so a job's whole run is a fixed number of
efficiency-weighted steps, and its speed on a gang is the calibrated iterations per second of
that gang: exactly the simulator's ``total_steps`` and throughput per (type, count). This module
reads Sia's own trace files into those, and the cluster into nodes.

Where Sia's job model has a constant (epochs per application, restart seconds, calibration),
it is named below with the file it comes from.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from shipyard.errors import InvalidSpec
from shipyard.scheduling.model import Node, Throughputs
from shipyard.sim.workload import TraceJob

CLUSTER: Mapping[str, tuple[int, int]] = {"aws": (6, 4), "dgx-ext": (2, 8), "rtx": (3, 8)}
"""Sia's default cluster (``simulator_config.cluster_nnodes``, ``cluster_ngpus_per_node``):
GPU type -> (nodes, GPUs per node): 24 T4, 16 A100 and 24 RTX 2080 Ti."""
MAX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
"""``applications.py: APPLICATIONS``; no application sets a target metric, so each runs them all."""
RESTART_S = {"cifar10": 50, "deepspeech2": 25, "bert": 120, "yolov3": 80, "imagenet": 250, "ncf": 15}
"""Seconds of checkpoint and restore each (re)start costs (``Application.rescale_time``)."""
SLOWDOWNS = {"cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2, "deepspeech2": 1.2, "ncf": 1.5}
"""Real runs over simulated ones (``simulator_config.SLOWDOWNS``): goodput is divided by it."""


def _rows(path: Path) -> list[dict[str, float]]:
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _placement_id(placement: Sequence[int]) -> int:
    """Sia's key of a placement: GPUs per node, the lexicographically smallest rotation."""
    kept = tuple(p for p in placement if p)
    smallest = min(kept[i:] + kept[:i] for i in range(len(kept)))
    return int("".join(map(str, smallest)))


@dataclass
class Application:
    """One of Sia's applications on one GPU type: its profiled step times, its gradient
    statistics by batch size and epoch."""

    name: str
    gpu: str
    placements: list[dict[str, float]]
    scalability: list[dict[str, float]]
    validation: dict[int, list[dict[str, float]]]
    max_epochs: int
    _max_local: dict[int, float] = field(default_factory=dict)

    @classmethod
    def load(cls, traces: Path, name: str, gpu: str) -> Application:
        folder = traces / name
        validation = {int(p.stem.split("-")[-1]): _rows(p) for p in sorted(folder.glob("validation-*.csv"))}
        placements = _rows(folder / f"placements-{gpu}.csv")
        for row in placements:
            digits = str(int(row["placement"]))
            row["num_nodes"], row["num_replicas"] = len(digits), sum(map(int, digits))
        return cls(
            name=name,
            gpu=gpu,
            placements=placements,
            scalability=_rows(folder / f"scalability-{gpu}.csv"),
            validation=dict(sorted(validation.items())),
            max_epochs=MAX_EPOCHS.get(name, min(map(len, validation.values()))),
        )

    @property
    def init_batch(self) -> int:
        return min(self.validation)

    @property
    def max_batch(self) -> int:
        return max(self.validation)

    @property
    def min_local_bsz(self) -> float:
        return min(r["local_bsz"] for r in self.placements)

    @property
    def max_local_bsz_app(self) -> float:
        return (
            57.0
            if (self.name, self.gpu) == ("deepspeech2", "rtx")
            else max(r["local_bsz"] for r in self.placements)
        )

    def progress(self, epoch: int) -> float:
        """Efficiency-weighted progress when ``epoch`` epochs are done (``get_progress``)."""
        if epoch == 0:
            return 0.0
        return min(rows[epoch - 1]["progress"] for rows in self.validation.values())

    def grad_stats(self, batch: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) at this batch and epoch, interpolated between the validated
        batch sizes around it (``get_grad_stats``)."""
        sizes = list(self.validation)
        lower = max((b for b in sizes if b <= batch), default=sizes[0])
        upper = min((b for b in sizes if b >= batch), default=sizes[-1])
        lo, hi = self.validation[lower][epoch], self.validation[upper][epoch]
        if lower == upper:
            return lo["grad_sqr"], lo["grad_var"]
        w = (batch - lower) / (upper - lower)
        return (1 - w) * lo["grad_sqr"] + w * hi["grad_sqr"], (1 - w) * lo["grad_var"] + w * hi["grad_var"]

    def steps_to_finish(self, batch: float) -> float:
        """Iterations the job runs at this batch: each epoch's progress over the statistical
        efficiency of the batch in that epoch (``job.py: step``'s ``gain``)."""
        scale = batch / self.init_batch
        total = 0.0
        for epoch in range(self.max_epochs):
            sqr, var = self.grad_stats(batch, epoch)
            gain = (var + sqr) / (var / scale + sqr)
            total += (self.progress(epoch + 1) - self.progress(epoch)) / gain
        return total

    def max_local_bsz(self, placement: tuple[int, ...]) -> float:
        """The largest per-GPU batch profiled for this placement (``get_max_local_bsz``)."""
        key = _placement_id(placement)
        if key not in self._max_local:
            same = [r["local_bsz"] for r in self.placements if r["placement"] == key]
            if same:
                self._max_local[key] = max(same)
            else:
                nodes, replicas = len(placement), sum(placement)
                wider = [
                    r["local_bsz"]
                    for r in self.scalability
                    if r["num_nodes"] >= nodes and r["num_replicas"] >= replicas
                ]
                self._max_local[key] = max(wider, default=math.nan)
        return self._max_local[key]

    def step_time(self, placement: tuple[int, ...], atomic_bsz: float) -> tuple[float, float] | None:
        """(step, sync) seconds of one iteration at this per-GPU batch (``get_throughput``):
        interpolated over batch sizes where the placement was profiled, else over (nodes, GPUs,
        batch) among every profile; None outside what was profiled."""
        key = _placement_id(placement)
        same = sorted((r for r in self.placements if r["placement"] == key), key=lambda r: r["local_bsz"])
        if same:
            xs = [r["local_bsz"] for r in same]
            if not xs[0] <= atomic_bsz <= xs[-1]:
                return None
            return (
                float(np.interp(atomic_bsz, xs, [r["step_time"] for r in same])),
                float(np.interp(atomic_bsz, xs, [r["sync_time"] for r in same])),
            )
        point = (min(len(placement), 16), sum(placement), atomic_bsz)
        value = self._interpolator(point)
        return None if value is None or not all(map(math.isfinite, value)) else value

    def _interpolator(self, point: tuple[float, float, float]) -> tuple[float, float] | None:
        from scipy.interpolate import LinearNDInterpolator

        try:
            found = LinearNDInterpolator(self._profiles[0], self._profiles[1])([point])[0]
        except ValueError:
            return None
        return float(found[0]), float(found[1])

    @cached_property
    def _profiles(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean step and sync time per (nodes, GPUs, batch) of the placements, with the
        scalability profiles after them, as Sia's interpolation reads them."""
        grouped: dict[tuple[float, float, float], list[tuple[float, float]]] = {}
        for r in self.placements:
            grouped.setdefault((r["num_nodes"], r["num_replicas"], r["local_bsz"]), []).append(
                (r["step_time"], r["sync_time"])
            )
        xs = sorted(grouped)
        ys = [tuple(np.mean(grouped[key], axis=0)) for key in xs]
        for r in self.scalability:
            xs.append((r["num_nodes"], r["num_replicas"], r["local_bsz"]))
            ys.append((r["step_time"], r["sync_time"]))
        return np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)

    def iteration(self, placement: tuple[int, ...], batch: int) -> Iteration | None:
        """How a job of this global batch runs an iteration on this placement: its per-GPU
        batch and accumulation chosen as Sia's ``update_local_bsz`` does with batch size tuning
        off, and the profiled seconds of a pass; None where the placement cannot run it."""
        replicas = sum(placement)
        local = math.ceil(batch / replicas - 1e-8)
        if local < self.min_local_bsz:
            return None
        max_local = self.max_local_bsz(placement)
        if not math.isfinite(max_local):
            return None
        accum = math.ceil(local / max_local - 1e-8) - 1
        if replicas == 1 and batch > self.init_batch:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        profiled = [r["local_bsz"] for r in self.placements if r["num_replicas"] == replicas]
        if profiled:  # memory: no more per GPU than was ever profiled at this many GPUs
            atomic = int(min(atomic, max(profiled)))
        atomic = min(atomic, int(self.max_batch / (replicas * (accum + 1))))
        times = self.step_time(placement, atomic)
        if times is None:
            return None
        return Iteration(atomic_bsz=atomic, accum=accum, step_s=times[0], sync_s=times[1])

    def iterations_per_s(self, placement: tuple[int, ...], batch: int) -> float | None:
        """Calibrated iterations per second of a job of this global batch on this placement."""
        if (it := self.iteration(placement, batch)) is None:
            return None
        seconds = it.step_s + it.accum * (it.step_s - it.sync_s)
        return 1.0 / seconds / SLOWDOWNS.get(self.name, 1.0) if seconds > 0 else None


@dataclass(frozen=True, slots=True)
class Iteration:
    atomic_bsz: int
    accum: int
    """Passes before the last, whose gradients accumulate."""
    step_s: float
    """Seconds of the last pass, its exchange included."""
    sync_s: float
    """Of which the exchange no computation hid."""


def placement_of(count: int, per_node: int) -> tuple[int, ...]:
    """GPUs per node of a gang of ``count`` on a type: one node, or whole nodes."""
    return (count,) if count <= per_node else (per_node,) * (count // per_node)


def gang_sizes(nodes: int, per_node: int) -> list[tuple[int, ...]]:
    """The placements Sia allocates on a type (``sia.py``: ``CONFIGS_4GPU``, ``CONFIGS_8GPU``):
    1, 2, 4 (and 8) GPUs on one node, then whole nodes."""
    counts = [n for n in (1, 2, 4, 8) if n <= per_node] + [per_node * k for k in range(2, nodes + 1)]
    return [placement_of(n, per_node) for n in counts]


@dataclass(frozen=True, slots=True)
class SiaWorkload:
    jobs: list[TraceJob]
    nodes: list[Node]
    throughputs: Throughputs
    names: list[str]
    """Each job's name in the workload file (Sia's logs name jobs by it), in ``jobs``' order."""
    batches: list[tuple[str, int]]
    """Each job's application and global batch, in ``jobs``' order."""
    apps: Mapping[tuple[str, str], Application]
    """(application, GPU type) -> its profiles."""
    per_node: Mapping[str, int]
    """GPUs per node of each type, in the cluster's order."""


def load_sia(workload: Path, traces: Path, cluster: Mapping[str, tuple[int, int]] = CLUSTER) -> SiaWorkload:
    """Sia's workload file (``name,time,application,num_replicas,batch_size``) as elastic jobs of
    fixed global batch on Sia's cluster: each may run at any of Sia's placements its batch allows,
    at the iterations per second Sia's model gives that placement, for the iterations its batch
    needs; a restart costs Sia's seconds for its application."""
    try:
        with open(workload, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise InvalidSpec(
            f"cannot read Sia workload {workload}: {exc.strerror}", hint="check the path"
        ) from None
    apps: dict[tuple[str, str], Application] = {}
    packed: dict[tuple[str, int, str], float] = {}
    jobs = []
    for row in rows:
        name, batch = row["application"], int(float(row["batch_size"]))
        job_type = f"{name}-{batch}"
        sizes: set[int] = set()
        for gpu, (count, per_node) in cluster.items():
            app = apps.setdefault((name, gpu), Application.load(traces, name, gpu))
            for placement in gang_sizes(count, per_node):
                key = (job_type, sum(placement), gpu)
                if key not in packed and (rate := app.iterations_per_s(placement, batch)) is not None:
                    packed[key] = rate
                if key in packed:
                    sizes.add(sum(placement))
        reference = apps[(name, next(iter(cluster)))]
        ordered = tuple(sorted(sizes))
        restart_s = float(RESTART_S.get(name, 30))
        jobs.append(
            TraceJob(
                job_type=job_type,
                devices=ordered[0],
                total_steps=reference.steps_to_finish(batch),
                arrival_s=float(row["time"]),
                sizes=ordered,
                resize_s=restart_s,
                restart_s=restart_s,
            )
        )
    nodes = [
        Node(id=f"{gpu}-{i}", accelerator_type=gpu, devices=per_node)
        for gpu, (count, per_node) in cluster.items()
        for i in range(count)
    ]
    return SiaWorkload(
        jobs=jobs,
        nodes=nodes,
        throughputs=Throughputs(packed=packed),
        names=[row["name"] for row in rows],
        batches=[(row["application"], int(float(row["batch_size"]))) for row in rows],
        apps=apps,
        per_node={gpu: per_node for gpu, (_, per_node) in cluster.items()},
    )
