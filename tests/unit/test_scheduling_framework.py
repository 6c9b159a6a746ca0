"""The scheduling framework: filters, placers, profiles and topology levels, through the same
``Cycle`` the agent and the simulator run."""

from __future__ import annotations

import typing

import pytest

from shipyard.errors import InvalidSpec
from shipyard.scheduling.cycle import Cycle
from shipyard.scheduling.framework import (
    PLACERS,
    Pack,
    Profile,
    Topology,
    level_of,
    profile_named,
    queue_profiles,
)
from shipyard.scheduling.model import Job, Node, PolicyInput, Throughputs
from shipyard.scheduling.policies import policy_named
from shipyard.scheduling.quota import queues_of
from shipyard.scheduling.rounds import place_round
from shipyard.scheduling.status import Reason
from shipyard.schemas.queues import Placement, parse_queue_config
from shipyard.services.cluster.simulation import SimRequest, run
from shipyard.sim.workload import with_fabric_slowdown
from tests.builders import GAVEL_THROUGHPUTS

GAVEL = GAVEL_THROUGHPUTS


def racked(racks: int, nodes_per_rack: int, devices: int = 4, kind: str = "v100") -> list[Node]:
    return [
        Node(id=f"n{r}{i}", accelerator_type=kind, devices=devices, labels={"rack": f"r{r}"})
        for r in range(racks)
        for i in range(nodes_per_rack)
    ]


def job(job_id: str, devices: int, **kwargs: object) -> Job:
    return Job(id=job_id, job_type="lm", devices=devices, total_steps=100.0, **{"arrival_s": 0.0, **kwargs})  # type: ignore[arg-type]


def tp(packed: float = 8.0, spread: float = 6.0, fabric: float = 3.0, devices: int = 8) -> Throughputs:
    key = ("lm", devices, "v100")
    return Throughputs(
        packed={key: packed, ("lm", 1, "v100"): 1.0}, spread={key: spread}, fabric={key: fabric}
    )


def test_a_spread_gang_goes_to_the_fewest_racks_and_is_valued_at_its_level() -> None:
    # Rack r0 has one node half taken: the emptiest nodes are n00's neighbour and r1's two, so
    # rack-blind packing takes one node of each rack; the topology placer keeps the gang in r1.
    nodes = racked(2, 2)
    busy = {"n00": 2, "n01": 4, "n10": 4, "n11": 4}
    gang = job("g", 8)
    packed = Pack()(gang, [nodes[1], nodes[2], nodes[0], nodes[3]], dict(busy))
    assert packed is not None and level_of(packed, {n.id: n for n in nodes}) == "fabric"
    placed = Topology()(gang, nodes, dict(busy))
    assert placed is not None and set(placed) == {"n10", "n11"}
    assert level_of(placed, {n.id: n for n in nodes}) == "rack"
    # One node holds a small gang: the same best fit as packing, whatever the racks.
    assert Topology()(job("s", 2), nodes, dict(busy)) == ("n00", "n00")

    # The policy values a gang by how far it must spread: racks of 8 devices, 4 per node.
    def valued(devices: int) -> float:
        inp = PolicyInput(
            jobs=[],
            capacity={"v100": 16},
            throughputs=tp(devices=devices),
            node_devices={"v100": 4},
            rack_devices={"v100": 8},
        )
        return inp.rate(job("j", devices), "v100")

    assert (valued(8), valued(16)) == (6.0, 3.0)  # over one rack's nodes; over the fabric


def test_the_cycle_leases_at_the_level_the_gang_runs_and_a_queue_may_have_its_own_placer() -> None:
    nodes = racked(2, 2)
    running = job("r", 2, running_on="v100", nodes=("n00", "n00"))
    gang = job("g", 8, queue="research")
    allocation = {"r": {"v100": 1.0}, "g": {"v100": 1.0}}
    plan = place_round([running, gang], nodes, allocation, now_s=0, round_s=360)
    assert plan.leases["g"].level == "rack" and set(plan.leases["g"].nodes) == {"n10", "n11"}
    assert plan.leases["r"].level == "node"
    # The research queue packs without regard to racks: the emptiest nodes, one in each rack.
    blind = {"research": Profile(placer=Pack())}
    plan = place_round([running, gang], nodes, allocation, now_s=0, round_s=360, queue_profiles=blind)
    assert set(plan.leases["g"].nodes) == {"n01", "n10"} and plan.leases["g"].level == "fabric"


def test_a_cordoned_node_takes_no_new_gang_keeps_its_running_one_and_is_named_in_the_reason() -> None:
    nodes = [
        Node(id="a", accelerator_type="v100", devices=4, unschedulable="disk: 2 GiB free"),
        Node(id="b", accelerator_type="v100", devices=4),
    ]
    there = job("there", 2, running_on="v100", nodes=("a", "a"))
    newcomer = job("new", 4, arrival_s=1.0)
    late = job("late", 4, arrival_s=2.0)
    cycle = Cycle(policy=policy_named("fifo_perf"), round_s=360)
    throughputs = Throughputs(packed={("lm", d, "v100"): 1.0 for d in (2, 4)})
    plan = cycle.run([there, newcomer, late], nodes, throughputs, now_s=0).plan
    assert plan.leases["there"].nodes == ("a", "a")  # kept: the filter judges new gangs only
    assert plan.leases["new"].nodes == ("b",) * 4
    reason = plan.pending_reasons["late"]
    assert reason.code == Reason.CORDONED
    assert "1 cordoned (a is cordoned: disk: 2 GiB free)" in reason.message
    # With every node cordoned and nothing running, nothing is leased and each job says why.
    shut = [Node(id="a", accelerator_type="v100", devices=4, unschedulable="a failing GPU")]
    plan = (
        Cycle(policy=policy_named("fifo_perf"), round_s=360).run([newcomer], shut, throughputs, now_s=0).plan
    )
    assert not plan.leases and plan.pending_reasons["new"].code == Reason.CORDONED


def test_plugins_are_chosen_by_name_and_an_unknown_name_is_refused_with_the_known_ones() -> None:
    assert profile_named("pack").names == {"filters": ["node_schedulable"], "placer": "pack"}
    assert profile_named("topology", filters=()).names == {"filters": [], "placer": "topology"}
    with pytest.raises(InvalidSpec, match="unknown placement 'spread'") as refused:
        profile_named("spread")
    assert "pack, topology" in (refused.value.hint or "")
    with pytest.raises(InvalidSpec, match="unknown scheduling filter"):
        profile_named("pack", filters=("gpu_health",))


@pytest.mark.skipif(not GAVEL.exists(), reason="Gavel's throughputs are in ../shared")
def test_the_simulator_runs_the_framework_over_racks_and_the_topology_placer_spreads_less() -> None:
    fabric = with_fabric_slowdown(
        Throughputs(packed={("lm", 8, "v100"): 8.0}, spread={("lm", 8, "v100"): 6.0})
    )
    assert fabric.fabric == {("lm", 8, "v100"): 4.5}  # slowed once more by its own 6/8
    levels: dict[str, dict[str, int]] = {"pack": {}, "topology": {}}
    results = {}
    for placement, seen in levels.items():

        def count(_now: float, _jobs: object, plan: object, seen: dict[str, int] = seen) -> None:
            for lease in plan.leases.values():  # type: ignore[attr-defined]
                seen[lease.level] = seen.get(lease.level, 0) + 1

        request = SimRequest(
            throughputs=GAVEL,
            cluster="v100=24,p100=24,k80=24",
            policy="fifo_perf",
            multi_gpu=True,
            rate_per_h=3.0,
            jobs=120,
            window="0:80",
            nodes_per_rack=2,
            placement=placement,
        )
        results[placement] = run(request, on_round=count)
    # Same jobs, same policy: the topology placer sends fewer gangs over the fabric.
    assert levels["topology"].get("fabric", 0) < levels["pack"].get("fabric", 0)
    assert levels["topology"].get("rack", 0) > 0
    assert results["topology"].to_dict()["avg_jct_h"] > 0
    with pytest.raises(InvalidSpec, match="--nodes-per-rack"):
        run(SimRequest(throughputs=GAVEL, cluster="v100=8", nodes_per_rack=-1))


def test_a_queue_file_may_give_a_queue_its_own_placer_and_an_unknown_one_is_refused() -> None:
    config = parse_queue_config(
        "clusterQueues: [{name: research, placement: pack}, {name: prod}]\nlocalQueues: {team: research}\n",
        source="queues.yaml",
    )
    queues = queues_of(config)
    # A job naming no queue (``default``) goes to the first cluster queue, research, and packs.
    assert queues.placements() == {"research": "pack", "team": "pack", "default": "pack"}
    profiles = queue_profiles(queues.placements())
    assert {q: p.placer.name for q, p in profiles.items()} == queues.placements()
    # The team's gang goes rack-blind over the fabric; the same gang in prod stays in one rack.
    nodes = racked(2, 2)
    running = job("r", 2, running_on="v100", nodes=("n00", "n00"))
    allocation = {"r": {"v100": 1.0}, "g": {"v100": 1.0}}
    for queue, level in (("team", "fabric"), ("prod", "rack")):
        gang = job("g", 8, queue=queue)
        plan = place_round([running, gang], nodes, allocation, now_s=0, round_s=360, queue_profiles=profiles)
        assert plan.leases["g"].level == level, queue
    assert set(typing.get_args(Placement)) == set(PLACERS)  # the file's words are the registry's
    with pytest.raises(InvalidSpec, match="placement"):
        parse_queue_config("clusterQueues: [{name: research, placement: spread}]\n", source="queues.yaml")
