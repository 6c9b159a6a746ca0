"""Write the planner's evidence table (``src/shipyard/planner/evidence.json``): for each accelerator
type and precision regime, the published runs of the development file the planner is scored on,
the sources they come from, and the planner's median absolute error of per-device throughput on
them, cross-validated by source (the shared constants refitted without each paper or vendor, its
rows predicted with them: minutes of CPU) unless ``--in-sample``.

    .venv/bin/python benchmarks/planner_evidence.py [--runs FILE.csv] [--cross-validate ITERATIONS]
        [--in-sample]
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import date
from pathlib import Path

from planner_accuracy import cross_validate
from planner_cases import DEFAULT_RUNS, Case, load_cases, score

from shipyard.planner.evidence import regime_of

TABLE = Path(__file__).resolve().parents[1] / "src" / "shipyard" / "planner" / "evidence.json"


def evidence_table(
    cases: list[Case], rows: list[dict[str, object]], cross_validated: bool
) -> dict[str, object]:
    """The table: ``types[key][regime] = {runs, sources, median_error}`` from the scored rows."""
    regime = {c.run_id: regime_of(c.workload.precision) for c in cases}
    groups: dict[tuple[str, str], list[dict[str, object]]] = {}
    for row in rows:
        groups.setdefault((str(row["accelerator"]), regime[str(row["run_id"])]), []).append(row)
    types: dict[str, dict[str, object]] = {}
    for (key, kind), members in sorted(groups.items()):
        types.setdefault(key, {})[kind] = {
            "runs": len(members),
            "sources": len({m["family"] for m in members}),
            "median_error": round(statistics.median(abs(float(m["error"])) for m in members), 3),  # type: ignore[arg-type]
        }
    return {"cross_validated": cross_validated, "written": date.today().isoformat(), "types": types}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    parser.add_argument("--cross-validate", type=int, default=600, metavar="ITERATIONS")
    parser.add_argument("--in-sample", action="store_true", help="score with the shipped constants only")
    parser.add_argument("--out", type=Path, default=TABLE)
    args = parser.parse_args()
    cases, _ = load_cases(args.runs)
    scored = score(cases) if args.in_sample else cross_validate(cases, args.cross_validate)
    rows = scored["rows"]
    table = evidence_table(cases, rows, not args.in_sample)  # type: ignore[arg-type]
    table["file"] = args.runs.name
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    for key, regimes in table["types"].items():  # type: ignore[attr-defined]
        for kind, row in regimes.items():
            print(
                f"{key:12} {kind:7} {row['runs']:3} runs {row['sources']} sources  ±{row['median_error']:.1%}"
            )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
