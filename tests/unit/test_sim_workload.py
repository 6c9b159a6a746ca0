"""The simulator's workloads: Gavel's generator job for job, and replaying a run of Gavel's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from shipyard.errors import InvalidSpec
from shipyard.services.cluster.simulation import SimRequest, run
from shipyard.sim.workload import (
    GAVEL_JOB_TABLE,
    draw_order,
    generate_gavel_jobs,
    load_throughputs,
    load_trace,
)
from tests.builders import GAVEL_THROUGHPUTS

THROUGHPUTS = GAVEL_THROUGHPUTS
GAVEL_RUN = Path(__file__).resolve().parents[1] / "data" / "gavel-run-fifo-1.0-seed0.json"
"""The first 300 jobs Gavel's simulator (c4fa400) generated for seed 0 at 1.0 jobs/h with
multi-GPU jobs, as ``run_gavel.py fifo 1.0 0 --out`` wrote them."""

pytestmark = pytest.mark.skipif(
    not THROUGHPUTS.exists(), reason="the shared Gavel data is not beside the checkout"
)


def test_the_generator_draws_gavels_jobs_job_for_job() -> None:
    throughputs = load_throughputs(THROUGHPUTS)
    gavel = json.loads(GAVEL_RUN.read_text())["trace"]
    ours = generate_gavel_jobs(throughputs, count=len(gavel), rate_per_h=1.0, multi_gpu=True, seed=0)
    for index, ((arrival, job_type, devices, steps), job) in enumerate(zip(gavel, ours, strict=True)):
        assert (job.job_type, job.devices) == (job_type, devices), index
        assert math.isclose(job.total_steps, steps, rel_tol=1e-12), index
        assert math.isclose(job.arrival_s, arrival, rel_tol=1e-12, abs_tol=1e-9), index
    # Types are drawn in the order of Gavel's job table, not the throughput file's.
    assert draw_order(throughputs) == list(GAVEL_JOB_TABLE)


def test_single_device_jobs_keep_gavels_draws() -> None:
    """Gavel draws a scale factor for every job, then drops it: the durations stay those of the
    multi-GPU workload, so switching gangs off changes the sizes and types only."""
    throughputs = load_throughputs(THROUGHPUTS)
    multi = generate_gavel_jobs(throughputs, count=50, rate_per_h=2.0, multi_gpu=True, seed=3)
    single = generate_gavel_jobs(throughputs, count=50, rate_per_h=2.0, multi_gpu=False, seed=3)
    assert {j.devices for j in single} == {1} and len({j.devices for j in multi}) > 1
    assert [j.arrival_s for j in single] == [j.arrival_s for j in multi]
    first_type = single[0].job_type
    duration = single[0].total_steps / throughputs.packed[(first_type, 1, "v100")]
    multi_duration = multi[0].total_steps / throughputs.packed[(multi[0].job_type, multi[0].devices, "v100")]
    assert math.isclose(duration, multi_duration, rel_tol=1e-12)


def test_a_run_of_gavels_replays_as_the_same_jobs() -> None:
    throughputs = load_throughputs(THROUGHPUTS)
    replayed = load_trace(GAVEL_RUN, "gavel", throughputs, seed=0)
    generated = generate_gavel_jobs(throughputs, count=len(replayed), rate_per_h=1.0, multi_gpu=True, seed=0)
    assert [(j.job_type, j.devices) for j in replayed] == [(j.job_type, j.devices) for j in generated]


def test_a_run_trace_with_an_unknown_type_names_the_type_and_the_entry(tmp_path: Path) -> None:
    run_file = json.loads(GAVEL_RUN.read_text())
    run_file["trace"][7][1] = "GPT-5 (batch size 1)"
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps(run_file))
    with pytest.raises(InvalidSpec, match=r"trace entry 7: job type 'GPT-5 \(batch size 1\)'"):
        load_trace(bad, "gavel", load_throughputs(THROUGHPUTS), seed=0)


def test_a_window_past_the_traces_jobs_is_refused() -> None:
    request = SimRequest(
        throughputs=THROUGHPUTS, cluster="v100=8,p100=8,k80=8", trace=GAVEL_RUN, window="200:400"
    )
    with pytest.raises(InvalidSpec, match="ends past the 300 jobs of the trace"):
        run(request)
