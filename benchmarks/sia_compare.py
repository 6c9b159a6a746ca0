"""Sia's own simulator beside Shipyard's, on Sia's workloads and cluster, in one invocation.

Sia (SOSP 2023) is run from its artifact (the ``sia-simulator`` folder of a checkout of
``siasosp23/artifacts``, with the Python environment its README asks for: numpy < 2, pandas < 2,
cvxpy with CBC, autograd, rich, psutil) with the command of its ``run_experiment.sh``:
``--policy=sia --policy_p_val=-0.5 --mip_lambda_a=0.01 --mip_lambda_n=1.1 --interval=60
--project_throughputs --share_max_replicas``, once with batch-size tuning off
(``--disable_bsz_tuning``: each job's batch is its workload's, as Shipyard's always is) and,
with ``--adaptive``, once as published. Shipyard's simulator runs the same workload file
(``sim.sia_workload``: the same traces, the same iterations per placement, the same restart
seconds) twice: with Sia's own sizing program (``sizing="sia"``: the fidelity check, its ratio
to Sia's simulator should be within 5 %) and with Shipyard's default policy and sizing.

Prints, per workload, average JCT, makespan, restarts per job and the worst finish-time
fairness (rho, one definition for both simulators' finish times), and the ratios Shipyard /
Sia; then each family's mean ratio over its workloads.

Sia's simulator takes one to fifteen minutes a workload with the batch fixed, and runs beside
Shipyard's simulations: ``--sia-results DIR`` keeps its logs there and reads back those already
run.

    .venv/bin/python benchmarks/sia_compare.py --sia-dir PATH/sia-simulator \\
        --sia-python PATH/bin/python [--workloads saturn/workload-1,scale/rate_30/workload-1] \\
        [--adaptive] [--sia-results DIR] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shipyard.scheduling.policies import DEFAULT_POLICY, policy_named
from shipyard.scheduling.sizing import DEFAULT_SIZING, Sizing
from shipyard.sim.sia_beliefs import beliefs_of
from shipyard.sim.sia_workload import SiaWorkload, load_sia
from shipyard.sim.simulator import SimConfig, finish_time_fairness, simulate

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
SIA_JOB_MODEL = SimConfig(round_s=60.0, first_start_costs=True, node_moves_free=True)
"""Sia's rounds (``--interval=60``), and its restarts: every start costs the application's
seconds, the first included (each job's ``restart_s``), a move to other nodes of the same shape
none."""


def workload_of(name: str) -> SiaWorkload:
    return load_sia(SIA_DATA / "workloads" / f"{name}.csv", SIA_DATA / "traces")


def run_sia(sia_dir: Path, python: str, workload: str, adaptive: bool, results: Path) -> dict[str, Any]:
    """Sia's figures for one workload, from its log (run now unless ``results`` holds it)."""
    mode = "adaptive" if adaptive else "fixed"
    log = results / f"{workload.replace('/', '-')}-{mode}.log"
    if not log.exists():
        flags = SIA_FLAGS if adaptive else [*SIA_FLAGS, "--disable_bsz_tuning"]
        started = time.perf_counter()
        part = log.with_suffix(".part")
        subprocess.run(
            [python, "multi_simulator.py", f"workloads/{workload}.csv", *flags, f"--output={part}"],
            cwd=sia_dir,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        part.rename(log)
        print(f"  Sia ({mode}) on {workload}: {time.perf_counter() - started:.0f} s", flush=True)
    finished = {j["name"]: j for j in json.loads(log.read_text().splitlines()[-1])["submitted_jobs"]}
    sia = workload_of(workload)
    finish_s = [finished[name]["completion_time"] for name in sia.names]
    jcts = [(f - job.arrival_s) / 3600 for job, f in zip(sia.jobs, finish_s, strict=True)]
    rhos = finish_time_fairness(sia.jobs, finish_s, sia.throughputs, sia.nodes)
    return {
        "avg_jct_h": statistics.fmean(jcts),
        "makespan_h": (max(finish_s) - min(j.arrival_s for j in sia.jobs)) / 3600,
        "restarts_per_job": statistics.fmean(finished[n]["num_restarts"] or 0 for n in sia.names),
        "worst_ftf_rho": max(r for r in rhos if r is not None),
    }


def run_shipyard(workload: str, policy: str, sizing: Sizing = DEFAULT_SIZING) -> dict[str, Any]:
    sia = workload_of(workload)
    # Sia's program decides on what it learned of each job; Shipyard's on the planned curve.
    beliefs = beliefs_of(sia) if sizing == "sia" else None
    config = dataclasses.replace(SIA_JOB_MODEL, sizing=sizing, beliefs=beliefs)
    result = simulate(sia.jobs, sia.nodes, sia.throughputs, policy_named(policy), config)
    return {
        "avg_jct_h": result.avg_jct_h,
        "makespan_h": result.makespan_h,
        "restarts_per_job": result.restarts_per_job,
        "worst_ftf_rho": result.worst_ftf_rho,
    }


def _row(workload: str, ours: str, theirs: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {
        "workload": workload,
        "shipyard": ours,
        "sia": theirs,
        "shipyard_figures": a,
        "sia_figures": b,
        "jct_ratio": a["avg_jct_h"] / b["avg_jct_h"],
        "makespan_ratio": a["makespan_h"] / b["makespan_h"],
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
    parser.add_argument("--workers", type=int, default=2, help="Shipyard's simulations in parallel")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.sia_results.mkdir(parents=True, exist_ok=True)
    workloads = args.workloads.split(",")
    modes = [False, True] if args.adaptive else [False]
    # Sia's runs (one at a time, each its own process) go on beside Shipyard's simulations.
    with ProcessPoolExecutor(args.workers) as pool, ThreadPoolExecutor(1) as sia_runs:
        sia = {
            (w, mode): sia_runs.submit(run_sia, args.sia_dir, args.sia_python, w, mode, args.sia_results)
            for w in workloads
            for mode in modes
        }
        ports = pool.map(run_shipyard, workloads, [args.policy] * len(workloads), ["sia"] * len(workloads))
        defaults = pool.map(run_shipyard, workloads, [args.policy] * len(workloads))
        rows = []
        for workload, port, ours in zip(workloads, ports, defaults, strict=True):
            fixed = sia[(workload, False)].result()
            rows.append(_row(workload, "Sia's program", "fixed batch", port, fixed))
            rows.append(_row(workload, f"{args.policy}+{DEFAULT_SIZING}", "fixed batch", ours, fixed))
            if args.adaptive:
                adaptive = sia[(workload, True)].result()
                rows.append(
                    _row(workload, f"{args.policy}+{DEFAULT_SIZING}", "adaptive batch", ours, adaptive)
                )
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    header = ("workload", "Shipyard", "Sia", "JCT h ours/Sia", "ratio", "makespan h", "restarts", "worst rho")
    print("{:<26} {:<36} {:<14} {:>14} {:>6} {:>13} {:>9} {:>11}".format(*header))
    for r in rows:
        a, b = r["shipyard_figures"], r["sia_figures"]
        print(
            f"{r['workload']:<26} {r['shipyard']:<36} {r['sia']:<14}"
            f" {a['avg_jct_h']:>6.3f}/{b['avg_jct_h']:<7.3f} {r['jct_ratio']:>6.3f}"
            f" {a['makespan_h']:>5.1f}/{b['makespan_h']:<7.1f}"
            f" {a['restarts_per_job']:>4.1f}/{b['restarts_per_job']:<4.1f}"
            f" {a['worst_ftf_rho']:>5.2f}/{b['worst_ftf_rho']:<5.2f}"
        )
    print("\nMean JCT ratio by family (Shipyard / Sia):")
    families: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        family = r["workload"].rsplit("/", 1)[0]
        families.setdefault((family, r["shipyard"], r["sia"]), []).append(r["jct_ratio"])
    for (family, ours_name, sias), ratios in sorted(families.items()):
        mean = statistics.fmean(ratios)
        print(f"  {family:<16} {ours_name:<36} vs Sia {sias:<14} {mean:.3f} over {len(ratios)}")


if __name__ == "__main__":
    main()
