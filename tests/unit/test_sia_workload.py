"""Sia's workloads read into the simulator: its trace files (``shared/data/scheduling/sia``) give
each job its iterations at its fixed batch and its iterations per second per GPU type and count,
and elastic jobs run them through the same cycle."""

from __future__ import annotations

import dataclasses

import pytest

from shipyard.scheduling.policies import policy_named
from shipyard.sim.sia_workload import CLUSTER, Application, SiaWorkload, gang_sizes, load_sia
from shipyard.sim.simulator import SimConfig, simulate
from tests.builders import SHARED_DATA

SIA = SHARED_DATA / "scheduling" / "sia"


@pytest.fixture(scope="module")
def saturn() -> SiaWorkload:
    return load_sia(SIA / "workloads" / "saturn" / "workload-1.csv", SIA / "traces")


def test_every_job_of_the_workload_runs_on_sias_cluster_at_its_placements(saturn: SiaWorkload) -> None:
    assert len(saturn.jobs) == 160
    assert sum(n.devices for n in saturn.nodes) == 64  # 24 T4, 16 A100, 24 RTX 2080 Ti
    assert gang_sizes(*CLUSTER["dgx-ext"]) == [(1,), (2,), (4,), (8,), (8, 8)]
    for job in saturn.jobs:
        assert job.sizes[0] == job.devices and job.total_steps > 0 and job.resize_s > 0
    rates = saturn.throughputs.packed
    # More A100s run a CIFAR-10 job faster, and an A100 runs it faster than a T4.
    curve = [rates[("cifar10-2048", n, "dgx-ext")] for n in (1, 2, 4, 8, 16)]
    assert curve == sorted(curve)
    assert rates[("cifar10-2048", 1, "dgx-ext")] > rates[("cifar10-2048", 1, "aws")]


def test_a_larger_batch_needs_fewer_iterations_but_more_samples() -> None:
    app = Application.load(SIA / "traces", "cifar10", "rtx")
    small, large = app.steps_to_finish(512), app.steps_to_finish(2048)
    assert large < small < large * 4  # statistical efficiency falls as the batch grows


def test_elastic_jobs_of_a_sia_workload_finish_sooner_than_the_same_jobs_held_to_their_smallest_gang(
    saturn: SiaWorkload,
) -> None:
    first = saturn.jobs[:24]
    rigid = [dataclasses.replace(j, sizes=(), devices=j.sizes[0]) for j in first]
    config = SimConfig(round_s=60.0)
    grown = simulate(first, saturn.nodes, saturn.throughputs, policy_named("gavel_las_perf"), config)
    fixed = simulate(rigid, saturn.nodes, saturn.throughputs, policy_named("gavel_las_perf"), config)
    assert grown.jobs_measured == fixed.jobs_measured == 24
    assert grown.avg_jct_h < fixed.avg_jct_h
