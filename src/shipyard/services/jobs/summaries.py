"""A job's training in a few figures, from its metrics: shown with the job, kept with each model
version it published."""

from __future__ import annotations

import statistics
from typing import Any

from shipyard.db import Job, Metric


def summarize(job: Job, metrics: list[Metric]) -> dict[str, float]:
    """Start and end losses, steady-state throughput and wall time of a job's training."""
    train = [m for m in metrics if m.kind == "train"]
    evals = [m for m in metrics if m.kind == "eval"]
    summary: dict[str, Any] = {}
    if train:
        summary["train_loss_start"] = train[0].loss
        summary["train_loss_end"] = train[-1].loss
        # The first step of an attempt pays for warm-up (allocations, compilation): leave it out.
        steady = [m.tokens_per_s for m in train[1:] if m.tokens_per_s] or [train[0].tokens_per_s or 0.0]
        summary["tokens_per_s"] = statistics.median(steady)
        steps = [float(m.values["step_time_s"]) for m in train[1:] if m.values.get("step_time_s")]
        if steps:
            summary["step_time_s"] = statistics.median(steps)
        mfus = [m.mfu for m in train[1:] if m.mfu is not None] or [train[0].mfu or 0.0]
        summary["mfu"] = statistics.median(mfus)
        summary["steps"] = train[-1].step
        memory = [float(m.values["mem_gib"]) for m in train if m.values.get("mem_gib") is not None]
        if memory:
            summary["memory_gib"] = max(memory)
    if evals:
        summary["eval_loss_start"] = evals[0].loss
        summary["eval_loss_end"] = evals[-1].loss
    start = next((m for m in metrics if m.kind == "start"), None)
    if start is not None:
        summary["params"] = start.values.get("params", 0)
        # What the runtime's MFU was computed with, beside the planner's (``plan_gaps``).
        summary["flops_per_token"] = start.values.get("flops_per_token")
        summary["world_size"] = start.values.get("world_size")
    if job.started_at and job.finished_at:
        summary["wall_s"] = (job.finished_at - job.started_at).total_seconds()
    return {k: float(v) for k, v in summary.items() if v is not None}
