"""Shipyard's scheduler beside Gavel's own simulator, on the same jobs, in one invocation.

36 V100 + 36 P100 + 36 K80 (4 per node), Gavel's simulation throughputs (read in place from
``../shared/data/scheduling/gavel``), Gavel's jobs (``--workload gavel`` draws them job for job as
Gavel does; each Gavel run's trace is checked against them), multi-GPU jobs, 360 s rounds, jobs
4000-5000 measured, seeds 0-2, gangs spread over nodes at the consolidated speed (Gavel's model).

- fidelity: the ports ``gavel_fifo``, ``fifo_perf`` and ``gavel_las_perf`` under Gavel's round
  mechanism (``--mechanism gavel``) at 1.0 job/h, ``gavel_las_perf`` at 2.4 jobs/h, beside Gavel's
  simulator run now (``fifo``, ``fifo_perf``, ``max_min_fairness_perf``) and its notebook figures;
  the gate: within 5 % of Gavel's simulator and 10 % of the notebook, mean over seeds;
- the anchor: the default policy (Shipyard's mechanism) against the faithful LAS at 2.4 and 2.6
  jobs/h and on 700 static jobs, beside the fluid lower bound of the same 700 jobs, with no restart
  cost and with 30 s;
- with ``--spread-slowdown``: the same anchor where gangs spread over nodes run slower.

Gavel's simulator runs in a Python of its own (numpy, scipy, cvxpy, ecos, psutil: see
``../shared/tools/gavel-reference/README.md``); without ``--gavel-python`` only Shipyard's side runs.
``--gavel-cache DIR`` keeps each Gavel run's JSON (``POLICY-RATE-sSEED.json``) and reuses those
already there.

    .venv/bin/python benchmarks/scheduler_gavel.py --gavel-python gavel-venv/bin/python \\
        [--gavel-cache DIR] [--seeds 0,1,2] [--workers 2] [--spread-slowdown] [--json] \\
        [--challengers shortest_remaining_perf,shortest_remaining_fluid] [--skip-fidelity]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from shipyard.services.cluster.simulation import SimRequest, run
from shipyard.sim.bounds import fluid_makespan_s
from shipyard.sim.workload import generate_gavel_jobs, load_throughputs

SHARED = Path(__file__).resolve().parents[2] / "shared"
THROUGHPUTS = SHARED / "data" / "scheduling" / "gavel" / "simulation_throughputs.json"
RUN_GAVEL = SHARED / "tools" / "gavel-reference" / "run_gavel.py"
CLUSTER = "v100=36,p100=36,k80=36"
WINDOW = "4000:5000"

FIDELITY = [("gavel_fifo", "1.0"), ("fifo_perf", "1.0"), ("gavel_las_perf", "1.0"), ("gavel_las_perf", "2.4")]
GAVEL_NAME = {"gavel_fifo": "fifo", "fifo_perf": "fifo_perf", "gavel_las_perf": "max_min_fairness_perf"}
NOTEBOOK = {
    ("gavel_fifo", "1.0"): 19.92,
    ("fifo_perf", "1.0"): 17.34,
    ("gavel_las_perf", "1.0"): 18.54,
    ("gavel_las_perf", "2.4"): 30.03,
}
"""Average JCT (h) in Gavel's notebooks, as the issue quotes them."""
DEFAULT = "shortest_remaining_fluid"


def anchor_runs(challengers: list[str]) -> list[tuple[str, str, str, float]]:
    """(policy, mechanism, load, restart cost s): each challenger (Shipyard's mechanism) beside
    the faithful LAS (Gavel's) at every load and restart cost, and both makespan programs."""
    pairs = [*((p, "shipyard") for p in challengers), ("gavel_las_perf", "gavel")]
    return [
        *(
            (p, m, load, cost)
            for load in ("2.4", "2.6", "static700")
            for cost in (0.0, 30.0)
            for p, m in pairs
        ),
        ("min_makespan", "shipyard", "static700", 0.0),
        ("gavel_min_makespan", "gavel", "static700", 0.0),
    ]


def shipyard(policy: str, mechanism: str, load: str, restart_cost_s: float, seed: int, spread: bool) -> dict:
    static = load.startswith("static")
    request = SimRequest(
        throughputs=THROUGHPUTS,
        cluster=CLUSTER,
        devices_per_node=4,
        policy=policy,
        workload="gavel",
        multi_gpu=True,
        rate_per_h=None if static else float(load),
        static_jobs=int(load.removeprefix("static")) if static else None,
        seed=seed,
        window=None if static else WINDOW,
        round_s=360,
        restart_cost_s=restart_cost_s,
        spread_slowdown=spread,
        mechanism=mechanism,
    )
    start = time.perf_counter()
    result = run(request).to_dict()
    wall_s = time.perf_counter() - start
    return {"policy": policy, "mechanism": mechanism, "load": load, "restart_cost_s": restart_cost_s,
            "spread_slowdown": spread, "seed": seed, "wall_s": wall_s, **result}  # fmt: skip


def gavel(python: str, policy: str, load: str, seed: int, cache: Path) -> dict:
    """One run of Gavel's simulator (or its cached JSON), with its trace checked against our jobs."""
    out = cache / f"{policy}-{load}-s{seed}.json"
    if not out.exists():
        command = [python, str(RUN_GAVEL), policy, load, str(seed), "--window", WINDOW, "--out", str(out)]
        subprocess.run(command, check=True, capture_output=True, timeout=3600)
    result = json.loads(out.read_text())
    trace = result.pop("trace")
    ours = generate_gavel_jobs(
        load_throughputs(THROUGHPUTS), count=len(trace), rate_per_h=float(load), multi_gpu=True, seed=seed
    )
    differ = sum(
        1
        for (arrival, job_type, devices, steps), job in zip(trace, ours, strict=True)
        if (job.job_type, job.devices) != (job_type, devices)
        or not math.isclose(job.total_steps, steps, rel_tol=1e-9)
        or not math.isclose(job.arrival_s, arrival, rel_tol=1e-9, abs_tol=1e-6)
    )
    return {"policy": policy, "load": load, "seed": seed, "avg_jct_h": result["avg_jct_h"],
            "wall_s": result["wall_s"], "jobs": len(trace), "jobs_differing": differ}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gavel-python", help="a Python that runs Gavel's simulator")
    parser.add_argument("--gavel-cache", type=Path, help="keep (and reuse) Gavel's runs here")
    parser.add_argument(
        "--spread-slowdown", action="store_true", help="also the anchor with slower spread gangs"
    )
    parser.add_argument("--loads", default="2.4,2.6,static700", help="the anchor's loads")
    parser.add_argument("--restart-costs", default="0,30", help="the anchor's restart costs, seconds")
    parser.add_argument(
        "--challengers", default=DEFAULT, help="the policies run against the faithful LAS (comma list)"
    )
    parser.add_argument("--skip-fidelity", action="store_true", help="only the anchor")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    loads, costs = args.loads.split(","), [float(c) for c in args.restart_costs.split(",")]
    anchor = [a for a in anchor_runs(args.challengers.split(",")) if a[2] in loads and a[3] in costs]
    fidelity = [] if args.skip_fidelity else FIDELITY
    seeds = [int(s) for s in args.seeds.split(",")]
    cache = args.gavel_cache or Path(tempfile.mkdtemp(prefix="gavel-runs-"))
    cache.mkdir(parents=True, exist_ok=True)

    ours: list[Future] = []
    theirs: list[Future] = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        if args.gavel_python:  # the slowest first, so both sides finish together
            for policy, load in fidelity:
                for seed in seeds:
                    theirs.append(
                        pool.submit(gavel, args.gavel_python, GAVEL_NAME[policy], load, seed, cache)
                    )
        tasks = [(policy, "gavel", load, 0.0, False) for policy, load in fidelity]
        for policy, mechanism, load, cost in anchor:
            tasks.append((policy, mechanism, load, cost, False))
            if args.spread_slowdown and cost == 0:
                tasks.append((policy, mechanism, load, cost, True))
        for seed in seeds:
            for policy, mechanism, load, cost, spread in dict.fromkeys(tasks):  # each run once
                ours.append(pool.submit(shipyard, policy, mechanism, load, cost, seed, spread))
        runs = [_logged(f.result(), "shipyard") for f in ours]
        gavel_runs = [_logged(f.result(), "gavel") for f in theirs]

    report = summarize(runs, gavel_runs, seeds, anchor, fidelity, with_spread=args.spread_slowdown)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    _print(report)


def summarize(
    runs: list[dict],
    gavel_runs: list[dict],
    seeds: list[int],
    anchor: list,
    fidelity_runs: list,
    *,
    with_spread: bool,
) -> dict:
    """The fidelity rows, the anchor rows and the fluid bounds, from the runs of both sides."""
    throughputs = load_throughputs(THROUGHPUTS)
    capacity = {k: int(n) for k, n in (part.split("=") for part in CLUSTER.split(","))}
    bounds = [
        fluid_makespan_s(
            generate_gavel_jobs(throughputs, count=700, rate_per_h=None, multi_gpu=True, seed=seed),
            throughputs,
            capacity,
        )
        / 3600
        for seed in seeds
    ]
    fidelity = []
    for policy, load in fidelity_runs:
        mine = [r["avg_jct_h"] for r in runs if _key(r) == (policy, "gavel", load, 0.0, False)]
        reference = [
            r["avg_jct_h"] for r in gavel_runs if (r["policy"], r["load"]) == (GAVEL_NAME[policy], load)
        ]
        row: dict[str, Any] = {"policy": policy, "load": load, "shipyard_h": statistics.fmean(mine),
                               "per_seed": mine, "notebook_h": NOTEBOOK[(policy, load)]}  # fmt: skip
        row["vs_notebook"] = row["shipyard_h"] / row["notebook_h"] - 1
        if reference:
            row["gavel_h"] = statistics.fmean(reference)
            row["gavel_per_seed"] = reference
            row["vs_gavel"] = row["shipyard_h"] / row["gavel_h"] - 1
            row["gavel_vs_notebook"] = row["gavel_h"] / row["notebook_h"] - 1
        row["passes"] = abs(row["vs_notebook"]) <= 0.10 and abs(row.get("vs_gavel", 0.0)) <= 0.05
        fidelity.append(row)
    rows = []
    for policy, mechanism, load, cost in anchor:
        for spread in (False, True) if with_spread and cost == 0 else (False,):
            group = [r for r in runs if _key(r) == (policy, mechanism, load, cost, spread)]
            metric = "makespan_h" if load.startswith("static") else "avg_jct_h"
            rows.append({"policy": policy, "mechanism": mechanism, "load": load, "restart_cost_s": cost,
                           "spread_slowdown": spread, "metric": metric,
                           "mean": statistics.fmean(r[metric] for r in group),
                           "per_seed": [r[metric] for r in group],
                           "worst_ftf_rho": max(r["worst_ftf_rho"] for r in group),
                           "restarts_per_job": statistics.fmean(r["restarts_per_job"] for r in group),
                           "vs_fluid_bound": [r[metric] / b for r, b in zip(group, bounds, strict=True)]
                           if load.startswith("static") else None})  # fmt: skip
    return {"fidelity": fidelity, "anchor": rows, "fluid_makespan_bound_h": bounds,
            "gavel_runs": gavel_runs, "runs": runs}  # fmt: skip


def _key(run: dict) -> tuple:
    return (run["policy"], run["mechanism"], run["load"], run["restart_cost_s"], run["spread_slowdown"])


def _logged(result: dict, side: str) -> dict:
    what = f"{result['policy']:>22} {result['load']:>9}"
    extra = (
        f" mechanism {result['mechanism']}, restart {result['restart_cost_s']:.0f}s"
        if side == "shipyard"
        else ""
    )
    if "jobs_differing" in result:
        extra = f", trace: {result['jobs'] - result['jobs_differing']}/{result['jobs']} jobs identical"
    print(f"  {side:>8} {what} seed {result['seed']}{extra}: avg JCT {result['avg_jct_h']:.2f} h "
          f"({result['wall_s']:.0f} s)", file=sys.stderr)  # fmt: skip
    return result


def _print(report: dict) -> None:
    if report["fidelity"]:
        print("fidelity (avg JCT, mean over seeds)")
        heading = ("port", 16), ("load", 5), ("Shipyard", 9), ("Gavel sim", 9), ("diff", 7), ("notebook", 8)
        print(" ".join(f"{name:>{width}}" for name, width in heading), f"{'diff':>7}")
    for r in report["fidelity"]:
        gavel = f"{r['gavel_h']:9.2f} {r['vs_gavel']:+7.1%}" if "gavel_h" in r else f"{'-':>9} {'-':>7}"
        print(f"{r['policy']:>16} {r['load']:>5} {r['shipyard_h']:9.2f} {gavel} {r['notebook_h']:8.2f} "
              f"{r['vs_notebook']:+7.1%}  gate {'pass' if r['passes'] else 'FAIL'}")  # fmt: skip
    print("\nanchor (mean over seeds; static: makespan)")
    for r in report["anchor"]:
        bound = f"  {statistics.fmean(r['vs_fluid_bound']):.3f}x bound" if r["vs_fluid_bound"] else ""
        spread = " spread-slowdown" if r["spread_slowdown"] else ""
        print(f"{r['policy']:>24} ({r['mechanism']}) {r['load']:>9} restart {r['restart_cost_s']:>2.0f}s"
              f"{spread}: {r['mean']:7.2f} h  worst rho {r['worst_ftf_rho']:.2f}  "
              f"restarts/job {r['restarts_per_job']:.2f}{bound}")  # fmt: skip
    by_key = {
        (r["policy"], r["load"], r["restart_cost_s"], r["spread_slowdown"]): r["mean"]
        for r in report["anchor"]
    }
    for (policy, load, cost, spread), mean in by_key.items():
        las = by_key.get(("gavel_las_perf", load, cost, spread))
        if policy.startswith("shortest_remaining") and las:
            print(f"{policy} / gavel_las_perf at {load}, restart {cost:.0f}s"
                  f"{', spread slowdown' if spread else ''}: {mean / las:.3f}")  # fmt: skip
    bounds = ", ".join(f"{b:.1f}" for b in report["fluid_makespan_bound_h"])
    print(f"fluid lower bound on the static makespan per seed: {bounds} h")


if __name__ == "__main__":
    main()
