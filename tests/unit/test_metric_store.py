"""Metrics as a time series of named scalars: every number of a runtime record becomes a point
of its own series, and a series longer than asked for is downsampled so that each bucket keeps
its first and last point and its lowest and highest value (a spike is never hidden).

The records are appended to a real metrics.jsonl and read by the agent's own ingestion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shipyard.agent.ingest import ingest_metrics, series_points
from shipyard.db import Attempt, Job
from shipyard.errors import InvalidSpec
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.services.context import ServiceContext
from shipyard.services.jobs import jobs, metric_series
from tests.builders import spec_dict


def _ran(ctx: ServiceContext, records: list[dict[str, object]]) -> str:
    """A job whose attempt wrote ``records``, ingested as an agent's pass does."""
    job_id = jobs.submit(ctx, validate_job_spec(spec_dict())).id
    with ctx.db.transaction() as session:
        job = session.get(Job, job_id)
        assert job is not None
        Path(job.run_dir).mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(record) + "\n" for record in records)
        (Path(job.run_dir) / "metrics.jsonl").write_text(lines + '{"kind": "train", "st')  # half a line
        attempt = Attempt(
            job_id=job_id, number=1, state="running", accelerator_type="cpu", device_ids=[0],
            threads_per_process=1, log_path="/dev/null",
        )  # fmt: skip
        session.add(attempt)
        session.flush()
        attempt.job = job
        ingest_metrics(session, attempt)
    return job_id


def test_every_number_of_a_record_is_a_series_and_events_are_not() -> None:
    record = {"kind": "train", "step": 3, "time": 1.0, "loss": 2.5, "lr": 1e-3, "note": "x", "ok": True}
    assert series_points("train", record) == [("loss", 2.5), ("lr", 1e-3)]
    assert series_points("eval", {"kind": "eval", "step": 3, "loss": 2.0, "accuracy": 0.5}) == [
        ("eval_loss", 2.0),
        ("eval_accuracy", 0.5),
    ]
    assert series_points("checkpoint", {"step": 3, "bytes": 10}) == []
    assert series_points("train", {"loss": float("nan"), "bad name!": 1.0, "x" * 65: 1.0}) == []


def test_any_logged_scalar_is_read_back_on_its_own_steps(ctx: ServiceContext) -> None:
    job_id = _ran(
        ctx,
        [{"kind": "eval", "step": 0, "loss": 4.0, "time": 100.0}]
        + [{"kind": "train", "step": s, "loss": 4 - s / 10, "lr": s/1e4, "dpo_margin": s / 2, "time": 100+s}
           for s in range(1, 11)]
        + [{"kind": "eval", "step": 5, "loss": 3.6, "time": 106.0}],
    )  # fmt: skip
    names = metric_series.metric_names(ctx, [job_id])[0]
    assert names.names == ["dpo_margin", "eval_loss", "loss", "lr"]
    assert names.tokens_per_step == spec_dict()["training"]["global_batch_tokens"]
    evals, margin = metric_series.points(ctx, [job_id], ["eval_loss", "dpo_margin"])
    assert (evals.step, evals.value, evals.low) == ([0, 5], [4.0, 3.6], None)  # step 0 is kept
    assert margin.step == list(range(1, 11)) and margin.at[0] == 101.0
    after = metric_series.points(ctx, [job_id], ["loss"], after_step=8)[0]
    assert after.step == [9, 10] and after.last_step == 10


def test_a_downsampled_series_keeps_each_buckets_ends_and_its_spike(ctx: ServiceContext) -> None:
    losses = [1.0] * 1000
    losses[537] = 50.0  # one spike, between the ends of its bucket
    job_id = _ran(ctx, [{"kind": "train", "step": s + 1, "loss": v} for s, v in enumerate(losses)])
    series = metric_series.points(ctx, [job_id], ["loss"], max_points=100)[0]
    assert len(series.step) <= 100 and series.bucket_steps == 20
    assert series.step[0] == 1 and series.step[-1] == 1000  # the first and last steps are kept
    assert 538 not in series.step and max(series.value) == 1.0  # the spike is not a kept point…
    assert series.high is not None and max(series.high) == 50.0  # …but its bucket's high shows it
    spiked = series.high.index(50.0)
    assert series.step[spiked] <= 538 <= series.step[spiked + 1]


def test_asking_for_too_many_series_or_points_is_refused(ctx: ServiceContext) -> None:
    job_id = _ran(ctx, [{"kind": "train", "step": 1, "loss": 1.0}])
    with pytest.raises(InvalidSpec, match="name 1 to 32 series"):
        metric_series.points(ctx, [job_id], [f"m{n}" for n in range(33)])
    with pytest.raises(InvalidSpec, match="max_points must be 2"):
        metric_series.points(ctx, [job_id], ["loss"], max_points=1)
