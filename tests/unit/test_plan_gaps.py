"""Planned against measured: a gap of more than 2x is put down to the assumption that was off.
Hand-computed cases: tokens/s = devices x peak x MFU / FLOPs per token, for the plan and the run."""

from __future__ import annotations

import dataclasses

from shipyard.schemas.estimate import Figures
from shipyard.services.estimates.plan_gaps import Measured, explain

# One device planned at 100 TFLOPS peak and 40 % MFU with 1 GFLOP per token: 40,000 tokens/s.
PLAN = Figures(
    tokens_per_s=40_000.0,
    peak_tflops=100.0,
    mfu=0.40,
    flops_per_token=1e9,
    memory_gib_per_device=10.0,
    step_time_s=0.1,
)


def run(tokens_per_s: float, mfu: float, **changes: object) -> Measured:
    measured = Measured(
        tokens_per_s=tokens_per_s,
        mfu=mfu,
        memory_gib=11.0,
        flops_per_token=1e9,
        world_size=1,
        accelerator_type="h100-sxm",
        threads_per_process=4,
        others_on_node=0,
    )
    return dataclasses.replace(measured, **changes)  # type: ignore[arg-type]


def test_within_twice_the_plan_nothing_is_said() -> None:
    assert explain(PLAN, run(30_000.0, 0.30)) == []  # 0.75x
    assert explain(PLAN, run(70_000.0, 0.70)) == []  # 1.75x


def test_a_run_at_a_tenth_of_its_efficiency_names_the_efficiency() -> None:
    # Same peak (4,000 x 1e9 / 0.04 = 100 TFLOPS), MFU 4 % against 40 %.
    [why] = explain(PLAN, run(4_000.0, 0.04, others_on_node=2))
    assert why.startswith("measured tokens/s is 0.1x the plan: efficiency:")
    assert "assumed 40.0% of peak (MFU), the run reached 4.0%, with 2 other jobs on the node (0.1x)" in why
    assert "device peak" not in why


def test_a_device_with_half_the_peak_the_planner_took_names_the_peak() -> None:
    # 40 % of a 25 TFLOPS device: 10,000 tokens/s, a quarter of the plan, all of it the peak.
    [why] = explain(PLAN, run(10_000.0, 0.40, accelerator_type="cpu", threads_per_process=2))
    peak = "device peak: the planner took 100 TFLOPS per cpu device, the run had 25, 2 threads per process"
    assert f"{peak} (0.25x)" in why
    assert "efficiency" not in why


def test_both_parts_off_are_named_the_larger_first() -> None:
    # Peak 50 (0.5x) and MFU 10 % (0.25x): 5,000 tokens/s, 0.125x the plan.
    [why] = explain(PLAN, run(5_000.0, 0.10))
    assert why.index("efficiency") < why.index("device peak")
    assert "(0.25x)" in why and "(0.5x)" in why


def test_an_estimate_without_the_parts_says_so() -> None:
    # A document stored before the planner recorded what tokens/s is made of still reads.
    old = Figures.model_validate(
        {"tokens_per_s": 40_000.0, "memory_gib_per_device": 10.0, "step_time_s": 0.1}
    )
    [why] = explain(old, run(1_000.0, 0.01))
    assert "predates" in why and "0.025x" in why


def test_memory_far_above_the_plan_on_a_cpu_is_the_process_peak() -> None:
    [why] = explain(PLAN, run(40_000.0, 0.40, memory_gib=25.0, accelerator_type="cpu"))
    assert why.startswith("measured memory is 2.5x the plan (25.00 against 10.00 GiB): on the CPU")
    [why] = explain(PLAN, run(40_000.0, 0.40, memory_gib=25.0))
    assert "caching allocator" in why


def test_a_step_planned_as_its_host_s_says_so() -> None:
    # A small model on a GPU: the plan's step is the host queuing kernels at 5.4 us an operation,
    # and the run reached a third of the planned MFU (a host slower than its node measured).
    host_bound = PLAN.model_copy(update={"host_bound": True, "host_op_us": 5.42})
    [why] = explain(host_bound, run(12_000.0, 0.12))
    assert "the planned step was its host's, queuing kernels at 5.4 us an operation (0.3x)" in why
    [plain] = explain(PLAN, run(12_000.0, 0.12))
    assert "host" not in plain
