"""Sia's workloads read into the simulator: its trace files (``shared/data/scheduling/sia``) give
each job its iterations at its fixed batch and its iterations per second per GPU type and count,
and elastic jobs run them through the same cycle."""

from __future__ import annotations

import dataclasses

import pytest

from shipyard.scheduling.elastic import Curves
from shipyard.scheduling.model import Lease, Node, Throughputs
from shipyard.scheduling.policies import policy_named
from shipyard.sim.sia_beliefs import beliefs_of
from shipyard.sim.sia_workload import CLUSTER, Application, SiaWorkload, gang_sizes, load_sia
from shipyard.sim.simulator import SimConfig, _advance, _State, finish_time_fairness, simulate
from shipyard.sim.workload import TraceJob
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


def test_every_start_costs_the_applications_restart_seconds_as_in_sias_job_model(saturn: SiaWorkload) -> None:
    # An ImageNet job restarts in 250 s, longer than a 60 s round: with Sia's job model its first
    # start alone delays it by all 250 s (carried over rounds), not by one round's worth.
    [imagenet] = [j for j in saturn.jobs if j.job_type.startswith("imagenet")][:1]
    assert imagenet.restart_s == 250.0
    alone = dataclasses.replace(imagenet, arrival_s=0.0, total_steps=200.0, sizes=(), devices=1)
    policy = policy_named("shortest_remaining_fluid")
    free = simulate([alone], saturn.nodes, saturn.throughputs, policy, SimConfig(round_s=60.0))
    charged = SimConfig(round_s=60.0, first_start_costs=True)
    paid = simulate([alone], saturn.nodes, saturn.throughputs, policy, charged)
    assert paid.avg_jct_h * 3600 == pytest.approx(free.avg_jct_h * 3600 + 250.0, abs=1e-6)


def test_sias_program_and_shipyards_sizing_both_finish_a_slice_of_the_workload(saturn: SiaWorkload) -> None:
    first = saturn.jobs[:16]
    policy = policy_named("shortest_remaining_fluid")
    # Sia's program decides on what it learned of each job (``sia_beliefs``), Shipyard's on the curve.
    configs = {
        "sia": SimConfig(round_s=60.0, sizing="sia", first_start_costs=True, beliefs=beliefs_of(saturn)),
        "remaining": SimConfig(round_s=60.0, sizing="remaining", first_start_costs=True),
    }
    results = {
        sizing: simulate(first, saturn.nodes, saturn.throughputs, policy, config)
        for sizing, config in configs.items()
    }
    for result in results.values():
        assert result.jobs_measured == 16 and result.worst_ftf_rho > 0
    # Sia's program learns each job's curve by running it (smallest gang first, then twice its
    # largest so far): it restarts jobs more on their way up than a sizing that knows the curve.
    assert results["sia"].restarts_per_job > results["remaining"].restarts_per_job


def test_finish_time_fairness_is_the_completion_time_over_a_1_over_n_share() -> None:
    node = Node(id="n", accelerator_type="h100", devices=2)
    rates = Throughputs(packed={("lm", 1, "h100"): 1.0})
    jobs = [TraceJob(job_type="lm", devices=1, total_steps=100.0, arrival_s=t) for t in (0.0, 10.0)]
    # Alone at arrival (a whole device of two: share 1): 100 s fair; the second came with the
    # first still running (2 jobs, 1 device each of 2: share 1 too). Unfinished: no rho.
    assert finish_time_fairness(jobs, [100.0, 310.0], rates, [node]) == [1.0, 3.0]
    assert finish_time_fairness(jobs, [100.0, None], rates, [node]) == [1.0, None]


def test_in_sias_job_model_a_gang_moved_to_other_nodes_of_the_same_shape_does_not_restart() -> None:
    # Sia's job compares devices per node ((4,) and (4,)), not which nodes: a move from one node
    # to another costs nothing there; in Shipyard's simulator (and live) it is a restart.
    nodes = [Node(id=f"n{i}", accelerator_type="t4", devices=4) for i in range(2)]
    rates = Throughputs(packed={("lm", 4, "t4"): 1.0})
    job = TraceJob(job_type="lm", devices=4, total_steps=1e6, arrival_s=0.0, restart_s=50.0)
    before, after = (Lease(job_id="0", accelerator_type="t4", nodes=(n.id,) * 4, level="node") for n in nodes)
    for free, restarts, steps in ((True, 0, 60.0), (False, 1, 10.0)):  # a restart: 50 s of the round
        state = _State(index=0, trace=job, lease=before, started=True)
        config = SimConfig(round_s=60.0, node_moves_free=free)
        _advance(state, after, Curves(rates), config, now=60.0)
        assert state.restarts == restarts and state.steps_done == pytest.approx(steps)
