"""Workloads for the simulator: Gavel's throughput files and job generator, and the Gavel,
Philly, Sia and Alibaba trace formats.

The generator draws the jobs Gavel's simulator draws for the same seed (Narayanan et al., OSDI
2020, ``scheduler/utils.py: generate_job`` and ``scheduler.py: _initialize_seeds``), job for job:
from one random stream seeded ``seed + 2``, a scale factor from the Philly mix (70 % one device,
10 % two, 15 % four, 5 % eight; drawn even when every job is single-device), a duration of
60 * 10^U(1.5, 3) s for 80 % of jobs and 60 * 10^U(3, 4) s for the rest, then a job type drawn
uniformly in the order of Gavel's job table, drawn again while it cannot run on that many devices;
steps = duration x the type's throughput on the reference type (V100); exponential inter-arrival
times from a second stream seeded ``seed + 3``.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

from shipyard.errors import InvalidSpec
from shipyard.scheduling.model import Throughputs

REFERENCE_TYPE = "v100"
SCALE_FACTORS = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceJob:
    job_type: str
    devices: int
    total_steps: float
    arrival_s: float
    priority: float = 1.0
    accelerator_types: tuple[str, ...] = ()
    queue: str = "default"
    """The local queue it waits in (quota admission, with ``SimConfig.queues``)."""
    min_memory_gib: float = 0.0
    """Memory each device must have (nodes that report less are not its to run on)."""
    sizes: tuple[int, ...] = ()
    """Device counts an elastic job may run at, smallest first (``devices`` is the smallest);
    empty: rigid, always ``devices``."""
    resize_s: float = 0.0
    """Seconds one resize costs it: checkpoint, restart, reload (else the config's restart cost)."""
    restart_s: float | None = None
    """Seconds every restart of it costs, a move to another type or a resume after preemption
    as much as a resize (Sia's job model); None: the config's restart cost."""


def load_throughputs(path: Path) -> Throughputs:
    """Gavel's JSON: {type: {"(job_type, scale_factor)": {"null": steps/s, ...}}}; a
    ``<type>_unconsolidated`` entry gives the figure for a gang spread over nodes."""
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise InvalidSpec(f"cannot read throughputs {path}: {exc.strerror}", hint="check the path") from None
    except json.JSONDecodeError as exc:
        raise InvalidSpec(
            f"throughputs {path} is not valid JSON (line {exc.lineno}: {exc.msg})",
            hint="give a Gavel-format throughput file",
        ) from None
    if not isinstance(raw, dict) or not raw:
        raise InvalidSpec(
            f"throughputs {path} holds no accelerator types", hint="give a Gavel-format throughput file"
        )
    packed: dict[tuple[str, int, str], float] = {}
    spread: dict[tuple[str, int, str], float] = {}
    for type_name, table in raw.items():
        accelerator_type, _, variant = type_name.partition("_")
        if not isinstance(table, dict):
            raise InvalidSpec(f"throughputs {path}: {type_name!r} is not a table", hint="see Gavel's format")
        for key, values in table.items():
            try:
                job_type, devices = ast.literal_eval(key)
                steps_per_s = float(values["null"])
            except (ValueError, SyntaxError, TypeError, KeyError):
                raise InvalidSpec(
                    f"throughputs {path}: {type_name} entry {key!r} is not ('job type', scale factor) -> "
                    '{"null": steps/s}',
                    hint="see Gavel's simulation_throughputs.json",
                ) from None
            target = spread if variant == "unconsolidated" else packed
            target[(str(job_type), int(devices), accelerator_type)] = steps_per_s
    return Throughputs(packed=packed, spread=spread)


def job_types(throughputs: Throughputs) -> dict[str, tuple[int, ...]]:
    """Job type -> the gang sizes it was measured with on the reference type."""
    sizes: dict[str, set[int]] = {}
    for job_type, devices, accelerator_type in throughputs.packed:
        if accelerator_type == REFERENCE_TYPE or REFERENCE_TYPE not in _types(throughputs):
            sizes.setdefault(job_type, set()).add(devices)
    return {t: tuple(sorted(s)) for t, s in sorted(sizes.items())}


def _types(throughputs: Throughputs) -> set[str]:
    return {k for _, _, k in throughputs.packed}


def _reference(throughputs: Throughputs) -> str:
    types = _types(throughputs)
    return REFERENCE_TYPE if REFERENCE_TYPE in types else sorted(types)[0]


GAVEL_JOB_TABLE: tuple[str, ...] = (
    *(f"ResNet-18 (batch size {b})" for b in (16, 32, 64, 128, 256)),
    *(f"ResNet-50 (batch size {b})" for b in (16, 32, 64, 128)),
    *(f"Transformer (batch size {b})" for b in (16, 32, 64, 128, 256)),
    *(f"LM (batch size {b})" for b in (5, 10, 20, 40, 80)),
    *(f"Recommendation (batch size {b})" for b in (512, 1024, 2048, 4096, 8192)),
    "A3C",
    "CycleGAN",
)
"""Gavel's job types in the order of its job table (``scheduler/job_table.py``), the order its
generator draws them in; a throughput file's own order differs (A3C comes before LM there)."""


def draw_order(throughputs: Throughputs) -> list[str]:
    """The job types to draw from: Gavel's table order for its types, then any others sorted."""
    known = job_types(throughputs)
    return [t for t in GAVEL_JOB_TABLE if t in known] + sorted(set(known) - set(GAVEL_JOB_TABLE))


def _scale_factor(rng: random.Random) -> int:
    r = rng.uniform(0, 1)  # Gavel's closed bounds: r == 0.8 gives 2, r == 0.95 gives 4
    if 0.7 <= r <= 0.8:
        return 2
    if 0.8 <= r <= 0.95:
        return 4
    if r >= 0.95:
        return 8
    return 1


def _duration_s(rng: random.Random) -> float:
    if rng.random() >= 0.8:
        return 60 * 10 ** rng.uniform(3, 4)
    return 60 * 10 ** rng.uniform(1.5, 3)


def generate_gavel_jobs(
    throughputs: Throughputs, *, count: int, rate_per_h: float | None, multi_gpu: bool, seed: int
) -> list[TraceJob]:
    """``count`` jobs, the first ``count`` Gavel generates for ``seed``; Poisson arrivals at
    ``rate_per_h`` jobs per hour, or all at t=0 when None."""
    attributes = random.Random(seed + 2)  # Gavel's scheduler: _job_generator
    arrivals = random.Random(seed + 3)  # and _interarrival_time_generator
    sizes = job_types(throughputs)
    order = draw_order(throughputs)
    reference = _reference(throughputs)
    jobs: list[TraceJob] = []
    arrival = 0.0
    for _ in range(count):
        devices = _scale_factor(attributes)
        duration = _duration_s(attributes)
        if not multi_gpu:
            devices = 1
        if not any(devices in sizes[t] for t in order):
            raise InvalidSpec(
                f"no job type in the throughput file was measured on {devices} devices",
                hint="generate single-device jobs, or give a file with multi-device throughputs",
            )
        while True:
            job_type = attributes.choice(order)
            if devices in sizes[job_type]:
                break
        steps = duration * throughputs.packed[(job_type, devices, reference)]
        jobs.append(TraceJob(job_type=job_type, devices=devices, total_steps=steps, arrival_s=arrival))
        if rate_per_h is not None:
            arrival += -math.log(1.0 - arrivals.random()) * 3600.0 / rate_per_h
    return jobs


def load_trace(path: Path, fmt: str, throughputs: Throughputs, *, seed: int) -> list[TraceJob]:
    loaders = {"gavel": _gavel_trace, "philly": _philly_trace, "sia": _sia_trace, "alibaba": _alibaba_trace}
    if fmt not in loaders:
        raise InvalidSpec(f"unknown trace format {fmt!r}", hint=f"use one of: {', '.join(loaders)}")
    if not path.is_file():
        raise InvalidSpec(f"trace {path} does not exist", hint="check the path")
    jobs = loaders[fmt](path, throughputs, random.Random(seed))
    if not jobs:
        raise InvalidSpec(f"trace {path} holds no jobs", hint=f"is it really in {fmt} format?")
    first = min(j.arrival_s for j in jobs)
    return sorted(
        (
            TraceJob(
                job_type=j.job_type,
                devices=j.devices,
                total_steps=j.total_steps,
                arrival_s=j.arrival_s - first,
                priority=j.priority,
                accelerator_types=j.accelerator_types,
            )
            for j in jobs
        ),
        key=lambda j: j.arrival_s,
    )


def _bad_line(path: Path, line: int, why: str, hint: str) -> InvalidSpec:
    return InvalidSpec(f"trace {path}, line {line}: {why}", hint=hint)


def _gavel_trace(path: Path, throughputs: Throughputs, _rng: random.Random) -> list[TraceJob]:
    """Gavel's tab-separated traces, v1 (7 fields) and v2 (10 fields), or the JSON a run of Gavel's
    simulator writes (``run_gavel.py --out``: its generated jobs under ``trace``)."""
    text = path.read_text()
    if text.lstrip().startswith("{"):
        return _gavel_run(path, text, throughputs)
    known = job_types(throughputs)
    jobs = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        try:
            if len(fields) == 7:
                job_type, steps, arrival, devices, weight = fields[0], fields[4], fields[5], fields[6], "1"
            elif len(fields) == 10:
                job_type, steps, devices, weight, arrival = (
                    fields[0],
                    fields[5],
                    fields[6],
                    fields[7],
                    fields[9],
                )
            else:
                raise ValueError(f"{len(fields)} tab-separated fields, expected 7 (v1) or 10 (v2)")
            job = TraceJob(
                job_type=job_type,
                devices=int(devices),
                total_steps=float(steps),
                arrival_s=float(arrival),
                priority=float(weight),
            )
        except ValueError as exc:
            raise _bad_line(
                path, number, str(exc), "a Gavel trace line is job_type<TAB>command<TAB>..."
            ) from None
        if job.job_type not in known:
            raise _bad_line(
                path,
                number,
                f"job type {job.job_type!r} is not in the throughput file",
                "use the throughput file the trace was made for",
            )
        jobs.append(job)
    return jobs


def _gavel_run(path: Path, text: str, throughputs: Throughputs) -> list[TraceJob]:
    """``{"trace": [[arrival_s, job_type, scale_factor, total_steps], ...]}``; errors name the
    entry by its place in that list (the file is one line)."""
    try:
        rows = json.loads(text)["trace"]
        if not isinstance(rows, list):
            raise TypeError
    except (json.JSONDecodeError, KeyError, TypeError):
        raise InvalidSpec(
            f'trace {path} is neither a Gavel trace nor JSON with a "trace" list',
            hint="give a tab-separated Gavel trace or the file run_gavel.py --out writes",
        ) from None
    known = job_types(throughputs)
    jobs = []
    for index, row in enumerate(rows):
        where = f"trace entry {index}"
        try:
            arrival, job_type, devices, steps = row
            job = TraceJob(
                job_type=str(job_type),
                devices=int(devices),
                total_steps=float(steps),
                arrival_s=float(arrival),
            )
        except (TypeError, ValueError):
            raise InvalidSpec(
                f"trace {path}, {where}: {row!r} is not [arrival_s, job_type, scale_factor, total_steps]",
                hint="give the file run_gavel.py --out writes",
            ) from None
        if job.job_type not in known or job.devices not in known[job.job_type]:
            raise InvalidSpec(
                f"trace {path}, {where}: job type {job.job_type!r} on {job.devices} device(s) is not "
                "in the throughput file",
                hint="use the throughput file the trace was made for",
            )
        jobs.append(job)
    return jobs


def _typed_job(
    throughputs: Throughputs, rng: random.Random, devices: int, duration_s: float, arrival_s: float
) -> TraceJob:
    """A trace row without a model: a seeded job type measured at that gang size (Gavel does the
    same for the Philly trace), its steps from the duration on the reference type."""
    types = job_types(throughputs)
    size = min(SCALE_FACTORS, key=lambda s: (abs(s - devices), s))
    names = sorted(t for t, sizes in types.items() if size in sizes) or sorted(types)
    job_type = rng.choice(names)
    size = size if size in types[job_type] else types[job_type][0]
    steps = duration_s * throughputs.packed[(job_type, size, _reference(throughputs))]
    return TraceJob(job_type=job_type, devices=size, total_steps=steps, arrival_s=arrival_s)


def _csv_rows(path: Path, required: set[str]) -> list[tuple[int, dict[str, str]]]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = required - set(reader.fieldnames or ())
        if missing:
            raise InvalidSpec(
                f"trace {path} lacks the column(s) {', '.join(sorted(missing))}",
                hint=f"expected columns: {', '.join(sorted(required))}",
            )
        return [(number, row) for number, row in enumerate(reader, start=2)]


def _philly_trace(path: Path, throughputs: Throughputs, rng: random.Random) -> list[TraceJob]:
    """Pollux's Philly CSV: timestamp (2017-10-09 07:01:55), duration (s), num_gpus."""
    from datetime import datetime

    jobs = []
    for number, row in _csv_rows(path, {"timestamp", "duration", "num_gpus"}):
        try:
            arrival = datetime.fromisoformat(row["timestamp"]).timestamp()
            duration, devices = float(row["duration"]), int(float(row["num_gpus"]))
        except ValueError as exc:
            raise _bad_line(
                path, number, str(exc), "timestamp as 2017-10-09 07:01:55, numbers elsewhere"
            ) from None
        if duration > 0 and devices > 0:
            jobs.append(_typed_job(throughputs, rng, devices, duration, arrival))
    return jobs


def _alibaba_trace(path: Path, throughputs: Throughputs, rng: random.Random) -> list[TraceJob]:
    """Alibaba's 2023 pod list: creation/deletion time (s), num_gpu, gpu_spec (allowed models)."""
    cluster_types = _types(throughputs)
    jobs = []
    for number, row in _csv_rows(path, {"creation_time", "deletion_time", "num_gpu", "gpu_spec"}):
        try:
            start, end = float(row["creation_time"]), float(row["deletion_time"])
            devices = int(float(row["num_gpu"]))
        except ValueError as exc:
            raise _bad_line(
                path, number, str(exc), "creation_time, deletion_time and num_gpu are numbers"
            ) from None
        if devices <= 0 or end <= start:
            continue  # CPU-only pods and pods that never ran
        job = _typed_job(throughputs, rng, devices, end - start, start)
        wanted = tuple(t for t in re.split(r"[|,]", row["gpu_spec"].lower()) if t in cluster_types)
        jobs.append(
            TraceJob(
                job_type=job.job_type,
                devices=job.devices,
                total_steps=job.total_steps,
                arrival_s=job.arrival_s,
                accelerator_types=wanted,
            )
        )
    return jobs


def _sia_trace(path: Path, throughputs: Throughputs, rng: random.Random) -> list[TraceJob]:
    """Sia/Pollux workload CSVs: name, time (arrival s), application, num_replicas. They carry no
    duration (Sia runs each to a target accuracy), so durations follow Gavel's Philly-derived
    distribution, seeded."""
    jobs = []
    for number, row in _csv_rows(path, {"time", "num_replicas"}):
        try:
            arrival, devices = float(row["time"]), int(float(row["num_replicas"]))
        except ValueError as exc:
            raise _bad_line(path, number, str(exc), "time and num_replicas are numbers") from None
        if devices > 0:
            jobs.append(_typed_job(throughputs, rng, devices, _duration_s(rng), arrival))
    return jobs


def with_fabric_slowdown(throughputs: Throughputs) -> Throughputs:
    """The figures with a gang over several racks slowed once more by its own node-to-rack
    slowdown (spread² / packed): the fabric between racks is assumed as much slower than a rack's
    switch as that switch is than a node's links. Gavel's file measures one spread level only."""
    fabric = {
        key: rate * rate / packed
        for key, rate in throughputs.spread.items()
        if (packed := throughputs.packed.get(key, 0.0)) > 0
    }
    return Throughputs(packed=throughputs.packed, spread=throughputs.spread, fabric=fabric)
