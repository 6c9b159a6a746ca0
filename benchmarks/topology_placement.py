"""Topology-aware placement beside rack-blind packing, on Gavel's jobs, in one invocation.

The cluster of Gavel's experiments (36 V100 + 36 P100 + 36 K80, 4 per node) in racks of
``--nodes-per-rack`` nodes; Gavel's multi-GPU jobs at ``--rate`` jobs/h, jobs 4000-5000 measured.
A gang within one node runs at Gavel's consolidated throughput, over nodes of one rack at its
unconsolidated one, over racks slower again by the same factor (``with_fabric_slowdown``: an
assumption, as Gavel's file measures one spread level). Each policy runs twice on the same jobs:
with the ``pack`` placer (fewest nodes, racks unseen: the placement before the framework, and
Gavel's) and the ``topology`` placer (fewest racks first); both value a gang at the level it
must spread to. Prints average JCT, makespan and the share of spread gang-rounds over the fabric,
with the ratios topology / pack.

    .venv/bin/python benchmarks/topology_placement.py [--seeds 0,1,2] [--rate 2.4] \\
        [--nodes-per-rack 3] [--policies shortest_remaining_fluid,gavel_las_perf] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from shipyard.scheduling.model import Job, RoundPlan
from shipyard.services.cluster.simulation import SimRequest, run

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
THROUGHPUTS = SHARED_DATA / "scheduling" / "gavel" / "simulation_throughputs.json"
MECHANISM = {"gavel_las_perf": "gavel"}
"""The faithful ports run under Gavel's round mechanism, as in the Gavel benchmark."""


def one(
    policy: str, placement: str, seed: int, rate: float, nodes_per_rack: int, window: str
) -> dict[str, Any]:
    levels: Counter[str] = Counter()

    def count(_now: float, _jobs: Sequence[Job], plan: RoundPlan) -> None:
        levels.update(lease.level for lease in plan.leases.values())

    request = SimRequest(
        throughputs=THROUGHPUTS,
        cluster="v100=36,p100=36,k80=36",
        policy=policy,
        multi_gpu=True,
        rate_per_h=rate,
        seed=seed,
        window=window,
        mechanism=MECHANISM.get(policy, "shipyard"),
        nodes_per_rack=nodes_per_rack,
        placement=placement,
    )
    result = run(request, on_round=count).to_dict()
    spread = levels["rack"] + levels["fabric"]
    return {
        "policy": policy,
        "placement": placement,
        "seed": seed,
        "avg_jct_h": result["avg_jct_h"],
        "makespan_h": result["makespan_h"],
        "fabric_share": levels["fabric"] / spread if spread else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rate", type=float, default=2.4)
    parser.add_argument("--nodes-per-rack", type=int, default=3)
    parser.add_argument("--window", default="4000:5000")
    parser.add_argument("--policies", default="shortest_remaining_fluid,gavel_las_perf")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [
        (p, placement, s)
        for p in args.policies.split(",")
        for s in seeds
        for placement in ("pack", "topology")
    ]
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [
            pool.submit(one, p, placement, s, args.rate, args.nodes_per_rack, args.window)
            for p, placement, s in runs
        ]
        results = [f.result() for f in futures]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    racks = f"racks of {args.nodes_per_rack} 4-device nodes"
    print(f"Gavel's multi-GPU jobs at {args.rate} jobs/h, {racks}, seeds {args.seeds}")
    print(f"{'policy':28} {'placer':9} {'avg JCT h':>10} {'makespan h':>11} {'over fabric':>12}")
    for policy in args.policies.split(","):
        mean: dict[str, dict[str, float]] = {}
        for placement in ("pack", "topology"):
            rows = [r for r in results if r["policy"] == policy and r["placement"] == placement]
            mean[placement] = {
                k: statistics.mean(r[k] for r in rows) for k in ("avg_jct_h", "makespan_h", "fabric_share")
            }
            jct, makespan, fabric = (mean[placement][k] for k in ("avg_jct_h", "makespan_h", "fabric_share"))
            print(f"{policy:28} {placement:9} {jct:10.2f} {makespan:11.1f} {fabric:11.0%}")
        jct = mean["topology"]["avg_jct_h"] / mean["pack"]["avg_jct_h"]
        makespan = mean["topology"]["makespan_h"] / mean["pack"]["makespan_h"]
        print(f"{policy:28} {'ratio':9} {jct:10.3f}x {makespan:10.3f}x   (topology / pack)")


if __name__ == "__main__":
    main()
