"""Sia's own simulator beside Shipyard's, on Sia's workloads and cluster, in one invocation.

Sia (SOSP 2023) is run from its artifact (the ``sia-simulator`` folder of a checkout of
``siasosp23/artifacts``, with the Python environment its README asks for: numpy < 2, pandas < 2,
cvxpy with CBC, autograd, rich, psutil) with the command of its ``run_experiment.sh``:
``--policy=sia --policy_p_val=-0.5 --mip_lambda_a=0.01 --mip_lambda_n=1.1 --interval=60
--project_throughputs --share_max_replicas``, once with batch-size tuning off
(``--disable_bsz_tuning``: each job's batch is its workload's, as Shipyard's always is) and,
with ``--adaptive``, once as published. Shipyard's simulator runs the same workload file
(``sim.sia_workload``: the same traces, the same iterations per placement) with its elastic jobs
and the policy given. Prints average JCT, makespan, restarts per job and the ratios
Shipyard / Sia.

Sia's simulator takes tens of minutes a workload on two cores: ``--sia-results DIR`` keeps its
logs there and reads back those already run.

    .venv/bin/python benchmarks/sia_compare.py --sia-dir PATH/sia-simulator \\
        --sia-python PATH/bin/python [--workloads saturn/workload-1,philly/workload-1] \\
        [--policy shortest_remaining_fluid] [--adaptive] [--sia-results DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from shipyard.scheduling.policies import DEFAULT_POLICY, policy_named
from shipyard.sim.sia_workload import load_sia
from shipyard.sim.simulator import SimConfig, simulate

SIA_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "scheduling" / "sia"
SIA_FLAGS = [
    "--policy=sia",
    "--policy_p_val=-0.5",
    "--mip_lambda_a=0.01",
    "--mip_lambda_n=1.1",
    "--interval=60",
    "--project_throughputs",
    "--share_max_replicas",
]
"""``run_experiment.sh``'s invocation of Sia."""


def run_sia(sia_dir: Path, python: str, workload: str, adaptive: bool, results: Path) -> dict[str, Any]:
    """Sia's figures for one workload, from its log (run now unless ``results`` holds it)."""
    mode = "adaptive" if adaptive else "fixed"
    log = results / f"{workload.replace('/', '-')}-{mode}.log"
    if not log.exists():
        flags = SIA_FLAGS if adaptive else [*SIA_FLAGS, "--disable_bsz_tuning"]
        started = time.perf_counter()
        subprocess.run(
            [python, "multi_simulator.py", f"workloads/{workload}.csv", *flags, f"--output={log}"],
            cwd=sia_dir,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        print(f"  Sia ({mode}) on {workload}: {time.perf_counter() - started:.0f} s", flush=True)
    last = json.loads(log.read_text().splitlines()[-1])
    jobs = last["submitted_jobs"]
    jcts = [(j["completion_time"] - j["submission_time"]) / 3600 for j in jobs]
    first = min(j["submission_time"] for j in jobs)
    return {
        "avg_jct_h": statistics.fmean(jcts),
        "makespan_h": (max(j["completion_time"] for j in jobs) - first) / 3600,
        "restarts_per_job": statistics.fmean(j["num_restarts"] or 0 for j in jobs),
    }


def run_shipyard(workload: str, policy: str) -> dict[str, Any]:
    sia = load_sia(SIA_DATA / "workloads" / f"{workload}.csv", SIA_DATA / "traces")
    result = simulate(sia.jobs, sia.nodes, sia.throughputs, policy_named(policy), SimConfig(round_s=60.0))
    return {
        "avg_jct_h": result.avg_jct_h,
        "makespan_h": result.makespan_h,
        "restarts_per_job": result.restarts_per_job,
        "worst_ftf_rho": result.worst_ftf_rho,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sia-dir", type=Path, required=True, help="the sia-simulator folder of Sia's artifact"
    )
    parser.add_argument("--sia-python", default="python", help="a Python with Sia's requirements")
    parser.add_argument("--workloads", default="saturn/workload-1")
    parser.add_argument("--policy", default=DEFAULT_POLICY)
    parser.add_argument("--adaptive", action="store_true", help="also run Sia with its batch-size tuning")
    parser.add_argument("--sia-results", type=Path, default=Path("sia-results"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.sia_results.mkdir(parents=True, exist_ok=True)
    rows = []
    for workload in args.workloads.split(","):
        ours = run_shipyard(workload, args.policy)
        for adaptive in (False, True) if args.adaptive else (False,):
            theirs = run_sia(args.sia_dir, args.sia_python, workload, adaptive, args.sia_results)
            rows.append(
                {
                    "workload": workload,
                    "sia": "adaptive batch" if adaptive else "fixed batch",
                    "shipyard": ours,
                    "sia_figures": theirs,
                    "jct_ratio": ours["avg_jct_h"] / theirs["avg_jct_h"],
                    "makespan_ratio": ours["makespan_h"] / theirs["makespan_h"],
                }
            )
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    header = ("workload", "Sia", "JCT h ours/Sia", "ratio", "makespan h", "restarts")
    print("{:<22} {:<15} {:>16} {:>6} {:>16} {:>12}".format(*header))
    for r in rows:
        ours, theirs = r["shipyard"], r["sia_figures"]
        print(
            f"{r['workload']:<22} {r['sia']:<15} {ours['avg_jct_h']:>7.3f}/{theirs['avg_jct_h']:<8.3f}"
            f" {r['jct_ratio']:>6.3f} {ours['makespan_h']:>7.2f}/{theirs['makespan_h']:<8.2f}"
            f" {ours['restarts_per_job']:>5.1f}/{theirs['restarts_per_job']:<5.1f}"
        )


if __name__ == "__main__":
    main()
