"""Write the planner's evidence table (``src/shipyard/planner/evidence.json``): for each accelerator
type and precision regime, the published runs of the development file the planner is scored on,
the sources they come from, the planner's median absolute error of per-device throughput on them,
and the 80 % range a prediction there carries. Errors are cross-validated by source (the shared
constants refitted without each paper or vendor, its rows predicted with them: minutes of CPU)
unless ``--in-sample``.

How the ranges are derived (``docs/planning.md`` says the same for users):

- **published**: the 10th and 90th percentiles of log(measured / predicted) over every
  cross-validated row, pooled, then widened or narrowed per type and regime by its own median
  error against the pooled one, shrunk towards the pool (a type with few runs keeps most of the
  pooled width). A host's CPU (its matrix-multiply rate measured here) takes the pooled range.
- **extrapolated**: the same percentiles over the rows re-predicted as if their generation had no
  published run: its large-GEMM efficiency taken from the other generation's figure (Ampere
  from Hopper's and back), or for Gaudi 2 the figure read from Intel's reports before its runs
  were in the files, the way an extrapolated generation's is taken from a source, not a fit.

It then checks the ranges: the share of rows inside their range (the goal is 70-90 %) and the
median half-width, on the development file (cross-validated) and on the held-out file.

    .venv/bin/python benchmarks/planner_evidence.py [--runs FILE.csv] [--cross-validate ITERATIONS]
        [--in-sample]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from datetime import date
from pathlib import Path
from types import MappingProxyType

from planner_accuracy import refits, with_families
from planner_cases import DEVELOPMENT_RUNS, HELDOUT_RUNS, Case, load_all, load_cases, score, summarize

from shipyard.planner.calibration import CALIBRATION, Calibration
from shipyard.planner.evidence import regime_of

TABLE = Path(__file__).resolve().parents[1] / "src" / "shipyard" / "planner" / "evidence.json"
SHRINK_RUNS = 5
"""A type's own median error weighs as much as the pool's once it has this many runs."""
SIBLING = {"ampere": "hopper", "hopper": "ampere"}
"""The generation whose GEMM efficiency stands in for a generation predicted as unpublished."""
SOURCED = {"gaudi2": 0.55}
"""A generation's efficiency as the catalog took it from its vendor's reports before its own
runs were in the files (Intel's MLPerf GPT-3 submissions read as ~50 % of the bf16 peak): what
predicting it as unpublished means for it."""

Row = dict[str, object]


def as_unpublished(calibration: Calibration, architecture: str) -> Calibration:
    """``calibration`` as it would be had ``architecture`` no published run: its GEMM efficiency
    is its sibling's and nothing generation-specific was fitted for it."""
    gemm = dict(calibration.gemm_efficiency)
    gemm[architecture] = SOURCED[architecture] if architecture in SOURCED else gemm[SIBLING[architecture]]
    tp_overlap = {k: v for k, v in calibration.tp_overlap.items() if k != architecture}
    return dataclasses.replace(
        calibration, gemm_efficiency=MappingProxyType(gemm), tp_overlap=MappingProxyType(tp_overlap)
    )


def score_both(cases: list[Case], calibration: Calibration) -> tuple[list[Row], list[Row]]:
    """The rows as predicted with ``calibration``, and as predicted for unpublished generations."""
    rows: list[Row] = score(cases, calibration)["rows"]  # type: ignore[assignment]
    blind: list[Row] = []
    for case in cases:
        unpublished = as_unpublished(calibration, case.cluster.accelerator.architecture)
        blind += score([case], unpublished)["rows"]  # type: ignore[arg-type]
    return rows, blind


def log_ratio(row: Row) -> float:
    """log(measured / predicted): the factor to apply to a prediction to get the measurement."""
    return -math.log1p(float(row["error"]))  # type: ignore[arg-type]


def band(rows: list[Row]) -> tuple[float, float, float]:
    """Median and 10th / 90th percentiles of the rows' log ratios."""
    ratios = [log_ratio(r) for r in rows]
    deciles = statistics.quantiles(ratios, n=10, method="inclusive")
    return statistics.median(ratios), deciles[0], deciles[-1]


def factors(centre: float, low: float, high: float, scale: float = 1.0) -> dict[str, float]:
    return {
        "low": round(math.exp(centre + (low - centre) * scale), 3),
        "high": round(math.exp(centre + (high - centre) * scale), 3),
    }


def evidence_table(cases: list[Case], rows: list[Row], blind: list[Row], cross_validated: bool) -> Row:
    """``types[key][regime] = {runs, sources, median_error, range}`` and the classes' ranges."""
    regime = {c.run_id: regime_of(c.workload.precision) for c in cases}
    centre, low, high = band(rows)
    pooled_error = statistics.median(abs(float(r["error"])) for r in rows)  # type: ignore[arg-type]
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((str(row["accelerator"]), regime[str(row["run_id"])]), []).append(row)
    types: dict[str, dict[str, object]] = {}
    for (key, kind), members in sorted(groups.items()):
        own = statistics.median(abs(float(m["error"])) for m in members)  # type: ignore[arg-type]
        shrunk = (len(members) * own + SHRINK_RUNS * pooled_error) / (len(members) + SHRINK_RUNS)
        types.setdefault(key, {})[kind] = {
            "runs": len(members),
            "sources": len({m["family"] for m in members}),
            "median_error": round(own, 3),
            "range": factors(centre, low, high, shrunk / pooled_error),
        }
    return {
        "cross_validated": cross_validated,
        "written": date.today().isoformat(),
        "level": 0.8,
        "ranges": {"published": factors(centre, low, high), "extrapolated": factors(*band(blind))},
        "types": types,
    }


def range_for(table: Row, accelerator: str, regime: str, published: bool) -> dict[str, float]:
    if not published:
        return table["ranges"]["extrapolated"]  # type: ignore[index,no-any-return]
    row = table["types"].get(accelerator, {}).get(regime)  # type: ignore[attr-defined]
    return row["range"] if row else table["ranges"]["published"]  # type: ignore[index,no-any-return]


def check(table: Row, cases: list[Case], rows: list[Row], published: bool) -> dict[str, float]:
    """Share of rows whose measurement lies in its range, and the ranges' median half-width."""
    regime = {c.run_id: regime_of(c.workload.precision) for c in cases}
    inside, halves = 0, []
    for row in rows:
        span = range_for(table, str(row["accelerator"]), regime[str(row["run_id"])], published)
        ratio = math.exp(log_ratio(row))
        inside += span["low"] <= ratio <= span["high"]
        halves.append((span["high"] - span["low"]) / 2)
    return {"coverage": inside / len(rows), "median_half_width": statistics.median(halves), "rows": len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="+", default=list(DEVELOPMENT_RUNS))
    parser.add_argument("--heldout", type=Path, default=HELDOUT_RUNS)
    parser.add_argument("--cross-validate", type=int, default=600, metavar="ITERATIONS")
    parser.add_argument("--in-sample", action="store_true", help="score with the shipped constants only")
    parser.add_argument("--out", type=Path, default=TABLE)
    args = parser.parse_args()
    cases, _ = load_all(args.runs)
    rows: list[Row] = []
    blind: list[Row] = []
    folds = [(cases, CALIBRATION)] if args.in_sample else refits(cases, args.cross_validate)
    for held, calibration in folds:
        fold_rows, fold_blind = score_both(held, calibration)
        rows += fold_rows
        blind += fold_blind
    table = evidence_table(cases, rows, blind, not args.in_sample)
    table["file"] = ", ".join(path.name for path in args.runs)
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    for key, regimes in table["types"].items():  # type: ignore[attr-defined]
        for kind, row in regimes.items():
            span = row["range"]
            print(
                f"{key:12} {kind:7} {row['runs']:3} runs {row['sources']} sources  ±{row['median_error']:.1%}"
                f"  80% range x{span['low']:.2f}-x{span['high']:.2f}"
            )
    for kind, span in table["ranges"].items():  # type: ignore[attr-defined]
        print(f"{kind} class: 80% range x{span['low']:.2f}-x{span['high']:.2f} of the predicted throughput")
    heldout, _ = load_cases(args.heldout)
    heldout_rows, heldout_blind = score_both(heldout, CALIBRATION)
    summary = with_families(summarize(rows))
    mdape = summary["throughput_mdape"]
    families = summary["families"]  # type: ignore[attr-defined]
    print("by source: " + ", ".join(f"{f} {e:.1%}" for f, e in families.items()))
    print(
        f"development file ({'in-sample' if args.in_sample else 'cross-validated by source'}): "
        f"MdAPE {mdape:.1%}"
    )
    for title, checked_cases, checked, published in (
        ("development file, published ranges", cases, rows, True),
        ("development file, generations predicted as unpublished, extrapolated range", cases, blind, False),
        (f"held-out file ({args.heldout.name}), published ranges", heldout, heldout_rows, True),
        (
            f"held-out file ({args.heldout.name}), as unpublished, extrapolated range",
            heldout,
            heldout_blind,
            False,
        ),
    ):
        found = check(table, checked_cases, checked, published)
        print(
            f"{title}: {found['coverage']:.0%} of {found['rows']} rows inside their 80% range "
            f"(goal 70-90%), median half-width {found['median_half_width']:.0%} (goal <= 25%)"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
