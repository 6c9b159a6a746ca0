"""``shipyard plan train|infer|compare|catalog|calibrate``: memory, time, cost and energy before
buying or booking, and planned against measured on this cluster."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from shipyard.cli._output import JsonOpt, console, print_json, table
from shipyard.cli._plan_output import plan_title, print_comparison, print_inference, print_training
from shipyard.errors import InvalidSpec
from shipyard.planner.advisor import RANKINGS
from shipyard.planner.inference import InferenceWorkload
from shipyard.planner.shapes import model_shape
from shipyard.planner.training import MEASURES
from shipyard.planner.workload import LayoutRequest, TrainingWorkload
from shipyard.services.estimates import planning
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
Fabric = Annotated[
    str | None,
    typer.Option(
        help="OVERSUBSCRIPTION:LEAF_NODES of the network above the nodes, e.g. 2:16 (2:1 above leaf "
        "switches of 16 nodes; default: non-blocking)."
    ),
]
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
    optimizer: Annotated[
        str, typer.Option(help="adamw, adamw-bf16 (its moments in bf16), adam8bit or sgd.")
    ] = "adamw",
    lora_rank: Annotated[int, typer.Option(help="LoRA/QLoRA adapter rank.")] = 16,
    flash_attention: Annotated[bool, typer.Option(help="Fused attention (scores never stored).")] = True,
    interconnect: Interconnect = None,
    network: Network = None,
    devices_per_node: DevicesPerNode = None,
    fabric: Fabric = None,
    hardware: HardwareFile = None,
    measure: Annotated[
        str,
        typer.Option(
            help="What wall time, GPU-hours and cost predict: run (a whole run, with its expected "
            "interruptions, checkpoint writes and evaluations) or steady (the training steps alone, "
            "as a benchmark measures them)."
        ),
    ] = "run",
    eval_every: Annotated[
        int, typer.Option(help="A whole run's steps between evaluations; 0 for none (Megatron-LM's default).")
    ] = 1000,
    eval_steps: Annotated[
        float, typer.Option(help="Global batches each evaluation runs forward (Megatron-LM's default).")
    ] = 100,
    checkpoint_every: Annotated[
        float | None,
        typer.Option(help="Hours between checkpoints (default: the interval that loses least, Young's)."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Memory per device, step time, tokens/s, MFU, wall time, GPU-hours, cost and energy of training."""
    work = _training_workload(
        workload, params, layers, hidden, heads, kv_heads, vocab, seq_len, global_batch_tokens, tokens,
        precision, optimizer, lora_rank, flash_attention,
    )  # fmt: skip
    work = dataclasses.replace(
        work, eval_every_steps=eval_every, eval_steps=eval_steps, checkpoint_every_h=checkpoint_every
    )
    request = LayoutRequest(
        tp=tp,
        pp=pp,
        zero=zero,
        recompute=_choice("--recompute", recompute, ("none", "selective", "full")),  # type: ignore[arg-type]
        micro_batch=micro_batch,
        interleave=interleave,
    )
    links = planning.Links(
        interconnect=interconnect, network=network, devices_per_node=devices_per_node, fabric=fabric
    )
    chosen = _choice("--measure", measure, MEASURES)
    plan = planning.train(_catalog(hardware), work, accelerator, count, request, links, chosen)  # type: ignore[arg-type]
    if json_out:
        print_json(plan.to_dict())
        return
    print_training(plan)


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
    print_inference(plan)


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
    fabric: Fabric = None,
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
        _catalog(hardware),
        work,
        keys,
        count,
        _choice("--rank-by", rank_by, RANKINGS) or "cost",
        fabric=fabric,
    )
    if plot is not None:
        from shipyard.cli._plot import comparison_chart

        comparison_chart(rows, plot, title=plan_title(work, workload))
    if json_out:
        typer.echo(
            json.dumps(
                {"workload": workload, "rank_by": rank_by, "rows": [r.to_dict() for r in rows]}, indent=2
            )
        )
        return
    print_comparison(rows, workload, rank_by, plan_title(work, workload))
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


@sub_app.command()
def calibrate(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the fit and keep the calibration in force.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Fit this cluster's compute efficiency per accelerator type from its finished attempts
    (measured against planned tokens/s), and plan later jobs with it. Shows the planner's error
    before and after; the held-out error (each shape predicted from the others) is the one to trust."""
    from shipyard.cli._contexts import command_context
    from shipyard.services.estimates import calibrate as calibration

    fits = calibration.calibrate(command_context(), save_fits=not dry_run)
    if json_out:
        print_json({"saved": bool(fits) and not dry_run, "fits": [dataclasses.asdict(f) for f in fits]})
        return
    if not fits:
        console.print(
            "nothing to fit yet: no attempt has ended with a measured throughput (each completed, "
            "cancelled or preempted attempt of three steps or more records one)"
        )
        return

    def percent(error: float | None) -> str:
        return "-" if error is None else f"{error:.0%}"

    table(
        None,
        ["accelerator", "shapes", "efficiency", "error before", "after", "held out"],
        [
            (
                f.accelerator_type,
                f.rows,
                f"x{f.efficiency:.3f}",
                percent(f.error_before),
                percent(f.error_after),
                percent(f.error_held_out),
            )
            for f in fits
        ],
    )
    console.print(
        "dry run: the calibration in force is unchanged"
        if dry_run
        else "saved: jobs submitted from now on are planned with these factors"
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
    _choice("--optimizer", optimizer, ("adamw", "adamw-bf16", "adam8bit", "sgd"))
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
