"""The published training runs the capacity planner is scored and fitted on: each usable CSV row as
a planner call with the row's own layout, and the scoring of the planner's predictions against
the measured figures. Shared by ``planner_accuracy.py`` (scores) and ``planner_calibrate.py``
(fits), which import this module and not each other."""

from __future__ import annotations

import csv
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shipyard.errors import ShipyardError
from shipyard.hardware.catalog import AcceleratorSpec, catalog, match_accelerator_type
from shipyard.planner.shapes import model_shape
from shipyard.planner.training import Measure, TrainingPlan, plan_training
from shipyard.planner.workload import Cluster, LayoutRequest, TrainingWorkload, cluster_of

DEFAULT_RUNS = Path(__file__).resolve().parents[2] / "shared" / "data" / "planner" / "training-runs-dev.csv"
HELDOUT_RUNS = Path(__file__).resolve().parent / "data" / "heldout-runs.csv"
MLPERF_RUNS = Path(__file__).resolve().parent / "data" / "mlperf-gpt3-runs.csv"
"""MLPerf Training GPT-3 175B results (fp8, 512-11,616 H100s, three rounds), read from the
submissions' own logs and configs: the development file's runs at thousands of devices."""
DEVELOPMENT_RUNS = (DEFAULT_RUNS, MLPERF_RUNS)


@dataclass(frozen=True)
class Case:
    run_id: str
    workload: TrainingWorkload
    cluster: Cluster
    request: LayoutRequest
    metric: str
    """``tokens_per_s_per_device``, ``tflops_per_device`` or ``mfu``."""
    measured: float
    measured_wall_h: float | None
    measure: Measure = "steady"
    """``run`` where the figure is a whole run's (its GPU-hours: restarts and all), else a
    benchmark's steady state; the prediction is made for the same one."""
    family: str = ""
    """The paper or vendor the row comes from (the first word of its category): what a
    leave-one-source-out cross-validation holds out together."""


def _number(text: str) -> float | None:
    match = re.search(r"-?\d+(\.\d+)?", text or "")
    return float(match.group()) if match else None


def _int_after(pattern: str, text: str) -> int | None:
    match = re.search(pattern, text, re.IGNORECASE)
    return int(match.group(1)) if match else None


def parse_accelerator(hardware: str) -> str | None:
    memory = _int_after(r"(\d+)\s*GB", hardware)
    return match_accelerator_type(hardware, float(memory) if memory else None)


def parse_network(text: str, devices_per_node: int) -> str | None:
    """Per-device scale-out bandwidth in Gbit/s from a free-text interconnect description."""
    text = text or ""
    if re.search(r"single node", text, re.IGNORECASE):
        return None
    per_gpu = re.search(r"(\d+)\s*Gb(?:ps|/s)[^;]*per GPU", text, re.IGNORECASE)
    if per_gpu:
        return per_gpu.group(1)
    links = re.search(r"(\d+)x\s*[^;\d]*?(\d+)\s*Gb(?:ps|/s)", text, re.IGNORECASE)
    if links:
        return str(int(links.group(1)) * int(links.group(2)) / devices_per_node)
    per_node = re.search(r"(\d+)\s*Gb(?:ps|/s)", text, re.IGNORECASE)
    if per_node:
        return str(int(per_node.group(1)) / devices_per_node)
    for name, rate in (("NDR", "400"), ("HDR", "200"), ("EDR", "100")):
        if name in text:
            return rate
    return None


def parse_layout(parallelism: str, precision: str) -> LayoutRequest:
    text = f"{parallelism} {precision}"
    tp = _int_after(r"\bTP\s*(\d+)", text) or _int_after(r"TP(\d+)", text)
    pp = _int_after(r"\bPP\s*(\d+)", text) or _int_after(r"PP(\d+)", text)
    zero = _int_after(r"ZeRO-(\d)", text)
    if re.search(r"FSDP|FULL_SHARD|ZeRO-3", text):
        zero = 3
    recompute = None
    if re.search(r"selective", text, re.IGNORECASE):
        recompute = "selective"
    elif re.search(
        r"full (AC|activation|recompute)|full recompute|act\. ckpt|activation recompute", text, re.IGNORECASE
    ):
        recompute = "full"
    sequence_parallel = True if re.search(r"sequence parallel", text, re.IGNORECASE) else None
    if (
        tp
        and tp > 1
        and sequence_parallel is None
        and "Megatron" not in text
        and not re.search(r"PTD-P|1F1B", text)
    ):
        sequence_parallel = None
    elif tp and tp > 1 and sequence_parallel is None:
        sequence_parallel = False
    # "local batch" is the per-replica batch; it is the micro-batch only without pipelining.
    micro_batch = _int_after(r"\bmbs(\d+)", text) or (
        None if pp and pp > 1 else _int_after(r"local batch (\d+)", text)
    )
    interleave = _int_after(r"\bVP(\d+)", text) or (1 if "non-interleaved" in text else None)
    # "model parallel" without a degree leaves tp and pp to the planner's search.
    unstated = re.search(r"model\+|model parallel", text, re.IGNORECASE) is not None
    pure_data_parallel = not unstated and (zero == 3 or "DP" in text)
    return LayoutRequest(
        tp=tp or (1 if pure_data_parallel else None),
        pp=pp or (1 if tp or pure_data_parallel else None),
        zero=zero,
        recompute=recompute,  # type: ignore[arg-type]
        micro_batch=micro_batch,
        sequence_parallel=sequence_parallel,
        interleave=interleave,
    )


def parse_precision(text: str) -> str:
    text = text.lower()
    if "fp8" in text and "baseline" not in text.split("fp8")[0]:
        return "fp8"
    if "fp16" in text and "bf16" not in text:
        return "fp16"
    if "fp32" in text and "16" not in text:
        return "fp32"
    return "bf16"


def parse_kind(workload: str) -> str:
    text = workload.lower()
    if "qlora" in text:
        return "qlora"
    if "lora" in text:
        return "lora"
    if "fine" in text or "sft" in text:
        return "finetune"
    return "pretrain"


def load_all(paths: Sequence[Path]) -> tuple[list[Case], list[tuple[str, str]]]:
    """The usable runs of every file, and the skipped ones with why."""
    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    for path in paths:
        found, left = load_cases(path)
        cases += found
        skipped += left
    return cases, skipped


def load_cases(path: Path) -> tuple[list[Case], list[tuple[str, str]]]:
    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            run = row["run_id"]
            try:
                case = _case(row)
            except (ValueError, ShipyardError) as exc:
                skipped.append((run, str(exc)))
                continue
            if isinstance(case, str):
                skipped.append((run, case))
            else:
                cases.append(case)
    return cases, skipped


def _case(row: dict[str, str]) -> Case | str:
    key = parse_accelerator(row["hardware"])
    if key is None:
        return f"hardware not in the catalog: {row['hardware']}"
    figures = (
        ("tokens_per_s_per_device", _number(row["tokens_per_sec_per_gpu"])),
        ("tflops_per_device", _number(row["tflops_per_gpu"])),
        ("mfu", (_number(row["mfu_pct"]) or 0) / 100),
    )
    metric, value = next(((m, v) for m, v in figures if v), ("", None))
    if value is None:
        return "no throughput figure"
    precision = parse_precision(row["precision"])
    layers, hidden, heads = (_int_after(r"(\d+)", row[c]) for c in ("layers", "hidden", "heads"))
    params = float(row["active_params_b"] or row["params_b"]) * 1e9
    shape = model_shape(params, layers=layers, hidden=hidden, heads=heads)
    seq = int(_number(row["seq_len"]) or 2048)
    batch = int(_number(row["global_batch_tokens"]) or seq * 512)
    tokens = _number(row["tokens_trained"])
    workload = TrainingWorkload(
        model=shape,
        kind=parse_kind(row["workload"]),  # type: ignore[arg-type]
        seq_len=seq,
        global_batch_tokens=batch,
        tokens=tokens,
        precision=precision,  # type: ignore[arg-type]
        flash_attention=_flash_attention(row),
    )
    spec = _as_described(catalog()[key], row["hardware"])
    count = _number(row["num_accelerators"])
    if not count:
        count = 2 ** round(math.log2(max(1, batch // seq)))
    network = parse_network(row["interconnect"], spec.devices_per_node)
    cluster = cluster_of(spec, int(count), network=network)
    wall = _number(row["wall_time_hours"])
    return Case(
        run_id=row["run_id"],
        workload=workload,
        cluster=cluster,
        request=parse_layout(row["parallelism"], row["precision"]),
        metric=metric,
        measured=value,
        measured_wall_h=wall if wall and tokens else None,
        measure=_measure(row.get("measurement_type") or row.get("measured_metric") or ""),
        family=row["category"].split()[0].lower(),
    )


def _measure(how_measured: str) -> Measure:
    return "run" if re.search(r"full (pre)?training run|GPU-hours", how_measured, re.IGNORECASE) else "steady"


def _flash_attention(row: dict[str, str]) -> bool:
    """Fused attention kernels (FlashAttention, xformers) arrived in mid-2022: runs published
    through 2022 stored the scores."""
    years = [int(y) for y in re.findall(r"(?:19|20)(\d\d)\b", row["source"]) if 15 <= int(y) <= 40]
    years += [int(y) for y in re.findall(r"SC(\d\d)|arXiv:(\d\d)", row["source"]) for y in y if y]
    return not years or max(years) >= 23


def _as_described(spec: AcceleratorSpec, hardware: str) -> AcceleratorSpec:
    """The catalog row with the memory size, bandwidth and power limit the run's hardware text
    states, when it states other ones (torchtitan's H100 variant: 96 GB of HBM2e at 2.4 TB/s, 500 W)."""
    update: dict[str, float] = {}
    limit = re.search(r"(\d+)\s*W cap", hardware)
    if limit:
        update["power_limit_w"] = float(limit.group(1))
    memory = re.search(r"(\d+)\s*GB\b", hardware)
    if memory and abs(float(memory.group(1)) - spec.memory_gib) > 1:
        update["memory_gib"] = float(memory.group(1))
    bandwidth = re.search(r"(\d+(?:\.\d+)?)\s*TB/s", hardware)
    if bandwidth:
        update["memory_bandwidth_gb_per_s"] = float(bandwidth.group(1)) * 1000
    return spec.model_copy(update=update) if update else spec


def predict(case: Case, plan: TrainingPlan) -> float:
    """The row's figure from the plan: a whole run's throughput is the steady one x goodput."""
    return float(getattr(plan, case.metric)) * plan.goodput


RULE_OF_THUMB_MFU = 0.4


def rule_of_thumb(case: Case, plan: TrainingPlan) -> float:
    """What most capacity spreadsheets do: 6N + 12*L*h*s FLOPs per token at a flat 40 % MFU."""
    tokens_per_s = RULE_OF_THUMB_MFU * plan.peak_tflops * 1e12 / plan.model_flops_per_token
    return {
        "tokens_per_s_per_device": tokens_per_s,
        "tflops_per_device": tokens_per_s * plan.model_flops_per_token / 1e12,
        "mfu": RULE_OF_THUMB_MFU,
    }[case.metric]


def score(cases: list[Case], calibration=None) -> dict[str, object]:  # type: ignore[no-untyped-def]
    kwargs = {} if calibration is None else {"calibration": calibration}
    rows = []
    for case in cases:
        plan = plan_training(case.workload, case.cluster, case.request, measure=case.measure, **kwargs)
        predicted = predict(case, plan)
        error = predicted / case.measured - 1
        baseline_error = rule_of_thumb(case, plan) / case.measured - 1
        wall_error = None
        if case.measured_wall_h:
            wall_error = plan.wall_time_h / case.measured_wall_h - 1
        rows.append(
            {
                "run_id": case.run_id,
                "family": case.family,
                "accelerator": case.cluster.accelerator.key,
                "count": case.cluster.count,
                "metric": case.metric,
                "measured": case.measured,
                "predicted": predicted,
                "error": error,
                "wall_error": wall_error,
                "rule_of_thumb_error": baseline_error,
                "layout": f"tp{plan.layout.tp} pp{plan.layout.pp} dp{plan.layout.dp} z{plan.layout.zero} "
                f"{plan.layout.recompute} mb{plan.layout.micro_batch} v{plan.layout.interleave}",
                "fits": plan.fits,
            }
        )
    return summarize(rows)


def summarize(rows: list[dict[str, object]]) -> dict[str, object]:
    errors = [abs(r["error"]) for r in rows]  # type: ignore[arg-type]
    baseline = [abs(r["rule_of_thumb_error"]) for r in rows]  # type: ignore[arg-type]
    walls = [abs(r["wall_error"]) for r in rows if r["wall_error"] is not None]  # type: ignore[arg-type]
    return {
        "rows": rows,
        "throughput_mdape": statistics.median(errors),
        "wall_time_mdape": statistics.median(walls) if walls else None,
        "within_20pct": sum(e <= 0.2 for e in errors) / len(errors),
        "rule_of_thumb_mdape": statistics.median(baseline),
        "rule_of_thumb_within_20pct": sum(e <= 0.2 for e in baseline) / len(baseline),
        "scored": len(rows),
        "wall_time_rows": len(walls),
    }
