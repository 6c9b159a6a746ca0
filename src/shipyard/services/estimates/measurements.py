"""What jobs measured, kept per shape of job: the figures that replace the planner's in later
estimates of the same shape, and that ``shipyard plan calibrate`` fits the planner to."""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from shipyard.db import Attempt, Job, Metric, ShapeMeasurement
from shipyard.db.base import utcnow
from shipyard.domain import ExitReason
from shipyard.schemas.estimate import Estimate, Figures
from shipyard.schemas.jobspec import JobSpec


def shape_key(spec: JobSpec) -> str:
    """What decides a job's memory and speed per device, hashed: the model (a fine-tuned folder
    by its config), the method, the batch, the precision, the layout and the threads per process.
    Data and step counts do not."""
    model: object = spec.model.preset
    if spec.model.path:
        config = Path(spec.model.path) / "config.json"
        model = hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else spec.model.path
    t = spec.training
    shape = {
        "model": model,
        "vocab": spec.data.tokenizer.vocab_size if spec.model.preset else None,
        "finetune": spec.finetune.model_dump(mode="json", exclude={"merge"}) if spec.finetune else None,
        "batch": [t.micro_batch_size, t.seq_len],
        "precision": t.precision,
        "layout": [
            t.parallelism.model_dump(),
            spec.activation_checkpointing.model_dump(),
            spec.resources.devices,
            spec.resources.nodes,
            spec.resources.cpus_per_device,  # threads: a CPU job's throughput
        ],
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


CLEAN_ENDS = frozenset({ExitReason.COMPLETED, ExitReason.CANCELLED, ExitReason.PREEMPTED})
"""Attempts whose figures are the shape's own: one that failed (out of memory, hung, lost) may
have stopped short of its peak or run slowed by what failed."""
MEASURED_STEPS = 3
"""Steps after the first (which includes warm-up) a throughput measurement needs."""


def with_measurements(session: Session, spec: JobSpec, estimate: Estimate | None) -> Estimate | None:
    """The estimate, with what earlier attempts of the same shape measured in place of the
    planner's figures on each accelerator type they ran on (the planner's stay beside them as
    ``*_planned``): the measured figure wins once it exists. ``measured_tokens_per_s`` gathers
    the measured rates by type, for the scheduler's throughputs."""
    if estimate is None:
        return None
    shape = shape_key(spec)
    out = estimate.model_copy(update={"shape": shape})
    by_accelerator = dict(estimate.by_accelerator)
    types = set(by_accelerator) | {estimate.accelerator}
    rows = session.scalars(
        select(ShapeMeasurement).where(
            ShapeMeasurement.shape == shape, ShapeMeasurement.accelerator_type.in_(sorted(types))
        )
    )
    rates = {}
    for row in rows:
        if row.accelerator_type in by_accelerator:
            by_accelerator[row.accelerator_type] = _as_measured(by_accelerator[row.accelerator_type], row)
        if row.accelerator_type == estimate.accelerator:
            out = _as_measured(out, row)
        if row.measured_tokens_per_s:
            rates[row.accelerator_type] = row.measured_tokens_per_s
    return out.model_copy(update={"by_accelerator": by_accelerator, "measured_tokens_per_s": rates})


F = TypeVar("F", bound=Figures)


def _as_measured(figures: F, row: ShapeMeasurement) -> F:
    update: dict[str, object] = {}
    if row.measured_gib is not None:
        update["memory_gib_planned"] = figures.memory_gib_per_device
        update["memory_gib_per_device"] = round(row.measured_gib, 3)
        update["memory_measured_by"] = row.job_id
    if row.measured_tokens_per_s and figures.tokens_per_s:
        slower = figures.tokens_per_s / row.measured_tokens_per_s
        update["tokens_per_s_planned"] = figures.tokens_per_s
        update["tokens_per_s"] = row.measured_tokens_per_s
        update["throughput_measured_by"] = row.job_id
        update["step_time_s"] = figures.step_time_s * slower
        if figures.wall_time_s is not None:
            update["wall_time_s"] = figures.wall_time_s * slower
    return figures.model_copy(update=update)


def record_measurements(session: Session, job: Job, attempt: Attempt) -> None:
    """Remember what a cleanly ended attempt measured where it ran (the median tokens/s of its
    steps after the first, its peak memory per device) beside what the planner had predicted
    there, for later jobs of its shape and for ``shipyard plan calibrate``."""
    estimate = Estimate.stored(job.estimate)
    if estimate is None or estimate.shape is None or attempt.exit_reason not in CLEAN_ENDS:
        return
    chosen, plan = estimate.on(attempt.accelerator_type)
    if chosen != attempt.accelerator_type:
        return  # never planned there: nothing to set the measurement beside
    steps = session.execute(
        select(Metric.tokens_per_s, Metric.values["mem_gib"].as_float())
        .where(Metric.attempt_id == attempt.id, Metric.kind == "train")
        .order_by(Metric.step)
    ).all()
    rates = [float(rate) for rate, _ in steps[1:] if rate]
    memory = [float(gib) for _, gib in steps if gib is not None]
    if len(rates) < MEASURED_STEPS and not memory:
        return
    key = (estimate.shape, chosen)
    row = session.get(ShapeMeasurement, key) or ShapeMeasurement(shape=key[0], accelerator_type=key[1])
    if memory:
        row.planned_gib = plan.memory_gib_planned or plan.memory_gib_per_device
        row.measured_gib = max(memory)
    if len(rates) >= MEASURED_STEPS:
        row.planned_tokens_per_s = plan.tokens_per_s_planned or plan.tokens_per_s
        row.measured_tokens_per_s = statistics.median(rates)
        row.planned_efficiency = plan.device_efficiency
    row.job_id, row.measured_at = job.id, utcnow()
    session.merge(row)
