"""The planner learns from the cluster: what an attempt measured is stored beside what was planned
for it, later jobs of the same shape are planned with the measurement (estimate and scheduler
throughputs), and ``plan calibrate`` fits a per-type efficiency with its before and after errors.

The attempts are written into a real database as the agent writes them; no training runs here
(``test_training_jobs`` covers the agent recording a real run).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shipyard.agent.scheduler import snapshot
from shipyard.db import Attempt, Job, Metric, ShapeMeasurement
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.services.context import ServiceContext
from shipyard.services.estimates import calibrate
from shipyard.services.estimates.estimates import estimate_job
from shipyard.services.estimates.measurements import record_measurements
from shipyard.services.estimates.planning import hardware_catalog
from shipyard.services.jobs import jobs
from tests.builders import spec_dict


def _ran(
    ctx: ServiceContext, job_id: str, rates: list[float], mem_gib: float, reason: str = "completed"
) -> None:
    """An attempt of the job on the CPU that reported one training step per rate, then ended."""
    with ctx.db.transaction() as session:
        job = session.get(Job, job_id)
        assert job is not None
        attempt = Attempt(
            job_id=job_id,
            number=1,
            state="succeeded" if reason == "completed" else "failed",
            accelerator_type="cpu",
            device_ids=[],
            threads_per_process=2,
            log_path="/dev/null",
            exit_reason=reason,
            finished_at=datetime.now(UTC),
        )
        session.add(attempt)
        session.flush()
        for step, rate in enumerate(rates, start=1):
            session.add(
                Metric(
                    job_id=job_id,
                    attempt_id=attempt.id,
                    kind="train",
                    step=step,
                    tokens_per_s=rate,
                    values={"mem_gib": mem_gib - 0.1 * (step == 1)},
                )
            )
        session.flush()
        record_measurements(session, job, attempt)


def test_an_attempts_figures_plan_the_next_job_of_its_shape(ctx: ServiceContext) -> None:
    first = jobs.submit(ctx, validate_job_spec(spec_dict(name="one")))
    planned = jobs.get(ctx, first.id).estimate
    # The first step (warm-up) is left out; the median of the others is the measurement.
    _ran(ctx, first.id, [10.0, 400.0, 500.0, 600.0], mem_gib=0.9)
    with ctx.db.read() as session:
        [row] = session.query(ShapeMeasurement).all()
    assert (row.measured_tokens_per_s, row.measured_gib) == (500.0, 0.9)
    assert row.planned_tokens_per_s == planned.tokens_per_s and row.job_id == first.id

    again = jobs.get(ctx, jobs.submit(ctx, validate_job_spec(spec_dict(name="two"))).id).estimate
    assert (again.tokens_per_s, again.throughput_measured_by) == (500.0, first.id)
    assert again.tokens_per_s_planned == planned.tokens_per_s
    slower = planned.tokens_per_s / 500.0
    assert again.step_time_s == pytest.approx(planned.step_time_s * slower)
    assert again.wall_time_s == pytest.approx(planned.wall_time_s * slower)
    assert again.by_accelerator["cpu"].tokens_per_s == 500.0
    assert (again.memory_gib_per_device, again.memory_measured_by) == (0.9, first.id)
    assert again.measured_tokens_per_s == {"cpu": 500.0}

    # Another shape (more threads per process) is not planned from it.
    other = spec_dict(name="three", resources={"accelerator": "cpu", "devices": 1, "cpus_per_device": 2})
    assert (
        jobs.get(ctx, jobs.submit(ctx, validate_job_spec(other)).id).estimate.throughput_measured_by is None
    )


def test_the_scheduler_takes_a_shapes_measured_throughput(ctx: ServiceContext) -> None:
    first = jobs.submit(ctx, validate_job_spec(spec_dict(name="one")))
    _ran(ctx, first.id, [1.0, 300.0, 300.0, 300.0], mem_gib=0.5)
    second = jobs.submit(ctx, validate_job_spec(spec_dict(name="two")))
    batch = spec_dict()["training"]["global_batch_tokens"]
    with ctx.db.read() as session:
        _, _, throughputs, _ = snapshot(
            session, list(ctx.executor.nodes()), datetime.now(UTC), ctx.submitted_jobs
        )
    [(key, rate)] = [(k, r) for k, r in throughputs.packed.items() if k[0] == second.id]
    assert key[2] == "cpu" and rate == pytest.approx(300.0 / batch)


def test_a_failed_attempt_teaches_nothing(ctx: ServiceContext) -> None:
    job = jobs.submit(ctx, validate_job_spec(spec_dict()))
    _ran(ctx, job.id, [1.0, 50.0, 50.0, 50.0], mem_gib=3.0, reason="oom")
    with ctx.db.read() as session:
        assert session.query(ShapeMeasurement).count() == 0


def _in_force(ctx: ServiceContext) -> dict[str, float]:
    with ctx.db.read() as session:
        return dict(calibrate.cluster_calibration(session).device_efficiency)


def test_calibrate_fits_the_cluster_and_later_plans_use_it(ctx: ServiceContext) -> None:
    assert calibrate.calibrate(ctx, save_fits=True) == []  # nothing measured yet
    # Three shapes (micro-batches), each measured at a share of what the planner predicted.
    for micro_batch, share in [(1, 0.5), (2, 0.4), (4, 0.625)]:
        spec = spec_dict(name=f"mb{micro_batch}", training={"micro_batch_size": micro_batch})
        view = jobs.submit(ctx, validate_job_spec(spec))
        planned = jobs.get(ctx, view.id).estimate.tokens_per_s
        _ran(ctx, view.id, [1.0, *[planned * share] * 3], mem_gib=0.5)

    [fit] = calibrate.calibrate(ctx, save_fits=False)
    # By hand: the factor is the geometric mean of the shares, (0.5 x 0.4 x 0.625)^(1/3) = 0.5.
    assert (fit.accelerator_type, fit.rows) == ("cpu", 3)
    assert fit.efficiency == pytest.approx(0.5)
    # |planned / measured - 1|: before 1/share - 1 = 1.0, 1.5, 0.6 (median 1.0); after, with the
    # factor, 0.5/share - 1 = 0, 0.25, 0.2 (median 0.2).
    assert (fit.error_before, fit.error_after) == (pytest.approx(1.0), pytest.approx(0.2))
    # Held out, each share against the geometric mean of the other two: 0.5 against
    # sqrt(0.4 x 0.625) = 0.5 (0), 0.4 against sqrt(0.3125) (0.398), 0.625 against sqrt(0.2) (0.284).
    assert fit.error_held_out == pytest.approx(1 - 0.2**0.5 / 0.625)
    assert _in_force(ctx) == {}  # a dry run changes nothing

    calibrate.calibrate(ctx, save_fits=True)
    assert _in_force(ctx) == {"cpu": pytest.approx(0.5)}
    # A shape never measured is planned with the factor on the CPU's efficiency: compute-bound,
    # about half the planner's catalog figure.
    fresh = validate_job_spec(spec_dict(name="fresh", training={"micro_batch_size": 8}))
    estimate = jobs.get(ctx, jobs.submit(ctx, fresh).id).estimate
    assert estimate.device_efficiency == pytest.approx(0.5)
    # And says what it rests on: the published evidence, scaled by the shapes measured here.
    assert (
        estimate.evidence is not None
        and "scaled x0.50 by 3 shapes of job this cluster measured" in estimate.evidence
    )
    catalog_only = estimate_job(fresh, ctx.executor.nodes(), hardware_catalog(ctx.settings))
    assert 0.5 - 1e-9 <= estimate.tokens_per_s / catalog_only.tokens_per_s < 0.55
    # A run measured just as its calibrated plan said confirms the factor: the planned figure
    # is taken back to the catalog's efficiency before it is compared.
    _ran(ctx, jobs.list_jobs(ctx)[0].id, [1.0, *[estimate.tokens_per_s] * 3], mem_gib=0.5)
    [refit] = calibrate.calibrate(ctx, save_fits=False)
    assert (refit.rows, refit.efficiency) == (4, pytest.approx(0.5))
