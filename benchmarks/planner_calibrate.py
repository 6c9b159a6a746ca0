"""Fit the planner's shared efficiency constants on published runs (a development tool).

Fits a handful of physical constants, the same for every row — large-GEMM efficiency of Ampere
(Hopper's is measured), the fp8 ratio, the width and micro-batch knees, fused-attention
efficiency, score traffic without fused attention, network efficiency and data-parallel overlap —
then Gaudi 2's large-GEMM efficiency on its own runs, by minimizing a robust loss
of log errors over the rows of ``--runs``. Prints the fitted values to copy into
``src/shipyard/planner/calibration.py`` and the resulting scores. Needs scipy (the dev extra).

    .venv/bin/python benchmarks/planner_calibrate.py [--runs FILE.csv]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path
from types import MappingProxyType

from planner_cases import DEVELOPMENT_RUNS, Case, load_all, predict, score
from scipy.optimize import minimize

from shipyard.planner.calibration import CALIBRATION, Calibration
from shipyard.planner.training import plan_training

FITTED = (
    "ampere",
    "gaudi2",
    "fp8_gemm_ratio",
    "elementwise_bytes_per_hidden",
    "micro_batch_tokens_half",
    "flash_attention_ratio",
    "score_bytes_per_element",
    "network_efficiency",
    "link_efficiency",
    "dp_overlap",
    "tp_overlap_hopper",
)
BOUNDS = {
    "ampere": (0.4, 0.9),
    "gaudi2": (0.3, 0.95),
    "fp8_gemm_ratio": (0.3, 1.0),
    "elementwise_bytes_per_hidden": (0.0, 20.0),
    "micro_batch_tokens_half": (0.0, 4000.0),
    "flash_attention_ratio": (0.5, 1.0),
    "score_bytes_per_element": (0.0, 200.0),
    "network_efficiency": (0.2, 0.95),
    "link_efficiency": (0.3, 1.0),
    "dp_overlap": (0.0, 1.0),
    "tp_overlap_hopper": (0.0, 1.0),
}


GENERATIONS = {"ampere": "gemm_efficiency", "gaudi2": "gemm_efficiency", "tp_overlap_hopper": "tp_overlap"}
"""Fitted values that are one generation's entry of a per-generation table."""


def _generation(name: str) -> str:
    return name.rsplit("_", 1)[-1]


def calibration_from(values: dict[str, float]) -> Calibration:
    tables: dict[str, dict[str, float]] = {}
    scalars: dict[str, float] = {}
    for name, value in values.items():
        if name in GENERATIONS:
            table = GENERATIONS[name]
            tables.setdefault(table, dict(getattr(CALIBRATION, table)))[_generation(name)] = value
        else:
            scalars[name] = value
    frozen = {table: MappingProxyType(entries) for table, entries in tables.items()}
    return dataclasses.replace(CALIBRATION, **frozen, **scalars)  # type: ignore[arg-type]


def current() -> dict[str, float]:
    return {
        name: getattr(CALIBRATION, GENERATIONS[name]).get(_generation(name), 0.0)
        if name in GENERATIONS
        else getattr(CALIBRATION, name)
        for name in FITTED
    }


RESTARTS = 3
"""Nelder-Mead runs a fit's iterations are split into, each from the last one's best with a fresh
simplex: the capped loss is flat in places, where one simplex shrinks onto a point that is not a
minimum (Gao and Han 2012 on restarts)."""


OWN_GENERATION = ("gaudi2",)
"""Fitted on that generation's runs alone, after the shared constants and with them held: a few
runs of one vendor's stack must not move what every other row shares (fitted together, Gaudi 2's
in-node RoCE pulled NVLink's efficiency to 1.0)."""


def fit(cases: list[Case], maxiter: int = 1500, restarts: int = RESTARTS) -> dict[str, float]:
    """The constants that minimize the robust loss over ``cases``, from the shipped ones: the
    shared ones on every run but those of ``OWN_GENERATION``, then each of those on its own."""
    shared = [name for name in FITTED if name not in OWN_GENERATION]
    values = _minimize(
        [c for c in cases if _architecture(c) not in OWN_GENERATION], shared, current(), maxiter, restarts
    )
    for generation in OWN_GENERATION:
        own = [c for c in cases if _architecture(c) == generation]
        if own:
            values = _minimize(own, [generation], values, maxiter, restarts)
    return values


def _architecture(case: Case) -> str:
    return case.cluster.accelerator.architecture


def _minimize(
    cases: list[Case], names: list[str], start: dict[str, float], maxiter: int, restarts: int
) -> dict[str, float]:
    """``start`` with ``names`` refitted on ``cases``."""

    def loss(x: list[float]) -> float:
        values = dict(start)
        for name, value in zip(names, x, strict=True):
            low, high = BOUNDS[name]
            if not low <= value <= high:
                return 1e9
            values[name] = value
        calibration = calibration_from(values)
        total = 0.0
        for case in cases:
            plan = plan_training(
                case.workload, case.cluster, case.request, calibration=calibration, measure=case.measure
            )
            error = abs(math.log(predict(case, plan) / case.measured))
            # Robust: a row off by more than 25 % counts as a miss, not as its full size.
            total += min(error, 0.25)
        return total / len(cases)

    best = [start[name] for name in names]
    for _ in range(restarts):
        result = minimize(
            loss,
            best,
            method="Nelder-Mead",
            options={"maxiter": maxiter // restarts, "xatol": 1e-3, "fatol": 1e-5},
        )
        best = list(result.x)
    return {**start, **dict(zip(names, best, strict=True))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="+", default=list(DEVELOPMENT_RUNS))
    args = parser.parse_args()
    cases, _ = load_all(args.runs)
    fitted = fit(cases)
    for name, value in fitted.items():
        print(f"{name} = {value:.4g}")
    summary = score(cases, calibration_from(fitted))
    print(
        f"throughput MdAPE {summary['throughput_mdape']:.1%}, wall MdAPE {summary['wall_time_mdape']:.1%}, "
        f"within 20%: {summary['within_20pct']:.0%}"
    )


if __name__ == "__main__":
    main()
