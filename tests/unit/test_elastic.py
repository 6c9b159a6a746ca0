"""Elastic jobs in the scheduler: placed at their smallest gang, grown into idle devices where the
resize pays for itself, shrunk when others need the devices, with the words ``jobs show`` prints;
and the simulator running them through the same cycle."""

from __future__ import annotations

import dataclasses

import pytest

from shipyard.errors import InvalidSpec
from shipyard.scheduling.cycle import Cycle
from shipyard.scheduling.elastic import Curves
from shipyard.scheduling.model import Job, Node, Throughputs
from shipyard.scheduling.policies import policy_named
from shipyard.scheduling.sizing import Sizing, live_sizing
from shipyard.sim.simulator import SimConfig, simulate
from shipyard.sim.workload import TraceJob

# Steps/s of an "lm" job by gang size on one 8-device node: near-linear to 4, less after.
CURVE = {1: 1.0, 2: 1.9, 4: 3.6, 8: 6.0}
THROUGHPUTS = Throughputs(packed={("lm", n, "h100"): rate for n, rate in CURVE.items()})
NODE = Node(id="n0", accelerator_type="h100", devices=8)


def elastic(job_id: str = "e", *, held: int = 0, resize_s: float = 60.0, steps: float = 1e6) -> Job:
    return Job(
        id=job_id,
        job_type="lm",
        devices=2,
        sizes=(2, 4, 8),
        resize_s=resize_s,
        arrival_s=0.0,
        total_steps=steps,
        running_on="h100" if held else None,
        nodes=("n0",) * held,
    )


def rigid(job_id: str, devices: int, *, priority: float = 1.0, arrival_s: float = 0.0) -> Job:
    return Job(
        id=job_id, job_type="lm", devices=devices, arrival_s=arrival_s, total_steps=1e6, priority=priority
    )


SIZINGS = pytest.mark.parametrize("sizing", ["greedy", "remaining"])


def cycle(sizing: Sizing = "greedy") -> Cycle:
    return Cycle(policy=policy_named("priority"), round_s=60.0, sizing=sizing)


@SIZINGS
def test_an_elastic_job_alone_starts_on_every_idle_device(sizing: Sizing) -> None:
    decision = cycle(sizing).run([elastic()], [NODE], THROUGHPUTS, now_s=0.0)
    assert len(decision.plan.leases["e"].nodes) == 8
    assert decision.resizes == {}  # a first start is no resize


@SIZINGS
def test_it_shrinks_for_a_job_that_needs_its_devices_and_says_for_whom(sizing: Sizing) -> None:
    jobs = [elastic(held=8), rigid("big", 6, priority=5.0)]
    decision = cycle(sizing).run(jobs, [NODE], THROUGHPUTS, now_s=60.0)
    assert len(decision.plan.leases["e"].nodes) == 2 and len(decision.plan.leases["big"].nodes) == 6
    resize = decision.resizes["e"]
    assert (resize.before, resize.after) == (8, 2)
    assert resize.describe().startswith("shrunk 8→2 h100: its devices went to big")


@SIZINGS
def test_it_grows_back_when_the_devices_are_free_again(sizing: Sizing) -> None:
    decision = cycle(sizing).run([elastic(held=2)], [NODE], THROUGHPUTS, now_s=120.0)
    assert len(decision.plan.leases["e"].nodes) == 8
    assert decision.resizes["e"].describe().startswith("grew 2→8 h100: 6 idle devices")


@SIZINGS
def test_a_resize_that_would_not_pay_for_itself_within_the_horizon_is_not_made(sizing: Sizing) -> None:
    # 2 -> 8 devices runs 3.2x faster, but a resize of five horizons costs more than that gains
    # within one; the job's own remaining time (a week at 2 devices) does not count beyond it.
    slow = Cycle(policy=policy_named("priority"), round_s=60.0, horizon_s=600.0, sizing=sizing)
    decision = slow.run([elastic(held=2, resize_s=3000.0)], [NODE], THROUGHPUTS, now_s=120.0)
    assert len(decision.plan.leases["e"].nodes) == 2 and decision.resizes == {}
    patient = Cycle(policy=policy_named("priority"), round_s=60.0, horizon_s=1e7, sizing=sizing)
    decision = patient.run([elastic(held=2, resize_s=3000.0)], [NODE], THROUGHPUTS, now_s=120.0)
    assert len(decision.plan.leases["e"].nodes) == 8


@SIZINGS
def test_a_job_nearly_done_does_not_restart_to_go_faster(sizing: Sizing) -> None:
    # 100 steps left: 53 s at 2 devices, 17 s at 8 after a 60 s resize: staying is sooner.
    decision = cycle(sizing).run([elastic(held=2, steps=100.0)], [NODE], THROUGHPUTS, now_s=120.0)
    assert len(decision.plan.leases["e"].nodes) == 2


def test_throughput_between_measured_counts_is_interpolated_and_beyond_them_held_flat() -> None:
    curves = Curves(THROUGHPUTS)
    job = elastic()
    assert curves.rate(job, "h100", 6) == pytest.approx((3.6 + 6.0) / 2)
    assert curves.rate(job, "h100", 16) == pytest.approx(6.0)
    assert curves.rate(job, "h100", 4) == pytest.approx(3.6)
    rigid_job = rigid("r", 3)  # a rigid job keeps the figures as given (the one-device fallback)
    assert curves.rate(rigid_job, "h100", 3) == pytest.approx(1.0)


@SIZINGS
def test_the_simulator_runs_elastic_jobs_through_the_same_cycle_and_counts_restarts(sizing: Sizing) -> None:
    # Two jobs of 20,000 steps, the second arriving half an hour later: elastic ones share the node
    # and each use all of it while alone; rigid ones at their smallest gang leave devices idle.
    def trace(elastic_sizes: tuple[int, ...]) -> list[TraceJob]:
        return [
            TraceJob(
                job_type="lm",
                devices=2,
                total_steps=20_000.0,
                arrival_s=arrival,
                sizes=elastic_sizes,
                resize_s=60.0,
            )
            for arrival in (0.0, 1800.0)
        ]

    config = SimConfig(round_s=60.0, sizing=sizing)
    policy = policy_named("gavel_las_perf")
    grown = simulate(trace((2, 4, 8)), [NODE], THROUGHPUTS, policy, config)
    fixed = simulate(trace(()), [NODE], THROUGHPUTS, policy_named("gavel_las_perf"), config)
    assert grown.jobs_measured == fixed.jobs_measured == 2
    assert grown.avg_jct_h < fixed.avg_jct_h
    assert grown.restarts_per_job >= 1  # the first shrank when the second came
    assert grown.utilization > fixed.utilization


def test_joint_sizing_gives_the_job_that_can_finish_sooner_the_larger_share() -> None:
    # Two jobs arriving on one node, one with a hundredth of the other's work: sized together, the
    # short one gets the larger gang (it is done sooner, and the long one grows when it is).
    jobs = [
        dataclasses.replace(elastic(job_id, steps=steps), sizes=(2, 4, 6, 8))
        for job_id, steps in (("short", 2_000.0), ("long", 200_000.0))
    ]
    decision = cycle("remaining").run(jobs, [NODE], THROUGHPUTS, now_s=600.0)
    sizes = {job_id: len(lease.nodes) for job_id, lease in decision.plan.leases.items()}
    assert sizes["short"] > sizes["long"] >= 2 and sum(sizes.values()) == 8, sizes


def test_joint_sizing_keeps_the_policys_choice_of_who_runs() -> None:
    # Room for one gang of two beside a rigid job of six: the priority policy runs the important
    # elastic job, however much more the other would gain.
    important = dataclasses.replace(elastic("important", steps=1e7), priority=5.0)
    jobs = [important, elastic("quick", steps=100.0), rigid("big", 6, priority=9.0)]
    decision = cycle("remaining").run(jobs, [NODE], THROUGHPUTS, now_s=0.0)
    assert set(decision.plan.leases) == {"important", "big"}


def test_sias_sizing_lets_a_job_at_most_double_the_largest_gang_it_ran_on() -> None:
    # Sia learns a job's curve by running it: first its smallest gang, then at most twice that.
    sia = Cycle(policy=policy_named("priority"), round_s=60.0, sizing="sia")
    first = sia.run([elastic()], [NODE], THROUGHPUTS, now_s=0.0)
    assert len(first.plan.leases["e"].nodes) == 2
    ran = dataclasses.replace(elastic(held=2), largest_run=2, arrival_s=-3600.0)
    second = sia.run([ran], [NODE], THROUGHPUTS, now_s=0.0)
    assert len(second.plan.leases["e"].nodes) == 4


def test_sias_sizing_decides_on_what_it_believes_of_a_job_not_on_its_true_curve() -> None:
    # Its fit of what the job ran on may be wrong: believing 8 devices slower than 4, it
    # stops at 4 though the true curve is faster at 8.
    sia = Cycle(policy=policy_named("priority"), round_s=60.0, sizing="sia")
    ran = dataclasses.replace(elastic(held=4), largest_run=4, arrival_s=-3600.0)
    assert len(sia.run([ran], [NODE], THROUGHPUTS, now_s=0.0).plan.leases["e"].nodes) == 8
    believed = {("h100", 2): 1.9, ("h100", 4): 3.6, ("h100", 8): 3.0}
    doubting = dataclasses.replace(sia, believed=lambda job: believed)
    assert len(doubting.run([ran], [NODE], THROUGHPUTS, now_s=0.0).plan.leases["e"].nodes) == 4


def test_sias_placement_moves_single_node_gangs_to_free_a_whole_node_for_a_larger_one() -> None:
    # Two nodes of 8, a gang of 4 on each: a job given 8 finds no whole node. Sia realises every
    # allocation: it packs the two gangs of 4 onto one node and the 8 onto the other.
    nodes = [Node(id=f"n{i}", accelerator_type="h100", devices=8) for i in range(2)]
    believed = {("h100", 2): 1.9, ("h100", 4): 3.9, ("h100", 8): 40.0}  # it believes 8 worth it
    sia = Cycle(
        policy=policy_named("priority"),
        round_s=60.0,
        sizing="sia",
        believed=lambda job: believed if job.id == "big" else None,
    )
    old = -36_000.0  # long-running: a move costs them little of their age
    small = [
        dataclasses.replace(elastic(f"s{i}", steps=1e9), sizes=(4,), devices=4, arrival_s=old)
        for i in range(2)
    ]
    small = [
        dataclasses.replace(job, sizes=(2, 4), running_on="h100", nodes=(f"n{i}",) * 4, largest_run=4)
        for i, job in enumerate(small)
    ]
    big = dataclasses.replace(elastic("big", steps=1e9), sizes=(2, 8), arrival_s=old, largest_run=8)
    leases = sia.run([*small, big], nodes, THROUGHPUTS, now_s=0.0)
    held = {job_id: lease.nodes for job_id, lease in leases.plan.leases.items()}
    assert len(set(held["big"])) == 1 and len(held["big"]) == 8, held
    assert {len(held[f"s{i}"]) for i in range(2)} == {4} and held["s0"][0] == held["s1"][0], held


def test_an_unknown_or_simulator_only_sizing_is_refused_with_the_choices() -> None:
    # Sia's program learns curves by running and reads fields the live agent does not fill.
    for name in ("sia", "fastest"):
        with pytest.raises(InvalidSpec, match=f"unknown sizing '{name}'") as refused:
            live_sizing(name)
        assert refused.value.hint == "SHIPYARD_SIZING is one of remaining, greedy"
    assert live_sizing("greedy") == "greedy"
