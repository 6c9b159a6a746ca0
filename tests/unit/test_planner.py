"""The capacity planner's formulas against hand-computed cases from the papers, its invariants
(Hypothesis), its layout search and its input errors. Pure: no files, no processes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipyard.errors import InvalidSpec
from shipyard.hardware.catalog import BUILT_IN, catalog, load_catalog, lookup
from shipyard.planner import evidence as planner_evidence
from shipyard.planner.advisor import compare, price_caveat
from shipyard.planner.calibration import CALIBRATION
from shipyard.planner.inference import InferenceWorkload, plan_inference
from shipyard.planner.memory import GIB, activation_bytes_per_layer, lora_parameters, training_memory
from shipyard.planner.shapes import model_shape
from shipyard.planner.training import flops_per_token, plan_training
from shipyard.planner.workload import Layout, LayoutRequest, TrainingWorkload, cluster_of

GPT3 = model_shape(175e9, layers=96, hidden=12288, heads=96)
LLAMA_65B = model_shape(65.2e9, layers=80, hidden=8192, heads=64)


def layout(**changes: object) -> Layout:
    fields: dict[str, object] = {
        "tp": 1,
        "pp": 1,
        "dp": 1,
        "zero": 0,
        "recompute": "none",
        "micro_batch": 1,
        "sequence_parallel": False,
    }
    fields.update(changes)
    return Layout(**fields)  # type: ignore[arg-type]


def states_gb(params: float, dp: int, zero: int) -> float:
    workload = TrainingWorkload(model=model_shape(params), precision="bf16")
    memory = training_memory(workload, layout(dp=dp, zero=zero), 1e9, CALIBRATION)
    return (memory.weights_gib + memory.gradients_gib + memory.optimizer_gib) * GIB / 1e9


def test_mixed_precision_adam_keeps_16_bytes_per_parameter() -> None:
    assert states_gb(1e9, dp=1, zero=0) == pytest.approx(16.0)


@pytest.mark.parametrize(
    ("zero", "expected_gb"),
    # Rajbhandari et al., "ZeRO" (2020), Table 1: 7.5B parameters on 64 data-parallel devices.
    [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)],
)
def test_zero_stages_match_the_paper(zero: int, expected_gb: float) -> None:
    assert states_gb(7.5e9, dp=64, zero=zero) == pytest.approx(expected_gb, rel=0.02)


def test_korthikanti_activation_formulas_for_gpt3() -> None:
    # Korthikanti et al. (2022), Table 2, with a=96, h=12288, s=2048, so 5as/h = 80.
    common = {"seq": 2048, "micro_batch": 1, "hidden": 12288, "heads": 96}
    sbh = 2048 * 12288
    cases = {
        (1, False, "none"): 114,  # 34 + 80
        (8, False, "none"): 10 + 24 / 8 + 80 / 8,
        (8, True, "none"): 114 / 8,
        (8, True, "selective"): 34 / 8,
        (8, False, "selective"): 10 + 24 / 8,
        (8, True, "full"): 2 / 8,
        (8, False, "full"): 2,
    }
    for (tp, sp, recompute), factor in cases.items():
        got = activation_bytes_per_layer(**common, tp=tp, sequence_parallel=sp, recompute=recompute)
        assert got == pytest.approx(sbh * factor), (tp, sp, recompute)


def test_fused_attention_stores_no_scores() -> None:
    common = {
        "seq": 2048,
        "micro_batch": 1,
        "hidden": 12288,
        "heads": 96,
        "tp": 1,
        "sequence_parallel": False,
    }
    fused = activation_bytes_per_layer(**common, recompute="none", flash_attention=True)
    assert fused == activation_bytes_per_layer(**common, recompute="selective")


def test_flops_per_token_are_6n_plus_attention() -> None:
    workload = TrainingWorkload(model=GPT3, seq_len=2048)
    model, dense, attention = flops_per_token(workload, "none")
    assert model == pytest.approx(6 * 175e9 + 12 * 96 * 12288 * 2048)
    assert (dense, attention) == (6 * 175e9, 12 * 96 * 12288 * 2048)
    _, dense_full, attention_full = flops_per_token(workload, "full")
    assert dense_full == 8 * 175e9 and attention_full == 16 * 96 * 12288 * 2048
    lora = TrainingWorkload(model=GPT3, kind="lora")
    assert flops_per_token(lora, "none")[0] == pytest.approx(4 * 175e9 + 12 * 96 * 12288 * 2048)


def test_shapes_follow_standard_aspect_ratios() -> None:
    derived = model_shape(175e9)
    assert (derived.layers, derived.hidden, derived.heads) == (96, 12288, 96)
    assert set(derived.derived) == {"layers", "hidden", "heads", "vocab"}
    llama = model_shape(7e9)
    assert (llama.layers, llama.hidden) == (32, 4096)


def test_kv_cache_of_llama_65b() -> None:
    plan = plan_inference(InferenceWorkload(model=LLAMA_65B, context=2048), cluster_of(lookup("h200"), 1))
    # 2 (K and V) x 80 layers x 64 heads x 128 dims x 2048 tokens x 2 bytes
    assert plan.memory.kv_cache_gib * GIB == pytest.approx(2 * 80 * 64 * 128 * 2048 * 2)
    assert plan.memory.weights_gib * GIB == pytest.approx(65.2e9 * 2)


def test_llama_65b_fp16_fits_one_m2_ultra_but_not_one_h100() -> None:
    workload = InferenceWorkload(model=LLAMA_65B, batch=1, context=2048, precision="fp16")
    m2 = plan_inference(workload, cluster_of(lookup("m2-ultra"), 1))
    h100 = plan_inference(workload, cluster_of(lookup("h100-sxm"), 1))
    assert m2.fits and not h100.fits
    assert "h100-sxm has 80 GiB" in (h100.not_fitting_reason() or "")
    assert m2.decode_bound == "memory bandwidth"
    # Decode reads the weights once per token: H100's 3.35 TB/s beats the M2 Ultra's 0.8 TB/s.
    assert h100.decode_tokens_per_s > 3 * m2.decode_tokens_per_s


def test_the_advisor_marks_what_does_not_fit() -> None:
    workload = InferenceWorkload(model=LLAMA_65B, precision="fp16")
    rows = compare(workload, [lookup("h100-sxm"), lookup("m2-ultra"), lookup("h200")], count=1)
    by_key = {r.accelerator: r for r in rows}
    assert by_key["m2-ultra"].fits and by_key["h200"].fits and not by_key["h100-sxm"].fits
    assert [r.rank for r in rows] == [1, 2, None]
    assert rows[-1].accelerator == "h100-sxm"


def test_the_advisor_picks_the_fewest_devices_that_fit() -> None:
    workload = TrainingWorkload(model=model_shape(70e9), tokens=1e12)
    rows = compare(workload, [lookup("h100-sxm"), lookup("mi300x")], rank_by="time")
    counts = {r.accelerator: r.count for r in rows}
    assert all(r.fits for r in rows)
    # 70B x 16 bytes = 1.1 TB of states: 192 GiB devices need half as many as 80 GiB ones.
    assert counts["mi300x"] < counts["h100-sxm"]
    assert rows[0].time_h <= rows[1].time_h


def test_the_search_picks_a_fitting_layout_and_says_so() -> None:
    workload = TrainingWorkload(model=GPT3, seq_len=2048, global_batch_tokens=3145728, tokens=300e9)
    plan = plan_training(workload, cluster_of(lookup("a100-80gb"), 1024))
    assert plan.fits and plan.searched
    assert plan.layout.tp * plan.layout.pp * plan.layout.dp == 1024
    pinned = plan_training(
        workload, cluster_of(lookup("a100-80gb"), 1024), LayoutRequest(tp=8, pp=16, zero=1, recompute="full")
    )
    assert not pinned.searched and pinned.step.total_s >= plan.step.total_s
    assert 0 < plan.mfu < 1 and 0.9 < plan.goodput < 1
    assert plan.wall_time_h == pytest.approx(300e9 / plan.tokens_per_s / 3600 / plan.goodput)
    assert plan.gpu_hours == pytest.approx(plan.wall_time_h * 1024)
    assert plan.cost_usd == pytest.approx(plan.gpu_hours * 1.8)


def test_interruptions_cost_more_on_bigger_clusters() -> None:
    from shipyard.planner.run import interruption_share

    # Llama 3: >90 % effective training time on 16,384 GPUs; a single node barely notices.
    assert interruption_share(8, 1.0, CALIBRATION) < 1e-3
    assert interruption_share(2048, 0.1, CALIBRATION) < interruption_share(16384, 0.1, CALIBRATION) < 0.1
    # By hand: 2.2e-5 interruptions per device-hour x 16,384 devices x (13 min to restart + half
    # of a 4-minute checkpoint interval redone).
    assert interruption_share(16384, 0.066, CALIBRATION) == pytest.approx(2.2e-5 * 16384 * (0.217 + 0.033))


@settings(max_examples=25, deadline=None)
@given(count=st.sampled_from([8, 256, 4096, 16384]), factor=st.floats(0.2, 5.0))
def test_no_checkpoint_interval_loses_less_than_youngs(count: int, factor: float) -> None:
    from shipyard.planner.run import run_overheads

    workload = TrainingWorkload(model=LLAMA_65B, seq_len=2048, global_batch_tokens=2**22)
    young = run_overheads(workload, count, 1 / 3, CALIBRATION)
    other = dataclasses.replace(workload, checkpoint_every_h=young.checkpoint_every_h * factor)
    theirs = run_overheads(other, count, 1 / 3, CALIBRATION)
    assert young.checkpoints + young.interruptions <= theirs.checkpoints + theirs.interruptions + 1e-12


LLAMA3_405B = model_shape(405e9, layers=126, hidden=16384, heads=128, kv_heads=8, vocab=128256)


def test_checkpoints_are_written_at_youngs_interval() -> None:
    from shipyard.planner.run import checkpoint_bytes, run_overheads

    workload = TrainingWorkload(model=LLAMA3_405B, seq_len=8192, global_batch_tokens=2**24)
    # Mixed-precision Adam writes 2 + 12 bytes per parameter: 5.67 TB for 405B.
    assert checkpoint_bytes(workload) == pytest.approx(405e9 * 14, rel=1e-3)
    overheads = run_overheads(workload, 16384, 1 / 3, CALIBRATION)
    # By hand: 5.67e12 B / (16,384 x 0.122 GB/s) = 2.84 s; interruptions every
    # 1 / (2.2e-5 x 16,384) = 2.77 h; Young: sqrt(2 x 2.84 s x 2.77 h) = 238 s; 2.84 / 238 = 1.19 %.
    assert overheads.checkpoint_write_s == pytest.approx(2.84, rel=0.01)
    assert overheads.checkpoint_every_h * 3600 == pytest.approx(238, rel=0.01)
    assert overheads.checkpoints == pytest.approx(0.0119, rel=0.01)
    # A run that checkpoints every hour pauses 2.84 s an hour.
    hourly = run_overheads(dataclasses.replace(workload, checkpoint_every_h=1.0), 16384, 1 / 3, CALIBRATION)
    assert hourly.checkpoints == pytest.approx(2.84 / 3600, rel=0.01)
    # LoRA writes its adapters only.
    lora = dataclasses.replace(workload, kind="lora")
    assert checkpoint_bytes(lora) == pytest.approx(lora_parameters(LLAMA3_405B, 16) * 14)


def test_evaluation_costs_its_forward_passes() -> None:
    workload = TrainingWorkload(model=LLAMA_65B, seq_len=2048, global_batch_tokens=2**22, tokens=1e11)
    cluster = cluster_of(lookup("a100-80gb"), 256)
    request = LayoutRequest(tp=8, pp=1, zero=1, recompute="none")
    plan = plan_training(workload, cluster, request)
    # Megatron-LM's defaults, 100 forward-only batches every 1,000 steps; without recomputation a
    # forward is a third of a step's FLOPs: (2N + 4Lhs) / (6N + 12Lhs).
    assert plan.overheads.evaluation == pytest.approx(100 / 1000 / 3)
    never = plan_training(dataclasses.replace(workload, eval_every_steps=0), cluster, request)
    assert never.overheads.evaluation == 0 and never.wall_time_h < plan.wall_time_h
    # Recomputing the forward makes a training step dearer, so an evaluation a smaller share of it.
    recomputed = plan_training(workload, cluster, dataclasses.replace(request, recompute="full"))
    assert recomputed.overheads.evaluation < plan.overheads.evaluation
    # The goodput gathers them all.
    o = plan.overheads
    assert plan.goodput == pytest.approx(1 / (1 + o.interruptions + o.checkpoints + o.evaluation))


def test_a_host_that_computes_pays_its_operator_dispatch_in_series() -> None:
    from shipyard.planner.host import OPS_PER_BLOCK, OPS_PER_BLOCK_OPTIMIZER, OPS_PER_MICRO_BATCH
    from shipyard.planner.shapes import shape_of
    from shipyard.schemas.presets import PRESETS

    tiny = shape_of(PRESETS["llama-tiny"].with_vocab(512))
    workload = TrainingWorkload(model=tiny, seq_len=64, global_batch_tokens=2048, precision="fp32")
    request = LayoutRequest(tp=1, pp=1, zero=0, recompute="none", micro_batch=4)
    cpu = lookup("cpu")
    derived = plan_training(workload, cluster_of(cpu, 1), request, measure="steady")
    assert derived.step.host_s == 0  # the catalog's reference CPU has no measured dispatch cost
    measured = cpu.model_copy(update={"op_overhead_us": 4.0, "gemm_efficiency": 1.1})
    plan = plan_training(workload, cluster_of(measured, 1), request, measure="steady")
    # By hand: 8 micro-batches x (2 blocks x 198 + 100) + 2 blocks x 14 = 3,996 operations of 4 us.
    ops = 8 * (2 * OPS_PER_BLOCK + OPS_PER_MICRO_BATCH) + 2 * OPS_PER_BLOCK_OPTIMIZER
    assert ops == 3996 and plan.step.host_s == pytest.approx(ops * 4e-6)
    assert plan.step.total_s == pytest.approx(plan.step.compute_s + plan.step.optimizer_s + plan.step.host_s)
    # The plan says which efficiency it took: the one measured, not the generation's.
    assert "GEMM efficiency measured on this cpu: 110% of peak" in plan.assumptions
    assert any(note.startswith("large-GEMM efficiency on cpu: 60%") for note in derived.assumptions)
    # A measured GEMM rate already holds what 256-token micro-batches cost: no GPU knee on top.
    knee = 1 + CALIBRATION.micro_batch_tokens_half / 256
    speedup = 1.1 / CALIBRATION.gemm("cpu") * knee
    assert derived.step.compute_s / plan.step.compute_s == pytest.approx(speedup)


def test_a_gpu_host_queues_kernels_alongside_the_device_and_bounds_a_small_model_s_step() -> None:
    from shipyard.hardware.catalog import AcceleratorSpec
    from shipyard.planner.host import OPS_PER_QUEUED_BLOCK
    from shipyard.planner.shapes import shape_of
    from shipyard.planner.training import TrainingPlan
    from shipyard.schemas.presets import PRESETS

    small = shape_of(PRESETS["llama-125m"].with_vocab(4096))
    h200 = lookup("h200")

    def plan(micro: int, spec: AcceleratorSpec = h200) -> TrainingPlan:
        workload = TrainingWorkload(model=small, seq_len=1024, global_batch_tokens=4 * micro * 1024)
        request = LayoutRequest(tp=1, pp=1, zero=0, recompute="none", micro_batch=micro)
        return plan_training(workload, cluster_of(spec, 1), request, measure="steady")

    # By hand: 4 micro-batches x 12 blocks x 449 operations of the reference host's 5.42 us = 116.8 ms.
    one = plan(1)
    assert one.step.host_overlaps
    assert OPS_PER_QUEUED_BLOCK == 449
    assert one.step.host_s == pytest.approx(4 * 12 * 449 * 5.42e-6) == pytest.approx(0.1168, rel=1e-3)
    # One sequence a micro-batch: the GPU finishes first and waits for the host (measured on an H200:
    # 30 ms a micro-batch against 5 ms of kernels); the step is the host's time, not the sum.
    assert one.step.device_s < one.step.host_s and one.step.total_s == one.step.host_s
    # Many sequences: the kernels outlast the queuing and the host costs nothing.
    big = plan(64)
    assert big.step.device_s > big.step.host_s and big.step.total_s == big.step.device_s
    # A measured host replaces the reference one, and a faster host never slows a plan.
    fast = plan(1, h200.model_copy(update={"op_overhead_us": 2.0}))
    assert fast.step.host_s == pytest.approx(one.step.host_s * 2.0 / 5.42)
    assert fast.step.total_s <= one.step.total_s


def test_the_host_probe_measures_positive_rates() -> None:
    from shipyard.hardware.probe import measure_host

    rates = measure_host()
    assert rates is not None  # torch is installed for the tests
    # One thread of any x86 or Arm core of the last decade: 1-500 GFLOP/s, 1-200 GB/s, 0.1-500 us.
    assert 1 < rates.gemm_gflops_per_thread < 500
    assert 1 < rates.memory_gb_per_s_per_thread < 200
    assert 0.1 < rates.op_overhead_us < 500


def test_a_model_too_big_for_the_devices_does_not_fit_and_says_why() -> None:
    plan = plan_training(TrainingWorkload(model=GPT3), cluster_of(lookup("rtx-4090"), 8))
    assert not plan.fits
    reason = plan.not_fitting_reason() or ""
    assert reason.startswith("needs ") and "rtx-4090 has 24 GiB" in reason


def test_no_price_means_no_cost() -> None:
    plan = plan_training(TrainingWorkload(model=model_shape(1e9)), cluster_of(lookup("a800"), 8))
    assert plan.cost_usd is None and plan.energy_kwh() > 0
    assert any("no price for a800" in line for line in plan.assumptions)


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (LayoutRequest(tp=16), "--tp 16 is larger than --count 8"),
        (LayoutRequest(tp=4, pp=3), r"tp x --pp = 12 does not divide --count 8"),
        (LayoutRequest(tp=5), "--tp 5 does not divide --heads 32"),
    ],
)
def test_impossible_layouts_name_the_flag(request_: LayoutRequest, match: str) -> None:
    with pytest.raises(InvalidSpec, match=match):
        plan_training(TrainingWorkload(model=model_shape(7e9)), cluster_of(lookup("h100-sxm"), 8), request_)


def test_bad_sizes_name_the_flag() -> None:
    with pytest.raises(InvalidSpec, match="--params must be above zero"):
        model_shape(-1)
    with pytest.raises(InvalidSpec, match="--heads 30 does not divide --hidden 4096"):
        model_shape(7e9, hidden=4096, heads=30)
    with pytest.raises(InvalidSpec, match="--count must be above zero"):
        cluster_of(lookup("h100-sxm"), 0)
    with pytest.raises(InvalidSpec, match="no fp8 units"):
        plan_training(
            TrainingWorkload(model=model_shape(1e9), precision="fp8"), cluster_of(lookup("v100-32gb"), 8)
        )


def test_unknown_accelerator_names_the_closest_key() -> None:
    with pytest.raises(InvalidSpec) as err:
        lookup("mi300")
    assert "did you mean 'mi300x'?" in (err.value.hint or "")
    assert "gaudi3" in (err.value.hint or "")


def test_a_user_hardware_file_overrides_and_extends(tmp_path: Path) -> None:
    extra = tmp_path / "hardware.yaml"
    h100 = catalog()["h100-sxm"].model_dump()
    new_row = {**h100, "key": "h100-nvl", "name": "NVIDIA H100 NVL", "memory_gib": 94, "match": []}
    import yaml

    override = {"key": "h100-sxm", "price_usd_per_h": 1.25, "power_limit_w": 500}
    extra.write_text(yaml.safe_dump([override, new_row]))
    rows = load_catalog(extra)
    assert rows["h100-sxm"].price_usd_per_h == 1.25 and rows["h100-sxm"].tdp_w == 700
    assert rows["h100-sxm"].board_w == 500
    assert rows["h100-nvl"].memory_gib == 94
    extra.write_text(yaml.safe_dump([{"key": "tpu-v9", "memory_gib": 1}]))
    with pytest.raises(InvalidSpec, match=r"row 'tpu-v9': .*name"):
        load_catalog(extra)


def test_every_row_has_the_figures_the_planner_needs() -> None:
    for spec in catalog().values():
        assert spec.bf16_tflops > 0 and spec.memory_gib > 0 and spec.memory_bandwidth_gb_per_s > 0, spec.key
        assert spec.tdp_w > 0 and spec.source, spec.key
        # Every price the planner costs with names where it was read and when.
        if spec.hourly_usd is not None:
            assert spec.price_source and spec.price_as_of and spec.price_from == BUILT_IN, spec.key
    assert len(catalog()) >= 20


def test_a_price_says_what_it_rests_on_and_a_users_own_is_shown_as_theirs(tmp_path: Path) -> None:
    import yaml

    h100 = catalog()["h100-sxm"]
    assert h100.price_basis == (
        f"h100-sxm: $2.5/h rental ({h100.price_source}; as of {h100.price_as_of}; built-in catalog)"
    )
    assert h100.price_dict()["kind"] == "rental" and catalog()["gaudi3"].price_dict()["kind"] == "amortized"
    extra = tmp_path / "hardware.yaml"
    rows = [
        {"key": "h100-sxm", "price_usd_per_h": 1.9},  # a price with no word on where it came from
        {
            "key": "a100-80gb",
            "price_usd_per_h": 1.2,
            "price_source": "our reserved rate",
            "price_as_of": "2026-12",
        },
        {"key": "h200", "power_limit_w": 600, "price_from": "the built-in catalog"},  # no price of its own
    ]
    extra.write_text(yaml.safe_dump(rows))
    mine = load_catalog(extra)
    assert (
        mine["h100-sxm"].price_basis
        == f"h100-sxm: $1.9/h rental (date not given; your hardware file {extra})"
    )
    assert mine["a100-80gb"].price_dict() | {"basis": None} == {
        "usd_per_h": 1.2,
        "kind": "rental",
        "source": "our reserved rate",
        "as_of": "2026-12",
        "from": str(extra),
        "basis": None,
    }
    assert mine["h200"].price_from == BUILT_IN and mine["h200"].price_source == catalog()["h200"].price_source
    extra.write_text(yaml.safe_dump([{"key": "h200", "price_usd_per_h": 3, "price_as_of": "last spring"}]))
    with pytest.raises(InvalidSpec, match="price_as_of"):
        load_catalog(extra)


def test_the_advisor_says_when_it_compares_a_purchase_with_rentals() -> None:
    workload = TrainingWorkload(model=model_shape(8e9), tokens=1e11)
    rentals = compare(workload, [lookup("h100-sxm"), lookup("a100-80gb")], count=8)
    assert price_caveat(rentals) is None
    mixed = compare(workload, [lookup("h100-sxm"), lookup("gaudi3")], count=8)
    caveat = price_caveat(mixed) or ""
    assert (
        caveat.startswith("gaudi3 is costed at a purchase price over 3 years")
        and "not like for like" in caveat
    )


@settings(max_examples=40, deadline=None)
@given(
    params=st.floats(min_value=1e8, max_value=2e11),
    dp_small=st.integers(min_value=1, max_value=64),
    factor=st.integers(min_value=2, max_value=16),
    micro_batch=st.sampled_from([1, 2, 4]),
    recompute=st.sampled_from(["none", "selective", "full"]),
)
def test_more_devices_never_increase_memory_per_device_under_zero3(
    params: float, dp_small: int, factor: int, micro_batch: int, recompute: str
) -> None:
    workload = TrainingWorkload(model=model_shape(params))

    def per_device(dp: int) -> float:
        chosen = layout(dp=dp, zero=3, micro_batch=micro_batch, recompute=recompute)
        return training_memory(workload, chosen, 80, CALIBRATION).total_gib

    assert per_device(dp_small * factor) <= per_device(dp_small) + 1e-9


@settings(max_examples=40, deadline=None)
@given(
    params=st.floats(min_value=1e9, max_value=1e11),
    bandwidth=st.floats(min_value=100, max_value=5000),
    scale=st.floats(min_value=1.1, max_value=4),
)
def test_decode_speed_scales_with_memory_bandwidth(params: float, bandwidth: float, scale: float) -> None:
    workload = InferenceWorkload(model=model_shape(params), batch=1, context=1024)
    base = lookup("h200")

    def decode(gb_per_s: float) -> float:
        spec = base.model_copy(update={"memory_bandwidth_gb_per_s": gb_per_s})
        return plan_inference(workload, cluster_of(spec, 1)).decode_tokens_per_s

    slow, fast = decode(bandwidth), decode(bandwidth * scale)
    assert fast >= slow
    # Batch-1 decode is bandwidth-bound: speed is proportional to bandwidth.
    assert fast / slow == pytest.approx(scale, rel=1e-6)


def test_lora_trains_a_small_fraction_of_the_parameters() -> None:
    llama = model_shape(6.7e9, layers=32, hidden=4096, heads=32)
    adapters = lora_parameters(llama, rank=16)
    assert 0.002 < adapters / llama.params < 0.01
    workload = TrainingWorkload(model=llama, kind="qlora")
    memory = training_memory(workload, layout(recompute="full"), 24, CALIBRATION)
    # 4-bit base weights: well under a third of 16-bit ones.
    assert memory.weights_gib < 6.7e9 * 2 / GIB / 3 and memory.fits


def test_recomputing_one_block_in_k_costs_and_saves_in_proportion() -> None:
    workload = TrainingWorkload(model=LLAMA_65B, seq_len=2048)
    dense = [flops_per_token(workload, "full", every)[1] for every in (1, 2, 4)]
    extra = [d - flops_per_token(workload, "none")[1] for d in dense]
    assert extra[1] == pytest.approx(extra[0] / 2) and extra[2] == pytest.approx(extra[0] / 4)
    memory = [
        training_memory(
            workload, layout(recompute="full", recompute_every=every), 1e9, CALIBRATION
        ).activations_gib
        for every in (1, 2, 80)
    ]
    kept_all = training_memory(workload, layout(), 1e9, CALIBRATION).activations_gib
    assert memory[0] < memory[1] < memory[2] <= kept_all * 1.02


def test_the_runtime_s_search_tries_ddp_and_fsdp_and_splits_key_value_heads_evenly() -> None:
    shape = model_shape(7e9, layers=32, hidden=4096, heads=32, kv_heads=2)
    workload = TrainingWorkload(model=shape, activations="shipyard")
    cluster = cluster_of(catalog()["h100-sxm"], 8)
    plan = plan_training(workload, cluster, LayoutRequest(pp=1, interleave=1, zero_choices=(0, 3)))
    assert plan.layout.zero in (0, 3) and plan.layout.tp in (1, 2)


def test_the_runtime_keeps_more_than_megatron_s_gpt_blocks_and_recomputation_cuts_it() -> None:
    shape = model_shape(7e9, layers=32, hidden=4096, heads=32)
    megatron = TrainingWorkload(model=shape, seq_len=4096)
    runtime = TrainingWorkload(model=shape, seq_len=4096, activations="shipyard", fused_norm=True)
    kept = {
        name: training_memory(w, layout(micro_batch=2), 1e9, CALIBRATION).activations_gib
        for name, w in (("megatron", megatron), ("runtime", runtime))
    }
    # fp32 norms and an fp32 residual stream under autocast: more than Korthikanti's 34 bytes.
    assert kept["runtime"] > kept["megatron"]
    full = training_memory(runtime, layout(micro_batch=2, recompute="full"), 1e9, CALIBRATION)
    assert full.activations_gib < kept["runtime"] / 6


# Monotonic in what the cluster gives: a plan searches its layout, so a faster network or more
# overlap can only leave each layout as fast or faster, and the best of them too.
MONOTONE_CASES = {
    "params": st.floats(min_value=1e9, max_value=2e11),
    "nodes": st.sampled_from([2, 8, 64, 512]),
    "device": st.sampled_from(["a100-80gb", "h100-sxm", "mi300x"]),
    "factor": st.floats(min_value=1.1, max_value=8),
}


def _plan_step_s(params: float, nodes: int, device: str, **changes: object) -> float:
    spec = lookup(device)
    gbit = changes.pop("network_gbit_per_s", 100.0)
    cluster = cluster_of(spec, nodes * spec.devices_per_node, network=str(gbit))
    calibration = dataclasses.replace(CALIBRATION, **changes)  # type: ignore[arg-type]
    workload = TrainingWorkload(model=model_shape(params), global_batch_tokens=2**22)
    return plan_training(workload, cluster, LayoutRequest(), calibration=calibration).step.total_s


@settings(max_examples=25, deadline=None)
@given(**MONOTONE_CASES)
def test_more_network_bandwidth_never_slows_a_plan(
    params: float, nodes: int, device: str, factor: float
) -> None:
    slow = _plan_step_s(params, nodes, device, network_gbit_per_s=100.0)
    fast = _plan_step_s(params, nodes, device, network_gbit_per_s=100.0 * factor)
    assert fast <= slow * (1 + 1e-9)


@settings(max_examples=25, deadline=None)
@given(**MONOTONE_CASES)
def test_more_overlap_never_slows_a_plan(params: float, nodes: int, device: str, factor: float) -> None:
    less = _plan_step_s(params, nodes, device, dp_overlap=0.9 / factor)
    more = _plan_step_s(params, nodes, device, dp_overlap=0.9)
    assert more <= less * (1 + 1e-9)
    generation = lookup(device).architecture
    less = _plan_step_s(params, nodes, device, tp_overlap={generation: 0.9 / factor})
    more = _plan_step_s(params, nodes, device, tp_overlap={generation: 0.9})
    assert more <= less * (1 + 1e-9)


@settings(max_examples=25, deadline=None)
@given(**MONOTONE_CASES)
def test_a_lower_power_limit_never_speeds_a_plan(
    params: float, nodes: int, device: str, factor: float
) -> None:
    spec = lookup(device)
    workload = TrainingWorkload(model=model_shape(params), global_batch_tokens=2**22)

    def step_s(watts: float) -> float:
        capped = spec.model_copy(update={"power_limit_w": watts})
        cluster = cluster_of(capped, nodes * spec.devices_per_node)
        return plan_training(workload, cluster, LayoutRequest()).step.total_s

    assert step_s(spec.tdp_w / factor) >= step_s(spec.tdp_w) * (1 - 1e-9)


def test_a_power_limit_slows_the_clocks_by_its_cube_root_and_caps_the_energy() -> None:
    # Meta's H100s run at 500 W of their 700 W: clocks at (500/700)^(1/3) = 89.4 %.
    h100 = lookup("h100-sxm")
    capped = h100.model_copy(update={"power_limit_w": 500.0})
    assert CALIBRATION.power_clock(capped) == pytest.approx(0.8939, abs=1e-4)
    assert CALIBRATION.power_clock(h100) == 1.0
    # A limit above the TDP changes nothing: the board never draws more than its TDP anyway.
    assert CALIBRATION.power_clock(h100.model_copy(update={"power_limit_w": 900.0})) == 1.0
    workload = TrainingWorkload(model=model_shape(1e9), seq_len=4096, global_batch_tokens=8 * 4096)
    request = LayoutRequest(tp=1, pp=1, zero=0, recompute="none", micro_batch=8)
    full, slow = (
        plan_training(workload, cluster_of(spec, 1), request, measure="steady") for spec in (h100, capped)
    )
    # The math slows with the clock; the memory-bound share of a layer (norms, activations) and the
    # optimizer's memory traffic do not, so compute slows by less than 1/0.894.
    assert full.step.compute_s < slow.step.compute_s < full.step.compute_s / 0.8939
    assert slow.step.optimizer_s == full.step.optimizer_s
    # MFU stays against the nominal peak; energy counts 80 % of 500 W, not of 700 W.
    assert slow.peak_tflops == full.peak_tflops and slow.mfu < full.mfu
    assert slow.energy_kwh() / slow.gpu_hours == pytest.approx(0.8 * 500 / 1000)
    assert any("power limit 500 W" in note for note in slow.assumptions)


def test_tensor_parallel_traffic_hides_under_the_gemms_with_sequence_parallelism() -> None:
    # Llama 2 70B, TP8 within one H100 node, one 4,096-token sequence a micro-batch, 8 of them.
    from shipyard.planner.training import step_time

    workload = TrainingWorkload(model=model_shape(70e9, layers=80, hidden=8192, heads=64), seq_len=4096,
                                global_batch_tokens=8 * 4096)  # fmt: skip
    cluster = cluster_of(lookup("h100-sxm"), 8)
    exposed = dataclasses.replace(CALIBRATION, tp_overlap={"hopper": 0.0})
    half = dataclasses.replace(CALIBRATION, tp_overlap={"hopper": 0.5})
    with_sp = layout(tp=8, sequence_parallel=True)
    # By hand: an all-reduce of 4,096 x 8,192 bf16 activations (64 MiB) moves 2 x 7/8 of it over
    # NVLink (450 GB/s x the link efficiency), plus one collective's latency; four a layer.
    link = cluster.link_gb_per_s * 1e9 * CALIBRATION.link_efficiency
    all_reduce = 2 * 7 / 8 * 4096 * 8192 * 2 / link + CALIBRATION.collective_latency_s
    full = step_time(workload, cluster, with_sp, exposed).tensor_parallel_s
    assert full == pytest.approx(8 * 80 * 4 * all_reduce)
    assert step_time(workload, cluster, with_sp, half).tensor_parallel_s == pytest.approx(full / 2)
    # Without sequence parallelism there are no chunks to overlap; on Ampere none was measured.
    no_sp = layout(tp=8, sequence_parallel=False)
    assert step_time(workload, cluster, no_sp, half).tensor_parallel_s == pytest.approx(full)
    a100 = cluster_of(lookup("a100-80gb"), 8)
    assert (
        step_time(workload, a100, with_sp, half).tensor_parallel_s
        == step_time(workload, a100, with_sp, exposed).tensor_parallel_s
    )


@settings(max_examples=25, deadline=None)
@given(**MONOTONE_CASES)
def test_a_whole_run_is_never_faster_than_its_steady_state(
    params: float, nodes: int, device: str, factor: float
) -> None:
    spec = lookup(device)
    cluster = cluster_of(spec, nodes * spec.devices_per_node)
    workload = TrainingWorkload(model=model_shape(params), tokens=params * 20 * factor)
    run, steady = (plan_training(workload, cluster, measure=m) for m in ("run", "steady"))
    assert steady.tokens_per_s == run.tokens_per_s and steady.goodput == 1.0
    assert run.wall_time_h >= steady.wall_time_h and run.gpu_hours >= steady.gpu_hours


def test_the_search_recomputes_only_the_blocks_memory_needs() -> None:
    # Llama 3.1 405B on 8,192 H100s (TP8 PP16 DP64, Meta's layout): keeping every activation
    # does not fit with an interleaved pipeline, recomputing every block costs a third more
    # compute; one block in four recomputed fits, and wins.
    workload = TrainingWorkload(model=LLAMA3_405B, seq_len=8192, global_batch_tokens=2**24)
    cluster = cluster_of(lookup("h100-sxm"), 8192)
    plan = plan_training(workload, cluster, LayoutRequest(tp=8, pp=16), measure="steady")
    assert plan.fits and (plan.layout.recompute, plan.layout.recompute_every) == ("full", 4)
    every_block = plan_training(
        workload, cluster, LayoutRequest(tp=8, pp=16, recompute="full", interleave=plan.layout.interleave)
    )
    assert every_block.layout.recompute_every == 1 and every_block.step.total_s > plan.step.total_s
    # Tensor-parallel all-reduces: four per layer, two more per recomputed layer (32 of 126).
    same = dataclasses.replace(plan.layout, recompute_every=1)
    from shipyard.planner.training import step_time

    assert plan.step.tensor_parallel_s / step_time(
        workload, cluster, same, CALIBRATION
    ).tensor_parallel_s == (pytest.approx((4 + 2 * 32 / 126) / 6))


def test_every_throughput_says_what_it_rests_on() -> None:
    workload = TrainingWorkload(model=model_shape(8e9), tokens=1e11)
    published = plan_training(workload, cluster_of(lookup("a100-80gb"), 8)).evidence
    table = json.loads((Path(planner_evidence.__file__).parent / "evidence.json").read_text())
    row = table["types"]["a100-80gb"]["16-bit"]
    assert (published.kind, published.runs, published.sources) == ("published", row["runs"], row["sources"])
    assert published.words.startswith(
        f"a100-80gb (16-bit): {row['runs']} published runs from {row['sources']}"
    )
    fp8 = plan_training(
        TrainingWorkload(model=model_shape(8e9), precision="fp8"), cluster_of(lookup("h100-sxm"), 8)
    )
    assert fp8.evidence.regime == "fp8" and fp8.evidence.runs == table["types"]["h100-sxm"]["fp8"]["runs"]
    gaudi = plan_training(workload, cluster_of(lookup("gaudi3"), 8))
    assert gaudi.evidence.kind == "extrapolated" and gaudi.evidence.short == "peak only"
    assert "extrapolated from its peak, treat as an upper bound" in gaudi.to_dict()["evidence"]["words"]
    assert gaudi.assumptions[0] == f"evidence: {gaudi.evidence.words}; {gaudi.evidence.range_words}"
    host = lookup("cpu").model_copy(update={"gemm_efficiency": 0.5})  # as discovery measures a host
    assert plan_training(workload, cluster_of(host, 1)).evidence.kind == "measured here"
