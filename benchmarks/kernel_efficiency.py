"""What share of its peak one device reaches on the kernels a transformer layer is made of: the
matrix multiplies of each projection at each width and token count, fused attention, and the
memory-bound element-wise work (norms, activations, residual adds, the optimizer step). The
planner prices a step from these shares; this measures them on the device in front of it.

    .venv/bin/python benchmarks/kernel_efficiency.py [--device cpu|cuda] [--precision bf16|fp32]
        [--hiddens 768,2048,4096] [--tokens 1024,16384] [--grid 256,512,1024,2048,4096] [--json]

Peaks are what ``shipyard devices`` reports (the catalog's dense peak for a GPU, the derived one
for a CPU). Each figure is the median of ``--reps`` timed runs after warm-ups (CUDA events on a
GPU). A projection of width h to n over t tokens is a (t x h) @ (h x n) product, 2*t*h*n FLOPs;
its backward is two more products of the same size, so the forward's share stands for all three.
``--grid`` also times every product over a grid of sizes and fits the two figures that explain
most of a device's table: its large-product efficiency and a fixed cost a product.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from shipyard.hardware.discovery import Device, discover

GPU_BURST = 20


def timed(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median seconds of one call, after warm-ups. On a GPU each sample times a burst of calls
    queued back to back, as a training step queues them, so a short kernel is not charged the
    host's launch latency that a running step hides."""
    for _ in range(2):
        fn()
    samples = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            for _ in range(GPU_BURST):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1000 / GPU_BURST)
        else:
            began = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def projections(hidden: int, vocab: int) -> dict[str, tuple[int, int]]:
    """(in, out) widths of a Llama block's products (no grouped-query attention) and its head."""
    ffn = 256 * ((8 * hidden // 3 + 255) // 256)
    return {
        "qkv": (hidden, 3 * hidden),
        "out": (hidden, hidden),
        "gate+up": (hidden, 2 * ffn),
        "down": (ffn, hidden),
        "lm-head": (hidden, vocab),
    }


def gemm_rows(
    args: argparse.Namespace, device: torch.device, dtype: torch.dtype, peak: float
) -> list[dict[str, Any]]:
    rows = []
    for hidden in args.hiddens:
        for tokens in args.tokens:
            for name, (k, n) in projections(hidden, args.vocab).items():
                a = torch.randn(tokens, k, device=device, dtype=dtype)
                b = torch.randn(n, k, device=device, dtype=dtype)
                seconds = timed(lambda a=a, b=b: F.linear(a, b), device, args.reps)
                tflops = 2 * tokens * k * n / seconds / 1e12
                rows.append(
                    {
                        "hidden": hidden,
                        "tokens": tokens,
                        "gemm": name,
                        "k": k,
                        "n": n,
                        "tflops": tflops,
                        "share_of_peak": tflops / peak,
                    }
                )
                del a, b
    return rows


def grid_rows(
    sizes: list[int], device: torch.device, dtype: torch.dtype, peak: float, reps: int
) -> list[dict[str, Any]]:
    """Every (m x k) @ (k x n) product with m, n and k from ``sizes``: the grid OpenXLA's GPU cost
    model tabulates for each device (m, n, k from 256 to 4096), so the two can be set side by side."""
    rows = []
    for m, n, k in itertools.product(sizes, repeat=3):
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        seconds = timed(lambda a=a, b=b: a @ b, device, reps)
        rows.append(
            {"m": m, "n": n, "k": k, "seconds": seconds, "share_of_peak": 2 * m * n * k / seconds / peak}
        )
        del a, b
    return rows


def fit_fixed_cost(rows: list[dict[str, Any]], peak: float) -> dict[str, float]:
    """The large-product efficiency e and the fixed cost t0 of ``seconds = FLOPs / (peak * e) + t0``,
    by least squares on the relative error (linear in 1/e and t0, so a 2 x 2 solve)."""
    # Each row asks (flops / t) * slope + (1 / t) * t0 = 1, slope = 1 / (peak * e).
    xs = [(2 * r["m"] * r["n"] * r["k"] / r["seconds"], 1 / r["seconds"]) for r in rows]
    sxx = sum(x * x for x, _ in xs)
    sxy = sum(x * y for x, y in xs)
    syy = sum(y * y for _, y in xs)
    sx, sy = sum(x for x, _ in xs), sum(y for _, y in xs)
    det = sxx * syy - sxy * sxy
    slope, t0 = (sx * syy - sy * sxy) / det, (sxx * sy - sxy * sx) / det
    errors = sorted(abs(x * slope + y * t0 - 1) for x, y in xs)
    return {
        "large_product_efficiency": 1 / (peak * slope),
        "fixed_cost_us": t0 * 1e6,
        "mdape": statistics.median(errors),
        "worst": errors[-1],
    }


def attention_rows(
    args: argparse.Namespace, device: torch.device, dtype: torch.dtype, peak: float
) -> list[dict[str, Any]]:
    rows = []
    for head_dim in (64, 128):
        for seq in args.seq_lens:
            heads = max(1, 2048 // head_dim)
            batch = max(1, max(args.tokens) // seq)
            q, k, v = (
                torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
                for _ in range(3)
            )

            def forward_backward(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v) -> None:
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

            seconds = timed(forward_backward, device, args.reps)
            # Causal: half of the 4*s^2*d forward FLOPs per head are computed; backward is 2.5x.
            flops = 3.5 * 2 * batch * heads * seq * seq * head_dim
            tflops = flops / seconds / 1e12
            rows.append(
                {
                    "head_dim": head_dim,
                    "seq_len": seq,
                    "batch": batch,
                    "heads": heads,
                    "tflops": tflops,
                    "share_of_peak": tflops / peak,
                }
            )
    return rows


def elementwise_rows(
    args: argparse.Namespace, device: torch.device, dtype: torch.dtype, bandwidth: float
) -> list[dict[str, Any]]:
    """Bytes moved per second by memory-bound kernels, against the catalog's memory bandwidth. The
    bytes counted are the least a fused kernel must move (each input read once, the output written
    once), so an unfused one shows as a lower share."""
    rows = []
    tokens, hidden = max(args.tokens), max(args.hiddens)
    x = torch.randn(tokens, hidden, device=device, dtype=dtype)
    y = torch.randn(tokens, hidden, device=device, dtype=dtype)
    weight = torch.ones(hidden, device=device, dtype=dtype)
    size = x.numel() * x.element_size()
    params = torch.randn(args.optimizer_params, device=device)
    optimizer = torch.optim.AdamW([params], fused=device.type == "cuda")
    params.grad = torch.randn_like(params)
    kernels: dict[str, tuple[Callable[[], object], int]] = {
        "residual add": (lambda: x + y, 3 * size),
        "SwiGLU (silu(x) * y)": (lambda: F.silu(x) * y, 3 * size),
        "RMSNorm": (lambda: F.rms_norm(x, (hidden,), weight), 2 * size),
        # AdamW reads parameter, gradient and two moments and writes three of them back (fp32).
        "AdamW step": (optimizer.step, 7 * params.numel() * 4),
    }
    for name, (fn, moved) in kernels.items():
        seconds = timed(fn, device, args.reps)
        rows.append(
            {
                "kernel": name,
                "gb_per_s": moved / seconds / 1e9,
                "share_of_bandwidth": moved / seconds / bandwidth,
            }
        )
    return rows


def local_device(kind: str) -> Device:
    devices = discover()
    wanted = [d for d in devices if (d.accelerator_type == "cpu") == (kind == "cpu")]
    if not wanted:
        raise SystemExit(f"no {kind} device found on this machine")
    return wanted[0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ints = lambda text: [int(v) for v in text.split(",")]  # noqa: E731
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--precision", choices=["bf16", "fp32"], default=None, help="bf16 on a GPU, fp32 on a CPU"
    )
    parser.add_argument("--hiddens", type=ints, default=[768, 2048, 4096])
    parser.add_argument("--tokens", type=ints, default=[1024, 16384])
    parser.add_argument("--seq-lens", type=ints, default=[1024, 4096])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--optimizer-params", type=int, default=50_000_000)
    parser.add_argument(
        "--grid",
        type=ints,
        default=[],
        help="also time every product with m, n, k from these sizes and fit its fixed cost",
    )
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    precision = args.precision or ("bf16" if args.device == "cuda" else "fp32")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    device = torch.device(args.device)
    found = local_device(args.device)
    from shipyard.hardware.catalog import lookup

    peak = (found.peak_bf16_tflops if precision == "bf16" else found.peak_fp32_tflops) * 1e12
    bandwidth = lookup(found.accelerator_type).memory_bandwidth_gb_per_s * 1e9
    torch.manual_seed(0)
    figures = {
        "device": {
            "type": found.accelerator_type,
            "name": found.name,
            "precision": precision,
            "peak_tflops": peak / 1e12,
            "memory_gb_per_s": bandwidth / 1e9,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "gemms": gemm_rows(args, device, dtype, peak / 1e12),
        "attention": attention_rows(args, device, dtype, peak / 1e12),
        "elementwise": elementwise_rows(args, device, dtype, bandwidth),
    }
    if args.grid:
        grid = grid_rows(args.grid, device, dtype, peak, args.reps)
        figures["grid"] = {"products": grid, "fit": fit_fixed_cost(grid, peak)}
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    d = figures["device"]
    print(f"{d['name']} ({d['type']}), {precision}, peak {d['peak_tflops']:.4g} TFLOP/s, ", end="")
    print(f"{d['memory_gb_per_s']:.0f} GB/s")
    print(f"{'hidden':>7} {'tokens':>7} {'gemm':<9} {'TFLOP/s':>9} {'of peak':>8}")
    for r in figures["gemms"]:
        print(
            f"{r['hidden']:>7} {r['tokens']:>7} {r['gemm']:<9} {r['tflops']:>9.2f} {r['share_of_peak']:>8.1%}"
        )
    print("fused attention, forward + backward, causal")
    for r in figures["attention"]:
        shape = f"head_dim {r['head_dim']:>3} seq {r['seq_len']:>5}"
        print(f"  {shape}  {r['tflops']:>8.2f} TFLOP/s  {r['share_of_peak']:.1%}")
    print("memory-bound kernels")
    for r in figures["elementwise"]:
        print(f"  {r['kernel']:<22} {r['gb_per_s']:>8.0f} GB/s  {r['share_of_bandwidth']:.1%}")
    if args.grid:
        fit = figures["grid"]["fit"]
        print(f"products over m, n, k in {args.grid}: seconds = FLOPs / (peak x e) + t0 with ", end="")
        print(f"e {fit['large_product_efficiency']:.3f}, t0 {fit['fixed_cost_us']:.1f} us ", end="")
        print(f"(median error {fit['mdape']:.1%}, worst {fit['worst']:.1%})")


if __name__ == "__main__":
    main()
