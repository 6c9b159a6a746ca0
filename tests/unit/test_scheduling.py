"""The scheduler's policies and round mechanism, pure: invariants under Hypothesis (capacity never
exceeded, gangs whole on one type, determinism) and small hand-checked cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipyard.scheduling.cycle import Cycle
from shipyard.scheduling.model import Job, Lease, Node, PolicyInput, Throughputs
from shipyard.scheduling.policies import POLICIES, policy_named
from shipyard.scheduling.policies.fairness import gavel_las_perf
from shipyard.scheduling.policies.makespan import fluid_makespan
from shipyard.scheduling.policies.remaining import shortest_remaining_fluid, shortest_remaining_perf
from shipyard.scheduling.rounds import place_round
from shipyard.scheduling.status import Reason

TYPES = ("v100", "p100", "k80")


def schedule(jobs, nodes, tp, policy, queues=None, *, now_s, round_s):  # type: ignore[no-untyped-def]
    """One cycle of a fresh ``Cycle``: nothing remembered from an earlier round."""
    return Cycle(policy=policy, queues=queues, round_s=round_s).run(jobs, nodes, tp, now_s=now_s)


SPEED = {"v100": 3.0, "p100": 2.0, "k80": 1.0}


def throughputs(job_types: list[str]) -> Throughputs:
    packed = {}
    for i, job_type in enumerate(job_types):
        for devices in (1, 2, 4, 8):
            for k in TYPES:
                # Job types gain differently from faster types: the heterogeneity the policies use.
                packed[(job_type, devices, k)] = SPEED[k] ** (i % 3) * devices
    return Throughputs(packed=packed)


def nodes(per_type: int = 2, devices: int = 4) -> list[Node]:
    return [Node(id=f"{k}-{n}", accelerator_type=k, devices=devices) for k in TYPES for n in range(per_type)]


jobs_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from([1, 1, 2, 4, 8]),
        st.floats(min_value=1, max_value=1e5),
        st.floats(min_value=0, max_value=1e4),
    ),
    min_size=1,
    max_size=25,
)


def make_jobs(raw: list[tuple[str, int, float, float]]) -> list[Job]:
    return [
        Job(id=f"j{i}", job_type=t, devices=d, total_steps=steps, arrival_s=arrival)
        for i, (t, d, steps, arrival) in enumerate(raw)
    ]


@settings(max_examples=60, deadline=None)
@given(raw=jobs_strategy, policy=st.sampled_from(sorted(POLICIES)), seed=st.integers(0, 3))
def test_leases_never_exceed_capacity_and_gangs_stay_whole(raw: list, policy: str, seed: int) -> None:
    jobs = make_jobs(raw)
    cluster = nodes()
    inp = PolicyInput(
        jobs=jobs, capacity=dict.fromkeys(TYPES, 8), throughputs=throughputs(["a", "b", "c"]), seed=seed
    )
    allocation = POLICIES[policy](inp)
    for shares in allocation.values():
        assert sum(shares.values()) <= 1 + 1e-6
    plan = place_round(jobs, cluster, allocation, now_s=1e4, round_s=360)
    used: dict[str, int] = {}
    by_id = {j.id: j for j in jobs}
    node_type = {n.id: n.accelerator_type for n in cluster}
    for lease in plan.leases.values():
        assert len(lease.nodes) == by_id[lease.job_id].devices  # the whole gang or nothing
        assert {node_type[n] for n in lease.nodes} == {lease.accelerator_type}  # one type
        for n in lease.nodes:
            used[n] = used.get(n, 0) + 1
    assert all(used[n.id] <= n.devices for n in cluster if n.id in used)
    # Every job is either leased or has a reason, never both.
    assert set(plan.leases).isdisjoint(plan.pending_reasons)
    assert set(plan.leases) | set(plan.pending_reasons) == set(by_id)
    # Same input, same decision.
    again = place_round(jobs, cluster, POLICIES[policy](inp), now_s=1e4, round_s=360)
    assert again.leases == plan.leases


def test_a_running_job_keeps_its_devices() -> None:
    job = Job(id="r", job_type="a", devices=2, total_steps=100, arrival_s=0, running_on="p100",
              nodes=("p100-1", "p100-1"), attained_s={"p100": 3600})  # fmt: skip
    cluster = nodes()
    plan = place_round([job], cluster, {"r": {"p100": 1.0}}, now_s=3600, round_s=360)
    assert plan.leases["r"].nodes == ("p100-1", "p100-1") and plan.preempted == ()


def test_gangs_pack_on_one_node_before_spreading() -> None:
    small = Job(id="s", job_type="a", devices=2, total_steps=1, arrival_s=0)
    big = Job(id="b", job_type="a", devices=4, total_steps=1, arrival_s=1)
    plan = place_round([small, big], nodes(), {"s": {"v100": 1.0}, "b": {"v100": 1.0}}, now_s=10, round_s=360)
    assert not plan.leases["b"].spread and not plan.leases["s"].spread
    assert plan.leases["s"].nodes[0] != plan.leases["b"].nodes[0]
    eight = Job(id="e", job_type="a", devices=8, total_steps=1, arrival_s=0)
    spread = place_round([eight], nodes(), {"e": {"k80": 1.0}}, now_s=10, round_s=360)
    assert spread.leases["e"].spread


def test_a_gang_of_whole_nodes_takes_that_many_nodes_or_none() -> None:
    cluster = [Node(id=f"n{i}", accelerator_type="v100", devices=2) for i in range(3)]
    gang = Job(id="g", job_type="a", devices=4, per_node=2, total_steps=1, arrival_s=0)
    plan = place_round([gang], cluster, {"g": {"v100": 1.0}}, now_s=10, round_s=360)
    held = plan.leases["g"].nodes
    assert len(set(held)) == 2 and all(held.count(n) == 2 for n in set(held))
    # With one node half taken, 4 devices are free in all but only one whole node: it waits.
    busy = Job(id="b", job_type="a", devices=1, per_node=1, total_steps=1, arrival_s=0, running_on="v100",
               nodes=("n0",), attained_s={"v100": 1.0})  # fmt: skip
    other = Job(id="o", job_type="a", devices=1, per_node=1, total_steps=1, arrival_s=0, running_on="v100",
                nodes=("n1",), attained_s={"v100": 1.0})  # fmt: skip
    allocation = {"b": {"v100": 1.0}, "o": {"v100": 1.0}, "g": {"v100": 1.0}}
    plan = place_round([busy, other, gang], cluster, allocation, now_s=10, round_s=360)
    assert "g" not in plan.leases
    reason = plan.pending_reasons["g"]
    assert reason.code == Reason.INSUFFICIENT_DEVICES
    assert reason.message == (
        "0/3 nodes: needs 2 nodes with 2 v100 each, 1 of them free now (n0 1 of 2 free, n1 1 of 2 free)"
    )


def test_a_node_gang_larger_than_every_node_names_the_nodes() -> None:
    cluster = [Node(id=f"n{i}", accelerator_type="v100", devices=2) for i in range(2)]
    wide = Job(id="w", job_type="a", devices=4, per_node=4, total_steps=1, arrival_s=0)
    plan = place_round([wide], cluster, {"w": {"v100": 1.0}}, now_s=0, round_s=360)
    assert plan.pending_reasons["w"].code == Reason.GANG_TOO_LARGE
    assert plan.pending_reasons["w"].message == (
        "needs 1 node with 4 v100 each; 0 of 2 nodes are that large (n0 has 2, n1 has 2)"
    )


def test_a_job_bigger_than_any_type_says_so() -> None:
    job = Job(id="x", job_type="a", devices=16, total_steps=1, arrival_s=0)
    plan = place_round([job], nodes(), {}, now_s=0, round_s=360)
    assert plan.pending_reasons["x"].message == "needs 16 devices of one type; the largest type here has 8"
    assert plan.pending_reasons["x"].code == Reason.GANG_TOO_LARGE


def test_a_job_runs_only_where_devices_have_the_memory_it_asks_for() -> None:
    cluster = [
        Node(id="v100-0", accelerator_type="v100", devices=4, memory_gib=32),
        Node(id="k80-0", accelerator_type="k80", devices=4, memory_gib=12),
    ]
    tp = throughputs(["a"])
    big = Job(id="big", job_type="a", devices=2, total_steps=10, arrival_s=0, min_memory_gib=16)
    huge = Job(id="huge", job_type="a", devices=1, total_steps=10, arrival_s=1, min_memory_gib=40)
    # Two jobs fill the v100s first, so the 16 GiB job could only go to a k80 — which is too small.
    first = [Job(id=f"f{i}", job_type="a", devices=2, total_steps=10, arrival_s=-1) for i in range(2)]
    plan = schedule([*first, big, huge], cluster, tp, POLICIES["fifo_perf"], now_s=0, round_s=360).plan
    assert set(plan.leases) == {"f0", "f1"}
    assert plan.pending_reasons["big"].code == Reason.INSUFFICIENT_DEVICES
    assert plan.pending_reasons["big"].message == (
        "0/2 nodes: 1 wrong accelerator type, 1 insufficient free v100 (v100: 0 of 4 free, needs 2); "
        "too little memory per device on k80 has 12 GiB, needs 16"
    )
    assert plan.pending_reasons["huge"].code == Reason.INSUFFICIENT_MEMORY
    assert plan.pending_reasons["huge"].message == (
        "0/2 nodes: 2 insufficient device memory (needs 40 GiB per device, the largest here has 32 GiB)"
    )
    alone = schedule([big], cluster, tp, POLICIES["fifo_perf"], now_s=0, round_s=360).plan
    assert alone.leases["big"].accelerator_type == "v100"


def test_las_gives_each_job_its_fair_share_when_oversubscribed() -> None:
    jobs = [Job(id=f"j{i}", job_type="a", devices=1, total_steps=10, arrival_s=0) for i in range(48)]
    inp = PolicyInput(jobs=jobs, capacity=dict.fromkeys(TYPES, 8), throughputs=throughputs(["a"]))
    allocation = gavel_las_perf(inp)
    totals = [sum(allocation.get(j.id, {}).values()) for j in jobs]
    # 24 devices over 48 equal jobs: half a device-round each.
    assert min(totals) >= 0.5 - 1e-6


def test_shipyard_runs_the_shortest_work_first_on_the_type_it_gains_from() -> None:
    tp = throughputs(["a", "b", "c"])  # "a" gains nothing from a v100, "c" gains 9x
    jobs = [
        Job(id="longest", job_type="a", devices=8, total_steps=2e9, arrival_s=0),
        Job(id="long", job_type="c", devices=8, total_steps=1e9, arrival_s=0),
        Job(id="short-c", job_type="c", devices=8, total_steps=10, arrival_s=5),
        Job(id="short-a", job_type="a", devices=8, total_steps=10, arrival_s=6),
    ]
    allocation = shortest_remaining_perf(
        PolicyInput(jobs=jobs, capacity={"v100": 8, "k80": 16}, throughputs=tp)
    )
    assert allocation["short-c"] == {"v100": 1.0}
    assert allocation["short-a"] == {"k80": 1.0}
    # The longest job sets the horizon of all known work: starting it last would end the batch
    # later, so it runs (on the type it does not need to share with "c"); "long" waits.
    assert allocation["longest"] == {"k80": 1.0}
    assert "long" not in allocation


def test_the_fluid_guided_policy_runs_the_job_the_makespan_waits_for_where_it_gains_most() -> None:
    # x gains 1.2x from the v100, y 3x; x is far shorter. Were x given the v100, y would take
    # 300 s on the k80. The fluid program's makespan is y's 100 s on the v100 (x's 11 s on the
    # k80 beside it): y is critical there and takes the v100, x the k80.
    packed = {("x", 1, "v100"): 1.2, ("x", 1, "k80"): 1.0, ("y", 1, "v100"): 3.0, ("y", 1, "k80"): 1.0}
    jobs = [
        Job(id="x", job_type="x", devices=1, total_steps=11, arrival_s=0),
        Job(id="y", job_type="y", devices=1, total_steps=300, arrival_s=0),
    ]
    inp = PolicyInput(jobs=jobs, capacity={"v100": 1, "k80": 1}, throughputs=Throughputs(packed=packed))
    assert shortest_remaining_fluid(inp) == {"x": {"k80": 1.0}, "y": {"v100": 1.0}}
    rates = np.array([[1.0, 1.2], [1.0, 3.0]])  # types in name order: k80, v100
    solved = fluid_makespan(rates, np.array([11.0, 300.0]), np.ones(2), np.ones(2))
    assert solved is not None and solved[0] == pytest.approx(100)
    assert solved[1] == pytest.approx(np.array([[11.0, 0.0], [0.0, 100.0]]))
    # A job that fits no type has no fluid makespan.
    assert fluid_makespan(np.zeros((1, 2)), np.ones(1), np.ones(1), np.ones(2)) is None


def test_the_fluid_guided_policy_never_lets_the_job_that_sets_the_horizon_wait() -> None:
    # Four jobs, one v100 and one k80. On their fastest types the work is 30 + 5 + 66.7 + 100 s
    # over two devices, so "last" (100 s on the v100) alone sets the horizon of the known work.
    # The fluid program ends the batch at 135 s and keeps "last" busy only 100 s of them (74 %):
    # it may wait. Waiting shorter jobs out, round by round, is how a batch ends late; it runs.
    speeds = {"a": 1.0, "b": 2.0, "c": 3.0, "last": 3.0}
    steps = {"a": 30.0, "b": 10.0, "c": 200.0, "last": 300.0}
    packed = {(j, 1, k): rate for j, v in speeds.items() for k, rate in (("v100", v), ("k80", 1.0))}
    jobs = [Job(id=j, job_type=j, devices=1, total_steps=steps[j], arrival_s=0) for j in speeds]
    inp = PolicyInput(jobs=jobs, capacity={"v100": 1, "k80": 1}, throughputs=Throughputs(packed=packed))
    rates = np.array([[1.0, speeds[j]] for j in speeds])  # k80, v100
    solved = fluid_makespan(rates, np.array(list(steps.values())), np.ones(4), np.ones(2))
    assert solved is not None and solved[0] == pytest.approx(135)
    assert solved[1][3].sum() == pytest.approx(100)
    allocation = shortest_remaining_fluid(inp)
    assert "last" in allocation and "c" in allocation  # "c" is busy 130 s of the 135: critical


def test_a_gang_larger_than_any_node_is_valued_at_its_spread_throughput() -> None:
    # The 8-device gang runs 3x faster on the a100s while it fits one node; their nodes hold 4,
    # so it would spread and run at its spread figure, slower than on one node of t4s.
    packed = {("g", 8, "a100"): 3.0, ("g", 8, "t4"): 1.0}
    spread = {("g", 8, "a100"): 0.5}
    jobs = [Job(id="g", job_type="g", devices=8, total_steps=100, arrival_s=0)]
    capacity = {"a100": 8, "t4": 8}
    known = Throughputs(packed=packed, spread=spread)
    for policy in (shortest_remaining_perf, shortest_remaining_fluid):
        inp = PolicyInput(jobs=jobs, capacity=capacity, throughputs=known, node_devices={"a100": 4, "t4": 8})
        assert policy(inp) == {"g": {"t4": 1.0}}
        assert inp.rate(jobs[0], "a100") == 0.5 and inp.rate(jobs[0], "t4") == 1.0
        # Nodes of 8 a100s hold it whole: it goes there.
        whole = PolicyInput(
            jobs=jobs, capacity=capacity, throughputs=known, node_devices={"a100": 8, "t4": 8}
        )
        assert policy(whole) == {"g": {"a100": 1.0}}


def test_idle_devices_are_backfilled_for_one_round_without_delaying_allocated_jobs() -> None:
    tp = throughputs(["a"])
    jobs = [
        Job(id="big", job_type="a", devices=8, total_steps=100, arrival_s=0),
        Job(id="small", job_type="a", devices=2, total_steps=100, arrival_s=1),
    ]
    cluster = [
        Node(id="v100-0", accelerator_type="v100", devices=8),
        Node(id="k80-0", accelerator_type="k80", devices=4),
    ]
    allocation = {"big": {"v100": 1.0}}  # the policy gave "small" nothing this round
    strict = place_round(jobs, cluster, allocation, now_s=0, round_s=360)
    assert set(strict.leases) == {"big"}
    filled = place_round(jobs, cluster, allocation, now_s=0, round_s=360, backfill=tp)
    assert filled.leases["big"].accelerator_type == "v100"
    assert filled.leases["small"] == Lease(job_id="small", accelerator_type="k80", nodes=("k80-0",) * 2)


# --- quota and cohorts --------------------------------------------------------------------------

from shipyard.scheduling.quota import ClusterQueue, Queues, admit  # noqa: E402

LAB = Queues(
    cluster_queues={
        "research": ClusterQueue(name="research", nominal={"v100": 4}, cohort="lab"),
        "prod": ClusterQueue(name="prod", nominal={"v100": 4}, cohort="lab"),
        "solo": ClusterQueue(name="solo", nominal={"v100": 2}),
    },
    local_queues={"team-a": "research", "team-b": "prod"},
)


def job(job_id: str, queue: str, devices: int, arrival: float = 0, running: bool = False) -> Job:
    return Job(
        id=job_id,
        job_type="a",
        devices=devices,
        total_steps=100,
        arrival_s=arrival,
        queue=queue,
        running_on="v100" if running else None,
        nodes=("v100-0",) * devices if running else (),
    )


def test_a_queue_borrows_idle_quota_of_its_cohort() -> None:
    admission = admit([job("a", "team-a", 6)], LAB)
    assert [j.id for j in admission.jobs] == ["a"]
    admission = admit([job("a", "team-a", 6, running=True), job("b", "team-a", 4)], LAB)
    assert admission.reasons["b"].code == Reason.QUOTA_EXHAUSTED
    assert admission.reasons["b"].message == "quota exhausted in cohort lab (v100: 2 more needed)"
    assert admission.usage.borrowed["research"] == {"v100": 2}


def test_a_queue_without_cohort_cannot_borrow() -> None:
    admission = admit([job("s", "solo", 3)], LAB)
    assert admission.reasons["s"].message == "quota exhausted in queue solo (v100: 1 more needed)"


def test_the_owner_reclaims_borrowed_quota_by_preemption() -> None:
    borrower = job("a", "team-a", 8, running=True)
    owner = job("p", "team-b", 4, arrival=10)
    admission = admit([borrower, owner], LAB)
    assert admission.reclaimed == ("a",)
    cluster = [Node(id="v100-0", accelerator_type="v100", devices=8)]
    plan = schedule(
        [borrower, owner], cluster, throughputs(["a"]), policy_named("shipyard"), LAB, now_s=20, round_s=360
    ).plan
    assert plan.preempted == ("a",)
    assert plan.pending_reasons["a"].code == Reason.RECLAIMED
    assert "borrowed quota" in plan.pending_reasons["a"].message


def test_unknown_queue_is_named() -> None:
    admission = admit([job("x", "nope", 1)], LAB)
    assert admission.reasons["x"].code == Reason.NO_SUCH_QUEUE
    assert admission.reasons["x"].message.startswith("queue 'nope' does not exist")


@settings(max_examples=50, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.sampled_from(["team-a", "team-b", "solo"]), st.integers(1, 4)), max_size=20)
)
def test_admission_never_exceeds_cohort_quota(sizes: list[tuple[str, int]]) -> None:
    jobs = [job(f"j{i}", q, d, arrival=i) for i, (q, d) in enumerate(sizes)]
    admission = admit(jobs, LAB)
    by_queue: dict[str, int] = {}
    for j in admission.jobs:
        cq = LAB.cluster_queue_of(j)
        assert cq is not None
        by_queue[cq.name] = by_queue.get(cq.name, 0) + j.devices
    assert by_queue.get("research", 0) + by_queue.get("prod", 0) <= 8
    assert by_queue.get("solo", 0) <= 2


# --- the simulator, end to end on small random workloads -----------------------------------------

from hypothesis.stateful import RuleBasedStateMachine, invariant, rule  # noqa: E402

from shipyard.sim.simulator import GAVEL_MECHANISM, SimConfig, cluster_nodes, simulate  # noqa: E402
from shipyard.sim.workload import TraceJob  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(
    raw=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from([1, 2, 4]),
            st.floats(10, 5e4),
            st.floats(0, 2e4),
        ),
        min_size=1,
        max_size=15,
    ),
    policy=st.sampled_from(sorted(POLICIES)),
    restart_cost=st.sampled_from([0.0, 30.0]),
    gavels_mechanism=st.booleans(),
)
def test_every_job_finishes_no_faster_than_alone_and_runs_repeat(
    raw: list, policy: str, restart_cost: float, gavels_mechanism: bool
) -> None:
    tp = throughputs(["a", "b", "c"])
    jobs = [TraceJob(job_type=t, devices=d, total_steps=s, arrival_s=a) for t, d, s, a in raw]
    nodes = cluster_nodes({"v100": 4, "p100": 4, "k80": 4}, 4)
    mechanism = GAVEL_MECHANISM if gavels_mechanism else {}
    config = SimConfig(round_s=360, restart_cost_s=restart_cost, **mechanism)  # type: ignore[arg-type]
    first = simulate(jobs, nodes, tp, policy_named(policy), config)
    assert first.jobs_measured == len(jobs)  # nothing starves forever, nothing is lost
    alone = min(
        s / max(tp.packed[(t, d, k)] for k in TYPES) for t, d, s, _ in raw
    )  # the shortest job on its fastest type
    assert first.p50_jct_h * 3600 >= alone * 0.999
    assert 0 < first.utilization <= 1
    again = simulate(jobs, nodes, tp, policy_named(policy), config)
    assert {k: v for k, v in first.to_dict().items() if "solve_ms" not in k} == {
        k: v for k, v in again.to_dict().items() if "solve_ms" not in k
    }


def test_the_fluid_makespan_bound_is_exact_where_it_can_be_and_never_beaten() -> None:
    from shipyard.sim.bounds import fluid_makespan_s

    tp = throughputs(["a"])  # 1 step/s per device on every type
    one = [TraceJob(job_type="a", devices=1, total_steps=3600, arrival_s=0)]
    assert fluid_makespan_s(one, tp, {"v100": 1}) == pytest.approx(3600)
    # Two equal jobs on one device run one after the other; on two devices side by side.
    two = one * 2
    assert fluid_makespan_s(two, tp, {"v100": 1}) == pytest.approx(7200)
    assert fluid_makespan_s(two, tp, {"v100": 2}) == pytest.approx(3600)

    sizes = [("a", 1, 4e4), ("b", 2, 9e4), ("c", 4, 2e4), ("a", 2, 3e4), ("c", 1, 8e4), ("b", 4, 5e4)]
    batch = [TraceJob(job_type=t, devices=d, total_steps=s, arrival_s=0) for t, d, s in sizes]
    tp3 = throughputs(["a", "b", "c"])
    nodes3 = cluster_nodes({"v100": 4, "p100": 4, "k80": 4}, 4)
    bound = fluid_makespan_s(batch, tp3, {"v100": 4, "p100": 4, "k80": 4})
    for policy in ("min_makespan", "shortest_remaining_perf", "shortest_remaining_fluid", "gavel_las_perf"):
        result = simulate(batch, nodes3, tp3, POLICIES[policy], SimConfig(round_s=360))
        assert result.makespan_h * 3600 >= bound * 0.999


class RoundsMachine(RuleBasedStateMachine):
    """Jobs arrive and rounds pass on a small cluster; every round's leases must respect capacity,
    keep gangs whole, and never show a job both waiting and running."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[str, Job] = {}
        self.nodes = nodes(per_type=1, devices=4)
        self.now = 0.0
        self.tp = throughputs(["a", "b"])
        self.last_plan = None

    @rule(
        job_type=st.sampled_from(["a", "b"]), devices=st.sampled_from([1, 2, 4, 8]), steps=st.floats(1, 1e4)
    )
    def arrive(self, job_type: str, devices: int, steps: float) -> None:
        job_id = f"j{len(self.jobs)}"
        self.jobs[job_id] = Job(
            id=job_id, job_type=job_type, devices=devices, total_steps=steps, arrival_s=self.now
        )

    @rule(policy=st.sampled_from(sorted(POLICIES)))
    def round(self, policy: str) -> None:
        live = [j for j in self.jobs.values() if j.remaining_steps > 0]
        plan = schedule(live, self.nodes, self.tp, POLICIES[policy], now_s=self.now, round_s=360).plan
        self.last_plan = plan
        for job in live:
            lease = plan.leases.get(job.id)
            if lease is None:
                self.jobs[job.id] = Job(**{**_fields(job), "running_on": None, "nodes": ()})
                continue
            rate = self.tp.of(job, lease.accelerator_type)
            done = min(job.total_steps, job.steps_done + rate * 360)
            attained = dict(job.attained_s)
            attained[lease.accelerator_type] = attained.get(lease.accelerator_type, 0.0) + 360
            self.jobs[job.id] = Job(
                **{
                    **_fields(job),
                    "steps_done": done,
                    "attained_s": attained,
                    "running_on": lease.accelerator_type if done < job.total_steps else None,
                    "nodes": lease.nodes if done < job.total_steps else (),
                }
            )
        self.now += 360

    @invariant()
    def leases_are_sound(self) -> None:
        plan = self.last_plan
        if plan is None:
            return
        used: dict[str, int] = {}
        for lease in plan.leases.values():
            assert isinstance(lease, Lease)
            assert len(lease.nodes) == self.jobs[lease.job_id].devices
            for node in lease.nodes:
                used[node] = used.get(node, 0) + 1
        assert all(used.get(n.id, 0) <= n.devices for n in self.nodes)
        assert set(plan.leases).isdisjoint(plan.pending_reasons)


def _fields(job: Job) -> dict:
    return {name: getattr(job, name) for name in Job.__slots__}


TestRounds = RoundsMachine.TestCase
TestRounds.settings = settings(max_examples=20, stateful_step_count=15, deadline=None)


# --- Gavel's behaviour, ported --------------------------------------------------------------


def test_gavel_fifo_fills_the_last_named_type_first_and_over_commits_it() -> None:
    """Gavel's base FIFO places a job on the last type (by name) with any free device, even when
    too few are free for its gang, as long as some type could hold it."""
    tp = throughputs(["a"])
    policy = policy_named("gavel_fifo")
    first = [Job(id=f"j{i}", job_type="a", devices=4, total_steps=10, arrival_s=i) for i in range(3)]
    capacity = {"k80": 8, "p100": 8, "v100": 6}
    allocation = policy(PolicyInput(jobs=first, capacity=capacity, throughputs=tp, seed=0))
    # v100 (6 free) takes j0 (2 left), then j1 though only 2 are free: v100 is over-committed.
    assert allocation["j0"] == {"v100": 1.0} and allocation["j1"] == {"v100": 1.0}
    assert allocation["j2"] == {"v100": 1.0}
    # It remembers: a finished job's type goes to the head of the queue, the others stay put.
    later = [*first[1:], Job(id="j3", job_type="a", devices=1, total_steps=10, arrival_s=3)]
    again = policy(PolicyInput(jobs=later, capacity=capacity, throughputs=tp, seed=0))
    assert again["j1"] == again["j2"] == {"v100": 1.0} and "j0" not in again
    # A fresh policy of that name starts with nothing remembered.
    fresh = policy_named("gavel_fifo")(PolicyInput(jobs=later, capacity=capacity, throughputs=tp))
    assert fresh["j1"] == {"v100": 1.0}


def test_gavel_las_gives_a_gang_the_same_throughput_per_device_as_a_single() -> None:
    """The scale-factor term: without it, a 4-device job would get the time of a 1-device job."""
    tp = throughputs(["a"])
    jobs = [
        Job(id="one", job_type="a", devices=1, total_steps=10, arrival_s=0),
        Job(id="four", job_type="a", devices=4, total_steps=10, arrival_s=0),
    ]
    allocation = gavel_las_perf(PolicyInput(jobs=jobs, capacity={"v100": 4}, throughputs=tp))
    # max min(x_one * 1 / 1, x_four * 4 / 4 * 4) under x_one + 4 x_four <= 4: the single runs all
    # the time and the gang a quarter or more (without the term: 0.8 each, the single held back).
    assert allocation["one"]["v100"] == pytest.approx(1.0)
    assert allocation["four"]["v100"] >= 0.25 - 1e-6


def test_a_cycle_re_solves_a_changed_job_set_only_after_the_interval() -> None:
    from shipyard.scheduling.cycle import Cycle

    tp = throughputs(["a"])
    cycle = Cycle(policy=policy_named("fifo_perf"), round_s=360, resolve_after_s=1920)
    one = [Job(id="j0", job_type="a", devices=1, total_steps=1e6, arrival_s=0)]
    two = [*one, Job(id="j1", job_type="a", devices=1, total_steps=1e6, arrival_s=100)]
    assert cycle.run(one, nodes(), tp, now_s=0).solved
    assert not cycle.run(two, nodes(), tp, now_s=360).solved  # changed, but only 360 s later
    assert cycle.run(two, nodes(), tp, now_s=1920).solved


def test_type_passes_fill_each_type_before_the_next_with_unallocated_jobs_last() -> None:
    """Gavel's placement: the V100 pass goes over every job, those allocated there by rank, then
    the others (oldest first) on what is left; a job taken there is not placed again."""
    tp = throughputs(["a"])
    cluster = [
        Node(id="v100-0", accelerator_type="v100", devices=2),
        Node(id="k80-0", accelerator_type="k80", devices=2),
    ]
    jobs = [Job(id=f"j{i}", job_type="a", devices=1, total_steps=10, arrival_s=i) for i in range(4)]
    allocation = {"j0": {"k80": 1.0}, "j3": {"v100": 1.0}, "j2": {"k80": 1.0}}
    plan = place_round(
        jobs, cluster, allocation, now_s=0, round_s=360, backfill=tp, type_passes=["v100", "k80"]
    )
    placed = {job_id: lease.accelerator_type for job_id, lease in plan.leases.items()}
    # v100: j3 (allocated), then the oldest unallocated with throughput there: j0 (allocated on
    # k80 only, but idle devices go to whoever runs); k80: j2, then j1.
    assert placed == {"j3": "v100", "j0": "v100", "j2": "k80", "j1": "k80"}


def test_gavels_rounds_end_at_their_last_finish() -> None:
    """One 100-second job after another: Shipyard's rounds wait out the 360 s, Gavel's end when the
    job does, so the second starts at 100 s."""
    tp = throughputs(["a"])  # 1 step/s on one device
    jobs = [TraceJob(job_type="a", devices=1, total_steps=100, arrival_s=0)] * 2
    nodes = cluster_nodes({"v100": 1}, 1)
    rounds = simulate(jobs, nodes, tp, policy_named("fifo_perf"), SimConfig(round_s=360))
    last_finish = simulate(
        jobs, nodes, tp, policy_named("fifo_perf"), SimConfig(round_s=360, round_ends_at_last_finish=True)
    )
    assert rounds.makespan_h * 3600 == pytest.approx(460)
    assert last_finish.makespan_h * 3600 == pytest.approx(200)


def test_gavel_las_takes_the_middle_of_its_optimal_allocations() -> None:
    """ECOS, as in Gavel: of the gang's optimal shares (0.25 to 0.75 beside a single that runs all
    the time) an interior point, not a vertex as HiGHS would return."""
    tp = throughputs(["a"])
    jobs = [
        Job(id="one", job_type="a", devices=1, total_steps=10, arrival_s=0),
        Job(id="four", job_type="a", devices=4, total_steps=10, arrival_s=0),
    ]
    allocation = gavel_las_perf(PolicyInput(jobs=jobs, capacity={"v100": 4}, throughputs=tp))
    assert 0.3 < allocation["four"]["v100"] < 0.7


def test_gavel_min_makespan_bisects_to_within_five_percent_of_the_optimum() -> None:
    """Two jobs of an hour's work on one device finish together at best after two hours; Gavel's
    bisection stops within 5 % of that, each job given the share that meets its T."""
    from shipyard.scheduling.policies.makespan import GAVEL_T_TOLERANCE, gavel_min_makespan

    tp = throughputs(["a"])  # 1 step/s on one device of any type
    jobs = [Job(id=f"j{i}", job_type="a", devices=1, total_steps=3600, arrival_s=0) for i in range(2)]
    allocation = gavel_min_makespan(PolicyInput(jobs=jobs, capacity={"v100": 1}, throughputs=tp))
    shares = [allocation[j.id]["v100"] for j in jobs]
    assert sum(shares) <= 1 + 1e-6
    horizon_s = max(3600 / share for share in shares)  # when the later one finishes at that rate
    assert 7200 * (1 - 1e-6) <= horizon_s <= 7200 * GAVEL_T_TOLERANCE * (1 + 1e-6)
    # Work that cannot finish within Gavel's first range (10^6 s) widens it tenfold.
    slow = [Job(id="long", job_type="a", devices=1, total_steps=5e6, arrival_s=0)]
    [share] = gavel_min_makespan(PolicyInput(jobs=slow, capacity={"v100": 1}, throughputs=tp))[
        "long"
    ].values()
    assert 1 / GAVEL_T_TOLERANCE - 1e-6 <= share <= 1 + 1e-6  # finishes within 5 % of 5 * 10^6 s
