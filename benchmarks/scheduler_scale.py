"""How long one scheduling cycle takes as the cluster grows.

Builds a synthetic snapshot — pending jobs of Gavel's 26 types and gang sizes, nodes of 8 devices
spread over 6 accelerator types with heterogeneous throughputs — and times the whole ``Cycle``
(memory fit, admission, policy, leases, reasons: the work the daemon does each round) for each
policy at several sizes, best of three.

    .venv/bin/python benchmarks/scheduler_scale.py [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import time

from shipyard.scheduling.cycle import Cycle
from shipyard.scheduling.model import Job, Node, Throughputs
from shipyard.scheduling.policies import policy_named

TYPES = ("h100-sxm", "a100-80gb", "v100-32gb", "rtx-4090", "mi250", "m2-ultra")
SIZES = [(64, 200), (512, 2000), (8000, 10000)]
"""(devices, pending jobs)."""


def snapshot(devices: int, jobs: int, seed: int = 0) -> tuple[list[Job], list[Node], Throughputs]:
    rng = random.Random(seed)
    per_node = 8
    nodes = [
        Node(id=f"n{i}", accelerator_type=TYPES[i % len(TYPES)], devices=per_node)
        for i in range(devices // per_node)
    ]
    job_types = [f"type-{t}" for t in range(26)]
    packed = {}
    for t, name in enumerate(job_types):
        for k, accelerator in enumerate(TYPES):
            base = (1.0 + t % 5) * (1.5**-k) * (1 + 0.3 * ((t * (k + 1)) % 4))
            for gang in (1, 2, 4, 8):
                packed[(name, gang, accelerator)] = base * gang * 0.9
    pending = [
        Job(
            id=f"j{i}",
            job_type=rng.choice(job_types),
            devices=rng.choice((1, 1, 1, 1, 1, 1, 1, 2, 4, 8)),
            arrival_s=float(i),
            total_steps=rng.uniform(1e3, 1e6),
        )
        for i in range(jobs)
    ]
    return pending, nodes, Throughputs(packed=packed)


def time_cycle(policy: str, devices: int, jobs: int) -> float:
    pending, nodes, throughputs = snapshot(devices, jobs)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        Cycle(policy=policy_named(policy), round_s=360).run(pending, nodes, throughputs, now_s=1e5)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--policies", default="shortest_remaining_fluid,shortest_remaining_perf,fifo_perf,gavel_las_perf"
    )
    args = parser.parse_args()
    results = []
    for policy in args.policies.split(","):
        for devices, jobs in SIZES:
            results.append(
                {
                    "policy": policy,
                    "devices": devices,
                    "jobs": jobs,
                    "cycle_s": time_cycle(policy, devices, jobs),
                }
            )
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(
            f"{r['policy']:>16}  {r['devices']:>5} devices  {r['jobs']:>6} pending jobs  "
            f"{r['cycle_s'] * 1000:9.1f} ms"
        )


if __name__ == "__main__":
    main()
