"""What each throughput figure rests on: for an accelerator type and a precision, how many
published training runs the planner was scored on there, from how many sources, and its error on
them, or that it has none and extrapolates from the datasheet's peak.

The table (``evidence.json``) is written by ``benchmarks/planner_evidence.py`` from the published
runs of the planner's development file, with the error cross-validated by source (the constants
refitted without each paper or vendor, its rows predicted with them). Only A100, H100, H200 and
Gaudi 2 training runs are published there; every other type is extrapolated from its peak and a
generation efficiency taken from the sources ``calibration.py`` names.

Each entry also carries the 80 % range of what a run measures around the plan, from the same
cross-validated errors: a type's own where it has published runs, else its class's (wider for an
extrapolated type: the error on published generations re-predicted as if they had none).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from shipyard.hardware.catalog import AcceleratorSpec

Regime = Literal["16-bit", "fp8"]
EvidenceKind = Literal["published", "measured here", "extrapolated"]


@dataclass(frozen=True, slots=True)
class Evidence:
    accelerator: str
    regime: Regime
    runs: int
    """Published runs on this type at this precision that the planner was scored on."""
    sources: int
    """Papers or vendors they come from (a source's runs share its methods and its errors)."""
    median_error: float | None
    """The planner's median absolute error of per-device throughput on them (cross-validated
    where ``cross_validated``); None without runs."""
    cross_validated: bool = True
    measured_here: bool = False
    """The type's matrix-multiply rate was measured on this machine (a host's CPU)."""
    low: float = 1.0
    high: float = 1.0
    """The 80 % range of what a run measures, as factors on the planned throughput: from the
    planner's cross-validated errors on this type's runs, or on its evidence class's."""

    @property
    def kind(self) -> EvidenceKind:
        return "published" if self.runs else "measured here" if self.measured_here else "extrapolated"

    @property
    def words(self) -> str:
        """One line: ``h100-sxm (fp8): 7 published runs from 2 sources, ±14 % median error``."""
        where = f"{self.accelerator} ({self.regime})"
        if not self.runs and self.measured_here:
            return f"{where}: no published training run; its matrix-multiply rate measured on this host"
        if not self.runs:
            return f"{where}: no published training run; extrapolated from its peak, treat as an upper bound"
        error = f"±{self.median_error:.0%} median error" if self.median_error is not None else "error unknown"
        how = "" if self.cross_validated else " (in-sample)"
        runs = "run" if self.runs == 1 else "runs"
        sources = "source" if self.sources == 1 else "sources"
        return f"{where}: {self.runs} published {runs} from {self.sources} {sources}, {error}{how}"

    @property
    def short(self) -> str:
        """For a table cell: ``7 runs ±14%``, or ``peak only``."""
        if not self.runs:
            return "this host" if self.measured_here else "peak only"
        error = f" ±{self.median_error:.0%}" if self.median_error is not None else ""
        return f"{self.runs} run{'s' if self.runs > 1 else ''}{error}"

    @property
    def range_words(self) -> str:
        """``80 % range: -18 % to +21 % of the planned throughput``."""
        return f"80% range: {self.low - 1:+.0%} to {self.high - 1:+.0%} of the planned throughput"

    def spread(self, throughput: float) -> dict[str, float]:
        """The 80 % range of a throughput planned at ``throughput``."""
        return {"low": throughput * self.low, "high": throughput * self.high}

    def spread_of_time(self, hours_or_spend: float | None) -> dict[str, float] | None:
        """The range of a figure that goes inversely with throughput: time, cost and energy."""
        if hours_or_spend is None:
            return None
        return {"low": hours_or_spend / self.high, "high": hours_or_spend / self.low}

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "regime": self.regime,
            "runs": self.runs,
            "sources": self.sources,
            "median_error": self.median_error,
            "cross_validated": self.cross_validated,
            "words": self.words,
            "short": self.short,
            "range": {"level": 0.8, "low": self.low, "high": self.high, "words": self.range_words},
        }


def regime_of(precision: str) -> Regime:
    """fp8 training is its own regime (Transformer Engine's matrix multiplies); every 16-bit or
    wider precision shares one."""
    return "fp8" if precision == "fp8" else "16-bit"


def evidence_for(spec: AcceleratorSpec, precision: str) -> Evidence:
    """The planner's evidence for the type ``spec`` at ``precision``."""
    regime = regime_of(precision)
    table = _table()
    row = table["types"].get(spec.key, {}).get(regime)
    published = row is not None
    row = row or {"runs": 0, "sources": 0, "median_error": None}
    measured_here = spec.gemm_efficiency is not None
    # A host whose matrix-multiply rate was measured is as sure as a published type, not more.
    span = row.get("range") or table["ranges"]["published" if published or measured_here else "extrapolated"]
    return Evidence(
        spec.key,
        regime,
        int(row["runs"]),
        int(row["sources"]),
        row["median_error"],
        bool(table["cross_validated"]),
        measured_here=measured_here,
        low=float(span["low"]),
        high=float(span["high"]),
    )


@functools.cache
def _table() -> dict[str, Any]:
    text = resources.files("shipyard.planner").joinpath("evidence.json").read_text()
    return json.loads(text)  # type: ignore[no-any-return]
