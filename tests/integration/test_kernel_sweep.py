"""The kernel sweep's product grid and the fit of its fixed cost a product: the figures a GPU node
records so that the planner's per-product efficiency can be checked against kernels."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SWEEP = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_efficiency.py"
SMALL_LAYER = ("--hiddens", "64", "--tokens", "64", "--seq-lens", "64", "--optimizer-params", "100000")


def load_sweep():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("kernel_efficiency", SWEEP)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fit_recovers_the_efficiency_and_fixed_cost_a_table_was_made_with() -> None:
    # Hand-made table: 1,000 TFLOP/s peak, 75 % on large products, 6 us a product. A 256^3
    # product is 33.6 MFLOP: 44.7 us of math and 6 us fixed, 66 % of the large-product rate.
    peak, efficiency, fixed = 1e15, 0.75, 6e-6
    sizes = (256, 1024, 4096)
    rows = [
        {"m": m, "n": n, "k": k, "seconds": 2 * m * n * k / (peak * efficiency) + fixed}
        for m in sizes
        for n in sizes
        for k in sizes
    ]
    fit = load_sweep().fit_fixed_cost(rows, peak)
    assert fit["large_product_efficiency"] == pytest.approx(0.75, rel=1e-9)
    assert fit["fixed_cost_us"] == pytest.approx(6.0, rel=1e-9)
    assert fit["worst"] < 1e-9


def test_the_sweep_times_every_product_of_the_grid_on_this_cpu() -> None:
    done = subprocess.run(
        [sys.executable, str(SWEEP), *SMALL_LAYER, "--grid", "32,128", "--reps", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    grid = json.loads(done.stdout)["grid"]
    assert sorted((p["m"], p["n"], p["k"]) for p in grid["products"]) == [
        (m, n, k) for m in (32, 128) for n in (32, 128) for k in (32, 128)
    ]
    assert all(p["seconds"] > 0 and p["share_of_peak"] > 0 for p in grid["products"])
    # Measured on a shared machine, so only its sense is certain: a fixed cost above zero and a
    # share of the derived peak (a VM's cores may turbo past the clock that peak assumes).
    assert grid["fit"]["fixed_cost_us"] > 0 and 0 < grid["fit"]["large_product_efficiency"] < 2
