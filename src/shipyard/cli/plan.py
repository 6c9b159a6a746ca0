"""``shipyard plan train|infer|compare|catalog``: memory, time, cost and energy before buying or booking."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from shipyard.cli._output import JsonOpt, console, fmt, print_json, table
from shipyard.errors import InvalidSpec
from shipyard.planner.advisor import RANKINGS, Comparison
from shipyard.planner.inference import InferencePlan, InferenceWorkload
from shipyard.planner.shapes import model_shape
from shipyard.planner.training import TrainingPlan
from shipyard.planner.workload import LayoutRequest, TrainingWorkload
from shipyard.services import planning
from shipyard.settings import Settings

sub_app = typer.Typer(
    help="Predict memory, time, cost and energy of an LLM workload on any accelerator.", no_args_is_help=True
)

Params = Annotated[float, typer.Option("--params", help="Parameters, e.g. 7e9 (embeddings included).")]
Layers = Annotated[int | None, typer.Option("--layers", help="Transformer layers (default: from --params).")]
Hidden = Annotated[int | None, typer.Option("--hidden", help="Hidden size (default: from --params).")]
Heads = Annotated[int | None, typer.Option("--heads", help="Attention heads (default: hidden/128).")]
KvHeads = Annotated[
    int | None, typer.Option("--kv-heads", help="Key/value heads for GQA (default: --heads).")
]
Vocab = Annotated[int | None, typer.Option("--vocab", help="Vocabulary size (default 32000).")]
Accelerator = Annotated[
    str, typer.Option("--accelerator", help="Catalog key, e.g. h100-sxm (see `plan catalog`).")
]
Count = Annotated[int, typer.Option("--count", help="Number of devices.")]
SeqLen = Annotated[int, typer.Option("--seq-len", help="Tokens per sequence.")]
GlobalBatch = Annotated[float, typer.Option("--global-batch-tokens", help="Tokens per optimizer step.")]
Tokens = Annotated[
    float | None, typer.Option("--tokens", help="Training budget in tokens (default: 20 per parameter).")
]
Interconnect = Annotated[
    str | None,
    typer.Option(
        help="Link inside a node: nvlink-4, nvlink-3, nvlink-2, pcie-gen5/4/3, or GB/s per direction."
    ),
]
Network = Annotated[
    str | None,
    typer.Option(help="Link between nodes, per device: ib-ndr, ib-hdr, roce-400, eth-100, ... or Gbit/s."),
]
DevicesPerNode = Annotated[int | None, typer.Option(help="Devices per node (default: the catalog's).")]
HardwareFile = Annotated[
    Path | None,
    typer.Option(
        "--hardware",
        help="YAML rows that add accelerator types or override prices, power, links "
        "(default: $SHIPYARD_HOME/hardware.yaml when present).",
    ),
]


def _catalog(hardware: Path | None) -> dict[str, Any]:
    return planning.hardware_catalog(Settings.from_env(), hardware)


@sub_app.command()
def train(
    params: Params,
    accelerator: Accelerator,
    count: Count,
    layers: Layers = None,
    hidden: Hidden = None,
    heads: Heads = None,
    kv_heads: KvHeads = None,
    vocab: Vocab = None,
    seq_len: SeqLen = 2048,
    global_batch_tokens: GlobalBatch = 2**22,
    tokens: Tokens = None,
    workload: Annotated[str, typer.Option(help="pretrain, finetune, lora or qlora.")] = "pretrain",
    tp: Annotated[int | None, typer.Option(help="Tensor-parallel degree (default: searched).")] = None,
    pp: Annotated[int | None, typer.Option(help="Pipeline stages (default: searched).")] = None,
    zero: Annotated[int | None, typer.Option(help="ZeRO stage 0-3; 3 is FSDP (default: searched).")] = None,
    recompute: Annotated[
        str | None, typer.Option(help="none, selective or full (default: searched).")
    ] = None,
    micro_batch: Annotated[
        int | None, typer.Option(help="Sequences per device per pass (default: searched).")
    ] = None,
    interleave: Annotated[
        int | None, typer.Option(help="Virtual pipeline stages per device (default: searched).")
    ] = None,
    precision: Annotated[str, typer.Option(help="bf16, fp16, fp8 or fp32.")] = "bf16",
    optimizer: Annotated[str, typer.Option(help="adamw, adam8bit or sgd.")] = "adamw",
    lora_rank: Annotated[int, typer.Option(help="LoRA/QLoRA adapter rank.")] = 16,
    flash_attention: Annotated[bool, typer.Option(help="Fused attention (scores never stored).")] = True,
    interconnect: Interconnect = None,
    network: Network = None,
    devices_per_node: DevicesPerNode = None,
    hardware: HardwareFile = None,
    json_out: JsonOpt = False,
) -> None:
    """Memory per device, step time, tokens/s, MFU, wall time, GPU-hours, cost and energy of training."""
    work = _training_workload(
        workload, params, layers, hidden, heads, kv_heads, vocab, seq_len, global_batch_tokens, tokens,
        precision, optimizer, lora_rank, flash_attention,
    )  # fmt: skip
    request = LayoutRequest(
        tp=tp,
        pp=pp,
        zero=zero,
        recompute=_choice("--recompute", recompute, ("none", "selective", "full")),  # type: ignore[arg-type]
        micro_batch=micro_batch,
        interleave=interleave,
    )
    links = planning.Links(interconnect=interconnect, network=network, devices_per_node=devices_per_node)
    plan = planning.train(_catalog(hardware), work, accelerator, count, request, links)
    if json_out:
        print_json(plan.to_dict())
        return
    _print_training(plan)


@sub_app.command()
def infer(
    params: Params,
    accelerator: Accelerator,
    count: Count,
    layers: Layers = None,
    hidden: Hidden = None,
    heads: Heads = None,
    kv_heads: KvHeads = None,
    vocab: Vocab = None,
    batch: Annotated[int, typer.Option(help="Sequences decoded together.")] = 1,
    context: Annotated[int, typer.Option(help="Prompt plus generated tokens per sequence.")] = 2048,
    precision: Annotated[str, typer.Option(help="fp16, bf16, int8 or int4 weights.")] = "fp16",
    tp: Annotated[
        int | None, typer.Option(help="Devices one model is split over (default: --count).")
    ] = None,
    interconnect: Interconnect = None,
    network: Network = None,
    devices_per_node: DevicesPerNode = None,
    hardware: HardwareFile = None,
    json_out: JsonOpt = False,
) -> None:
    """Memory per device, prefill and decode tokens/s of serving a model."""
    work = _inference_workload(params, layers, hidden, heads, kv_heads, vocab, batch, context, precision)
    links = planning.Links(interconnect=interconnect, network=network, devices_per_node=devices_per_node)
    plan = planning.infer(_catalog(hardware), work, accelerator, count, tp, links)
    if json_out:
        print_json(plan.to_dict())
        return
    _print_inference(plan)


@sub_app.command()
def compare(
    params: Params,
    workload: Annotated[str, typer.Option(help="train, finetune, lora, qlora or infer.")] = "train",
    accelerators: Annotated[
        str | None, typer.Option(help="Comma-separated catalog keys (default: the whole catalog).")
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", help="Devices of each type (default: the fewest that fit).")
    ] = None,
    layers: Layers = None,
    hidden: Hidden = None,
    heads: Heads = None,
    kv_heads: KvHeads = None,
    vocab: Vocab = None,
    seq_len: SeqLen = 2048,
    global_batch_tokens: GlobalBatch = 2**22,
    tokens: Tokens = None,
    batch: Annotated[int, typer.Option(help="Inference: sequences decoded together.")] = 1,
    context: Annotated[int, typer.Option(help="Inference: tokens per sequence.")] = 2048,
    precision: Annotated[
        str | None, typer.Option(help="Training: bf16/fp16/fp8/fp32; inference: fp16/int8/int4.")
    ] = None,
    rank_by: Annotated[str, typer.Option(help="time, cost or energy.")] = "cost",
    plot: Annotated[Path | None, typer.Option(help="Also draw the comparison as a PNG chart here.")] = None,
    hardware: HardwareFile = None,
    json_out: JsonOpt = False,
) -> None:
    """Rank accelerator types for one workload by time, cost and energy; say why the others do not fit."""
    work: TrainingWorkload | InferenceWorkload
    if workload == "infer":
        work = _inference_workload(
            params, layers, hidden, heads, kv_heads, vocab, batch, context, precision or "fp16"
        )
    else:
        kind = {"train": "pretrain"}.get(workload, workload)
        work = _training_workload(
            kind, params, layers, hidden, heads, kv_heads, vocab, seq_len, global_batch_tokens, tokens,
            precision or "bf16", "adamw", 16, True,
        )  # fmt: skip
    keys = [k.strip() for k in accelerators.split(",") if k.strip()] if accelerators else None
    rows = planning.compare_accelerators(
        _catalog(hardware), work, keys, count, _choice("--rank-by", rank_by, RANKINGS) or "cost"
    )
    if plot is not None:
        from shipyard.cli._plot import comparison_chart

        comparison_chart(rows, plot, title=_title(work, workload))
    if json_out:
        typer.echo(
            json.dumps(
                {"workload": workload, "rank_by": rank_by, "rows": [r.to_dict() for r in rows]}, indent=2
            )
        )
        return
    _print_comparison(rows, workload, rank_by, _title(work, workload))
    if plot is not None:
        console.print(f"chart written to {plot}")


@sub_app.command("catalog")
def catalog_(hardware: HardwareFile = None, json_out: JsonOpt = False) -> None:
    """The accelerator catalog (built-in rows, this host's CPU, your hardware file)."""
    rows = _catalog(hardware)
    if json_out:
        typer.echo(json.dumps([spec.model_dump() for spec in rows.values()], indent=2))
        return
    table(
        None,
        ["key", "name", "bf16 TFLOPS", "fp8", "memory GiB", "GB/s", "link", "TDP W", "$/h"],
        [
            (
                s.key,
                s.name,
                s.bf16_tflops,
                s.tflops.fp8,
                s.memory_gib,
                s.memory_bandwidth_gb_per_s,
                f"{s.interconnect.link} {s.interconnect.gb_per_s:g}" if s.interconnect.gb_per_s else "none",
                s.tdp_w,
                s.hourly_usd,
            )
            for s in rows.values()
        ],
    )


def register(app: typer.Typer) -> None:
    app.add_typer(sub_app, name="plan")


def _choice(flag: str, value: str | None, choices: tuple[str, ...]) -> str | None:
    if value is not None and value not in choices:
        raise InvalidSpec(
            f"{flag} {value!r} is not one of {', '.join(choices)}", hint=f"use {flag} {choices[0]}"
        )
    return value


def _training_workload(
    kind: str,
    params: float,
    layers: int | None,
    hidden: int | None,
    heads: int | None,
    kv_heads: int | None,
    vocab: int | None,
    seq_len: int,
    global_batch_tokens: float,
    tokens: float | None,
    precision: str,
    optimizer: str,
    lora_rank: int,
    flash_attention: bool,
) -> TrainingWorkload:
    _choice("--workload", kind, ("pretrain", "finetune", "lora", "qlora"))
    _choice("--precision", precision, ("bf16", "fp16", "fp8", "fp32"))
    _choice("--optimizer", optimizer, ("adamw", "adam8bit", "sgd"))
    shape = model_shape(params, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=vocab)
    return TrainingWorkload(
        model=shape,
        kind=kind,  # type: ignore[arg-type]
        seq_len=seq_len,
        global_batch_tokens=int(global_batch_tokens),
        tokens=tokens,
        precision=precision,  # type: ignore[arg-type]
        optimizer=optimizer,  # type: ignore[arg-type]
        lora_rank=lora_rank,
        flash_attention=flash_attention,
    )


def _inference_workload(
    params: float,
    layers: int | None,
    hidden: int | None,
    heads: int | None,
    kv_heads: int | None,
    vocab: int | None,
    batch: int,
    context: int,
    precision: str,
) -> InferenceWorkload:
    _choice("--precision", precision, ("fp16", "bf16", "int8", "int4"))
    shape = model_shape(params, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=vocab)
    return InferenceWorkload(model=shape, batch=batch, context=context, precision=precision)  # type: ignore[arg-type]


def _title(work: TrainingWorkload | InferenceWorkload, workload: str) -> str:
    size = f"{work.model.params / 1e9:.3g}B"
    if isinstance(work, InferenceWorkload):
        return f"{size} inference, {work.precision}, batch {work.batch}, context {work.context}"
    return f"{size} {workload}, {work.precision}, {work.budget_tokens:.3g} tokens"


def _fits(fits: bool, reason: str | None) -> str:
    return "[green]yes[/]" if fits else f"[red]no[/]: {reason}"


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:.3g}" if abs(value) >= 1e7 else fmt(float(value))
    return f"{text} {unit}".rstrip()


def _section(title: str, pairs: list[tuple[str, str]]) -> None:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for name, value in pairs:
        grid.add_row(name, value)
    console.print(f"[bold underline]{title}[/]")
    console.print(grid)


def _memory_pairs(memory: dict[str, float]) -> list[tuple[str, str]]:
    parts = ("weights", "gradients", "optimizer", "activations", "kv_cache", "buffers", "reserve")
    pairs = [(p.replace("_", " "), _number(memory[f"{p}_gib"], "GiB")) for p in parts if memory[f"{p}_gib"]]
    return [
        *pairs,
        ("total", _number(memory["total_gib"], "GiB")),
        ("usable", _number(memory["usable_gib"], "GiB")),
    ]


def _print_assumptions(assumptions: list[str]) -> None:
    console.print("[bold underline]assumptions[/]")
    for line in assumptions:
        console.print(f"  - {line}")


def _print_training(plan: TrainingPlan) -> None:
    d = plan.to_dict()
    p = d["parallelism"]
    step = d["step"]
    chosen = "searched: the fastest that fits" if p["searched"] else "as given"
    console.print(
        f"[bold]{d['model']['params'] / 1e9:.3g}B {d['workload']}[/] on {d['count']} x {d['accelerator']}: "
        f"fits {_fits(d['fits'], d['reason'])}"
    )
    _section(
        f"layout ({chosen})",
        [
            ("tp x pp x dp", f"{p['tp']} x {p['pp']} x {p['dp']}"),
            ("zero", str(p["zero"])),
            ("recompute", p["recompute"]),
            ("micro-batch", f"{p['micro_batch']} sequences"),
        ],
    )
    _section("memory per device", _memory_pairs(d["memory"]))
    _section(
        "time",
        [
            ("step", _number(d["step_time_s"], "s")),
            ("  compute", _number(step["compute_s"], "s")),
            ("  tensor parallel", _number(step["tensor_parallel_s"], "s")),
            ("  pipeline bubble", _number(step["pipeline_bubble_s"], "s")),
            ("  data parallel (exposed)", _number(step["data_parallel_exposed_s"], "s")),
            ("  optimizer", _number(step["optimizer_s"], "s")),
            (
                "tokens/s",
                f"{_number(d['tokens_per_s'])} ({_number(d['tokens_per_s_per_device'])} per device)",
            ),
            ("TFLOPS per device", f"{_number(d['tflops_per_device'])} (MFU {d['mfu']:.1%})"),
            ("tokens", _number(d["tokens"]) + (" (assumed)" if d["tokens_assumed"] else "")),
            (
                "wall time",
                f"{_number(d['wall_time_h'], 'h')} ({d['wall_time_h'] / 24:.3g} days, "
                f"goodput {d['goodput']:.1%})",
            ),
            ("GPU-hours", _number(d["gpu_hours"])),
            (
                "cost",
                _number(d["cost_usd"], "$") + (f" at ${d['price_usd_per_h']:.3g}/h" if d["cost_usd"] else ""),
            ),
            ("energy", _number(d["energy_kwh"], "kWh")),
        ],
    )
    _print_assumptions(d["assumptions"])


def _print_inference(plan: InferencePlan) -> None:
    d = plan.to_dict()
    console.print(
        f"[bold]{d['model']['params'] / 1e9:.3g}B inference[/] ({d['model']['precision']}) on {d['count']} x "
        f"{d['accelerator']} with tp={d['parallelism']['tp']}: fits {_fits(d['fits'], d['reason'])}"
    )
    _section("memory per device", _memory_pairs(d["memory"]))
    _section(
        "speed",
        [
            ("prefill", _number(d["prefill_tokens_per_s"], "tokens/s")),
            ("decode", f"{_number(d['decode_tokens_per_s'], 'tokens/s')} (bound by {d['decode_bound']})"),
            ("decode per sequence", _number(d["decode_tokens_per_s_per_sequence"], "tokens/s")),
            ("cost per 1M tokens", _number(d["cost_usd_per_million_tokens"], "$")),
            ("energy per 1M tokens", _number(d["energy_kwh_per_million_tokens"], "kWh")),
        ],
    )
    _print_assumptions(d["assumptions"])


def _metric(row: Comparison, name: str) -> float | None:
    return {"time": row.time_h, "cost": row.cost_usd, "energy": row.energy_kwh}[name]


def _print_comparison(rows: list[Comparison], workload: str, rank_by: str, title: str) -> None:
    inference = workload == "infer"
    time_label = "h per 1M tokens" if inference else "wall h"
    cost_label = "$ per 1M tokens" if inference else "cost $"
    energy_label = "kWh per 1M" if inference else "energy kWh"
    best: dict[str, Comparison | None] = {}
    for name in RANKINGS:
        candidates = [(v, i) for i, r in enumerate(rows) if r.fits and (v := _metric(r, name)) is not None]
        best[name] = rows[min(candidates)[1]] if candidates else None

    def mark(row: Comparison, name: str, value: float | None) -> str:
        text = _number(value)
        return f"[bold green]{text}*[/]" if best[name] is row else text

    table(
        f"{title} — ranked by {rank_by} (* best)",
        ["#", "accelerator", "count", "fits", "GiB/device", "tokens/s", time_label, cost_label, energy_label],
        [
            (
                r.rank or "-",
                r.accelerator,
                r.count,
                _fits(r.fits, r.plan.not_fitting_reason()),
                round(r.plan.memory.total_gib, 1),
                _number(
                    r.plan.decode_tokens_per_s if isinstance(r.plan, InferencePlan) else r.plan.tokens_per_s
                ),
                mark(r, "time", r.time_h),
                mark(r, "cost", r.cost_usd),
                mark(r, "energy", r.energy_kwh),
            )
            for r in rows
        ],
    )
    if any(r.cost_usd is None for r in rows):
        console.print("cost '-': no price in the catalog; add price_usd_per_h in a --hardware file")
