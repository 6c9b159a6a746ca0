"""The typed estimate: what a job stores at submit reads back whole, documents stored before a
figure existed still read, and the figures are read for the type the job ran on."""

from __future__ import annotations

from pathlib import Path

import pytest

from shipyard.errors import InvalidSpec
from shipyard.schemas.estimate import Estimate, Figures, PlannedLayout
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.services.estimates.estimates import on_shipyard_llama
from tests.builders import spec_dict


def test_an_estimate_reads_back_whole_and_is_read_for_the_type_the_job_ran_on() -> None:
    layout = PlannedLayout.model_validate(
        {"parallelism": {"tp": 2, "dp_shard": 4}, "activation_checkpointing": {"mode": "selective",
         "selective": "blocks", "every": 3}}
    )  # fmt: skip
    cpu = Figures(memory_gib_per_device=1.5, step_time_s=2.0, tokens_per_s=100.0, layout=layout)
    h100 = Figures(memory_gib_per_device=30.0, step_time_s=0.1, tokens_per_s=9_000.0)
    estimate = Estimate(
        accelerator="h100-sxm",
        devices=8,
        **h100.model_dump(exclude={"wall_time_s"}),
        by_accelerator={"h100-sxm": h100, "cpu": cpu},
        wall_time_s=3600.0,
    )
    assert Estimate.stored(estimate.model_dump(mode="json")) == estimate
    assert estimate.on("cpu") == ("cpu", cpu)
    assert estimate.on("a100-80gb") == ("h100-sxm", h100)  # never planned there: the planner's pick
    assert estimate.on(None) == ("h100-sxm", h100)
    assert (
        layout.describe()
        == "tp=2 x dp_shard=4 x dp_replicate=1, activation checkpointing selective (one block in 3)"
    )


def test_a_document_stored_before_the_newer_figures_still_reads() -> None:
    old = {"accelerator": "cpu", "devices": 1, "memory_gib_per_device": 0.4, "step_time_s": 1.2,
           "tokens_per_s": 850.0, "wall_time_s": 40.0, "retired_field": 1}  # fmt: skip
    estimate = Estimate.stored(old)
    assert estimate is not None and estimate.peak_tflops is None and estimate.by_accelerator == {}
    assert estimate.on("cpu") == ("cpu", estimate)
    assert Estimate.stored(None) is None and Estimate.stored({}) is None


def test_an_unreadable_model_config_is_refused_not_taken_for_another_kind_of_model(tmp_path: Path) -> None:
    # Before, a config.json that could not be read made the planner assume a transformers model
    # (another memory model) without a word.
    (tmp_path / "config.json").write_text("[1, 2]")
    spec = validate_job_spec(spec_dict(model={"preset": None, "path": str(tmp_path)}))
    with pytest.raises(InvalidSpec, match=r"config\.json is not a JSON object"):
        on_shipyard_llama(spec)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InvalidSpec, match="Invalid JSON"):
        on_shipyard_llama(spec)
