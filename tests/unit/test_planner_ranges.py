"""The 80 % ranges the planner puts on its figures, and the advisor's ties where they overlap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shipyard.hardware.catalog import lookup
from shipyard.planner import evidence as planner_evidence
from shipyard.planner.advisor import compare
from shipyard.planner.shapes import model_shape
from shipyard.planner.training import plan_training
from shipyard.planner.workload import TrainingWorkload, cluster_of

TABLE = json.loads((Path(planner_evidence.__file__).parent / "evidence.json").read_text())
WORKLOAD = TrainingWorkload(model=model_shape(8e9), tokens=1e11)


def test_a_published_type_takes_its_own_range_and_an_extrapolated_one_the_wider_class_range() -> None:
    a100 = plan_training(WORKLOAD, cluster_of(lookup("a100-80gb"), 8)).evidence
    own = TABLE["types"]["a100-80gb"]["16-bit"]["range"]
    assert (a100.low, a100.high) == (own["low"], own["high"])
    gaudi = plan_training(WORKLOAD, cluster_of(lookup("gaudi3"), 8)).evidence
    wider = TABLE["ranges"]["extrapolated"]
    assert (gaudi.low, gaudi.high) == (wider["low"], wider["high"])
    pooled = TABLE["ranges"]["published"]
    assert wider["high"] / wider["low"] > pooled["high"] / pooled["low"]
    # A host whose matrix-multiply rate was measured is as sure as the published pool.
    host = lookup("cpu").model_copy(update={"gemm_efficiency": 0.5})
    measured = plan_training(WORKLOAD, cluster_of(host, 1)).evidence
    assert (measured.low, measured.high) == (pooled["low"], pooled["high"])
    assert a100.low < 1 < a100.high and gaudi.low < 1 < gaudi.high


def test_every_time_throughput_cost_and_energy_carries_its_range() -> None:
    plan = plan_training(WORKLOAD, cluster_of(lookup("h100-sxm"), 8))
    d = plan.to_dict()
    low, high = plan.evidence.low, plan.evidence.high
    assert d["tokens_per_s_per_device_range"] == {
        "low": pytest.approx(d["tokens_per_s_per_device"] * low),
        "high": pytest.approx(d["tokens_per_s_per_device"] * high),
    }
    # Time, cost and energy go inversely with throughput: its low end is their high one.
    for name in ("wall_time_h", "cost_usd", "energy_kwh"):
        assert d[f"{name}_range"] == {
            "low": pytest.approx(d[name] / high),
            "high": pytest.approx(d[name] / low),
        }
    assert (
        d["evidence"]["range"]["level"] == 0.8
        and "of the planned throughput" in d["evidence"]["range"]["words"]
    )


def test_types_whose_ranges_overlap_share_a_rank_and_are_not_called_better() -> None:
    # An A100 and its export twin, the A800, plan alike: their ranges overlap, so they tie; a
    # host's CPU is orders of magnitude slower and ranks alone behind them.
    small = TrainingWorkload(model=model_shape(0.5e9), tokens=1e9)
    rows = compare(small, [lookup("a100-80gb"), lookup("a800"), lookup("cpu")], count=1, rank_by="time")
    ranked = {r.accelerator: (r.rank, r.tied) for r in rows}
    assert ranked["a100-80gb"] == ranked["a800"] == (1, True)
    assert ranked["cpu"] == (3, False)
    assert rows[0].to_dict()["tied"] is True and rows[0].to_dict()["time_h_range"] is not None


def test_an_inference_plan_says_it_has_no_run_behind_it_and_gives_no_borrowed_range() -> None:
    from shipyard.planner.inference import InferenceWorkload, plan_inference

    plan = plan_inference(InferenceWorkload(model=model_shape(7e9)), cluster_of(lookup("h100-sxm"), 1), tp=1)
    d = plan.to_dict()
    assert d["evidence"]["runs"] == 0 and "no 80% range is derived" in d["evidence"]["words"]
    assert d["decode_tokens_per_s_range"] is None and plan.assumptions[0].startswith("evidence: no published")
