"""Score the capacity planner on published training runs.

Reads a CSV of published runs (by default ``../shared/data/planner/training-runs-dev.csv``, in
place), turns each usable row into a planner call with the row's own layout, and prints per-row
predictions beside the measured figures, then the median absolute percentage error (MdAPE) of
per-device throughput and of wall time, and the share of rows within +-20 %. It also times one
`shipyard plan train` and one `shipyard plan compare` over the whole catalog.

    .venv/bin/python benchmarks/planner_accuracy.py [--runs FILE.csv] [--heldout FILE.csv]
        [--cross-validate ITERATIONS] [--json]

Beside the fit it scores the held-out file (runs the constants were never fitted on) and, with
``--cross-validate``, refits the shared constants without each source family and predicts that
family: the cross-validated figure is the one to quote.

A row is usable when its hardware maps onto a catalog key and it reports tokens/s per device,
TFLOPS per device or MFU. Rows without a device count get one device per sequence of the
global batch, rounded to a power of two (it sets how many tokens each device sees per step).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from planner_calibrate import calibration_from, fit
from planner_cases import (
    DEVELOPMENT_RUNS,
    HELDOUT_RUNS,
    RULE_OF_THUMB_MFU,
    Case,
    load_all,
    load_cases,
    score,
    summarize,
)

from shipyard.planner.calibration import Calibration


def refits(cases: list[Case], maxiter: int) -> Iterator[tuple[list[Case], Calibration]]:
    """Leave one source out: for each paper or vendor family, its rows and the shared constants
    refitted without them (``planner_calibrate.fit``)."""
    families = sorted({c.family for c in cases})
    for n, family in enumerate(families, start=1):
        print(f"  refitting without {family} ({n}/{len(families)})", file=sys.stderr, flush=True)
        held = [c for c in cases if c.family == family]
        yield held, calibration_from(fit([c for c in cases if c.family != family], maxiter))


def cross_validate(cases: list[Case], maxiter: int) -> dict[str, object]:
    """Each family's rows predicted with the constants fitted without it: what the planner scores
    on runs it has never seen."""
    rows: list[dict[str, object]] = []
    for held, fitted in refits(cases, maxiter):
        rows += score(held, fitted)["rows"]  # type: ignore[arg-type]
    return with_families(summarize(rows))


def with_families(summary: dict[str, object]) -> dict[str, object]:
    rows: list[dict[str, object]] = summary["rows"]  # type: ignore[assignment]
    families = sorted({str(r["family"]) for r in rows})
    by_family = {
        f: statistics.median(abs(r["error"]) for r in rows if r["family"] == f)  # type: ignore[arg-type]
        for f in families
    }
    return {**summary, "families": by_family}


def _time_command(args: list[str], repeats: int = 3) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "shipyard.cli.main", *args], check=True, capture_output=True)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="+", default=list(DEVELOPMENT_RUNS))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--heldout", type=Path, default=HELDOUT_RUNS, help="runs no fit has seen")
    parser.add_argument("--no-timing", action="store_true", help="skip timing the CLI")
    parser.add_argument(
        "--cross-validate",
        type=int,
        metavar="ITERATIONS",
        default=0,
        help="also refit without each source family (Nelder-Mead iterations per fit; 600 takes minutes)",
    )
    args = parser.parse_args()
    cases, skipped = load_all(args.runs)
    result = score(cases)
    result["skipped"] = skipped
    heldout, _ = load_cases(args.heldout)
    result["heldout"] = score(heldout)
    if args.cross_validate:
        result["cross_validated"] = cross_validate(cases, args.cross_validate)
    if not args.no_timing:
        result["plan_train_s"] = _time_command(
            ["plan", "train", "--params", "175e9", "--accelerator", "h100-sxm", "--count", "1024", "--json"]
        )
        result["plan_compare_s"] = _time_command(
            ["plan", "compare", "--params", "70e9", "--workload", "train"]
        )
    if args.json:
        print(json.dumps(result, indent=2))
        return
    header = (
        f"{'run':40} {'device':>10} {'n':>5} {'metric':>8} {'measured':>10} {'predicted':>10} {'error':>7}"
    )
    print(f"{header}  layout")
    for r in result["rows"]:  # type: ignore[attr-defined]
        metric = {"tokens_per_s_per_device": "tok/s", "tflops_per_device": "TFLOPS", "mfu": "MFU"}[
            r["metric"]
        ]
        fits = "" if r["fits"] else " (does not fit)"
        print(
            f"{r['run_id']:40} {r['accelerator']:>10} {r['count']:>5} {metric:>8} {r['measured']:>10.4g} "
            f"{r['predicted']:>10.4g} {r['error']:>+7.1%}  {r['layout']}{fits}"
        )
    for run, why in skipped:
        print(f"{run:40} skipped: {why}")
    print()
    print(f"rows scored: {result['scored']} (skipped {len(skipped)})")
    print(f"throughput per device MdAPE: {result['throughput_mdape']:.1%} (target <= 10%)")
    if result["wall_time_mdape"] is not None:
        rows = result["wall_time_rows"]
        print(f"wall time MdAPE: {result['wall_time_mdape']:.1%} over {rows} rows (target <= 15%)")
    print(f"rows within +-20%: {result['within_20pct']:.0%} (target >= 75%)")
    print(
        f"rule of thumb (6N + attention at a flat {RULE_OF_THUMB_MFU:.0%} MFU): MdAPE "
        f"{result['rule_of_thumb_mdape']:.1%}, within +-20% {result['rule_of_thumb_within_20pct']:.0%}; "
        f"Shipyard's MdAPE is {result['throughput_mdape'] / result['rule_of_thumb_mdape']:.2f}x the rule's"
    )
    _print_summary(f"held-out file ({args.heldout.name}, shipped constants)", result["heldout"])
    if "cross_validated" in result:
        cv = result["cross_validated"]
        _print_summary("cross-validated, leaving out one source family at a time", cv)
        print("  by family: " + ", ".join(f"{f} {e:.1%}" for f, e in cv["families"].items()))
    if "plan_train_s" in result:
        train_s = result["plan_train_s"]
        print(f"`shipyard plan train` (175B on 1024 h100-sxm, search): {train_s:.2f} s (target < 0.3 s)")
        print(
            f"`shipyard plan compare` over the whole catalog: {result['plan_compare_s']:.2f} s (target < 2 s)"
        )


def _print_summary(title: str, summary: dict[str, object]) -> None:
    print(
        f"{title}: throughput MdAPE {summary['throughput_mdape']:.1%} over {summary['scored']} rows, "
        f"within +-20% {summary['within_20pct']:.0%} (targets <= 10%, >= 75%); rule of thumb "
        f"{summary['rule_of_thumb_mdape']:.1%}"
    )


if __name__ == "__main__":
    main()
