"""Where a training step's time goes on a GPU: the device time of its kernels by kind (matrix
multiplies, fused attention, the other memory-bound kernels, the optimizer) and the time the GPU
sat idle waiting for the host, beside the planner's own split of the same step.

    .venv/bin/python benchmarks/step_profile.py [--preset llama-125m] [--micro 16] [--seq-len 1024]
        [--vocab 4096] [--no-compile] [--json]

The model is Shipyard's, built and compiled as a job builds it on one GPU (each block compiled, bf16
autocast, fused AdamW); the step is one micro-batch forward and backward and the optimizer step.
Kernels are sorted into kinds by name, which is how cuBLAS, FlashAttention and Inductor name them.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from typing import Any

import torch

from shipyard.hardware.catalog import lookup
from shipyard.planner.shapes import shape_of
from shipyard.planner.training import plan_training
from shipyard.planner.workload import LayoutRequest, TrainingWorkload, cluster_of
from shipyard.schemas.presets import PRESETS
from shipyard.training.model import Transformer
from shipyard.training.parallelize import blocks

KINDS = (  # first match wins
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_", "sm80_", "s16816", "wgmma")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("fused (Inductor)", ("triton",)),
)


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    return next((kind for kind, marks in KINDS if any(m in name for m in marks)), "other element-wise")


def profile(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = Transformer(PRESETS[args.preset].with_vocab(args.vocab)).to(device)
    if args.compile:
        for block in blocks(model):
            block.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    on_device = torch.randint(0, args.vocab, (args.micro, args.seq_len + 1), device=device)
    on_host = on_device.cpu()

    def step(
        accum: int = 1, copy: bool = False, timer: bool = False, clip: bool = False, read: bool = False
    ) -> None:
        """One optimizer step of ``accum`` micro-batches, with what the runtime adds to it: batches
        pinned and copied from host memory, a synchronize before the last backward (its compute
        timer), the gradient norm and the loss read on the host."""
        total = torch.zeros((), device=device)
        for micro in range(accum):
            batch = on_host.pin_memory().to(device, non_blocking=True) if copy else on_device
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(batch[:, :-1], batch[:, 1:]) / accum
            if timer and micro == accum - 1:
                torch.cuda.synchronize()
            loss.backward()
            total += loss.detach()
        if clip:
            float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if read:
            float(total)

    def tokens_per_s(accum: int = 1, **runtime: bool) -> float:
        for _ in range(args.warmup):
            step(accum, **runtime)
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(args.steps):
            step(accum, **runtime)
        torch.cuda.synchronize()
        return accum * args.micro * args.seq_len * args.steps / (time.perf_counter() - began)

    variants = {"one micro-batch a step": tokens_per_s()}
    step_s = args.micro * args.seq_len / variants["one micro-batch a step"]
    runtime: dict[str, bool] = {}
    accum = max(1, args.accumulate)
    for name, added in (
        (f"{accum} micro-batches a step", ""),
        ("+ batches pinned and copied from the host", "copy"),
        ("+ synchronize before the last backward", "timer"),
        ("+ gradient norm read on the host", "clip"),
        ("+ loss read on the host", "read"),
    ):
        if added:
            runtime[added] = True
        variants[name] = tokens_per_s(accum, **runtime)

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    busy: dict[str, float] = defaultdict(float)
    top: dict[str, float] = defaultdict(float)
    for event in prof.events():
        # Annotations (``Optimizer.step#AdamW.step``) span kernels counted on their own.
        if event.device_type.name != "CUDA" or getattr(event, "is_user_annotation", False):
            continue
        seconds = event.time_range.elapsed_us() / 1e6 / args.steps
        busy[kind_of(event.name)] += seconds
        top[event.name[:90]] += seconds
    kernels_s = sum(busy.values())
    return {
        "step_s": step_s,
        "tokens_per_s": args.micro * args.seq_len / step_s,
        "kernel_s_by_kind": dict(busy),
        "share_by_kind": {kind: s / step_s for kind, s in busy.items()},
        "gpu_idle_share": max(0.0, 1 - kernels_s / step_s),
        "top_kernels": dict(sorted(top.items(), key=lambda kv: -kv[1])[:15]),
        "tokens_per_s_by_variant": variants,
        "planned": planned(args),
    }


def planned(args: argparse.Namespace) -> dict[str, float]:
    """The planner's tokens/s for the same step on this GPU's catalog type."""
    from shipyard.hardware import discover

    gpu = next(d for d in discover() if d.accelerator_type != "cpu")
    workload = TrainingWorkload(
        model=shape_of(PRESETS[args.preset].with_vocab(args.vocab)),
        seq_len=args.seq_len,
        global_batch_tokens=args.micro * args.seq_len,
        precision="bf16",
    )
    layout = LayoutRequest(tp=1, pp=1, micro_batch=args.micro, recompute="none")
    plan = plan_training(workload, cluster_of(lookup(gpu.accelerator_type), 1), layout, measure="steady")
    return {"tokens_per_s": plan.tokens_per_s, "mfu": plan.mfu, "step_s": plan.step.total_s}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="llama-125m", choices=sorted(PRESETS))
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--accumulate", type=int, default=4, help="micro-batches a step in the variants")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = profile(args)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    p = figures["planned"]
    print(f"{args.preset}, {args.micro}x{args.seq_len} tokens a step, compile {args.compile}")
    print(
        f"  measured {figures['tokens_per_s']:,.0f} tokens/s ({figures['step_s'] * 1e3:.1f} ms a step); "
        f"planned {p['tokens_per_s']:,.0f} ({p['step_s'] * 1e3:.1f} ms)"
    )
    for kind, share in sorted(figures["share_by_kind"].items(), key=lambda kv: -kv[1]):
        print(f"  {kind:<20} {share:6.1%}")
    print(f"  {'GPU idle':<20} {figures['gpu_idle_share']:6.1%}")
    for name, value in figures["tokens_per_s_by_variant"].items():
        print(f"  {name:<44} {value:>10,.0f} tokens/s")


if __name__ == "__main__":
    main()
