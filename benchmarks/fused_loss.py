"""The loss over a large vocabulary: ``F.cross_entropy`` over the whole logits (what a model's
forward usually does, ``transformers`` included) vs Shipyard's chunked linear cross-entropy,
which never holds more than one chunk of logits.

    .venv/bin/python benchmarks/fused_loss.py [--tokens 2048] [--hidden 512] [--vocab 128256]
        [--rounds 3] [--device cpu|cuda] [--precision bf16|fp32] [--json]

Each way runs forward and backward in a fresh child process, ``--rounds`` times; reported are the
median seconds and the peak memory above what the inputs take (CUDA: the allocator's peak; CPU:
the process's peak resident set), with the ratios Shipyard over plain.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F

from shipyard.training.loss import linear_cross_entropy


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def plain(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy((hidden @ weight.t()).float(), targets)


WAYS = {"F.cross_entropy": plain, "Shipyard chunked": linear_cross_entropy}


def one_way(args: argparse.Namespace) -> dict[str, float]:
    device = torch.device(args.device)
    generator = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, device=device, generator=generator).requires_grad_()
    weight = (
        torch.randn(args.vocab, args.hidden, device=device, generator=generator) * 0.02
    ).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,), device=device, generator=generator)
    dtype = torch.bfloat16 if args.precision == "bf16" else None
    loss_of = WAYS[args.way]
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = peak_bytes(device)
    times = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_of(hidden, weight, targets)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        hidden.grad = weight.grad = None
    return {"seconds": statistics.median(times), "peak_gib": (peak_bytes(device) - base) / 2**30}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--way", choices=list(WAYS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:
        print(json.dumps(one_way(args)))
        return
    argv = [a for a in sys.argv[1:] if a != "--json"]
    figures: dict[str, Any] = {}
    for way in WAYS:
        done = subprocess.run([sys.executable, __file__, *argv, "--way", way], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{way} failed:\n{done.stderr[-3000:]}")
        figures[way] = json.loads(done.stdout.strip().splitlines()[-1])
    ours, theirs = figures["Shipyard chunked"], figures["F.cross_entropy"]
    summary = {
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "way")},
        "ways": figures,
        "shipyard_vs_plain_speed": theirs["seconds"] / ours["seconds"],
        "shipyard_vs_plain_memory": ours["peak_gib"] / max(theirs["peak_gib"], 1e-9),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(
        f"{args.tokens} tokens x {args.hidden} hidden -> {args.vocab} vocabulary, {args.precision}, "
        f"{args.device}, forward + backward, median of {args.rounds}"
    )
    for way, f in figures.items():
        print(f"  {way:<18} {f['seconds']:7.3f} s   peak {f['peak_gib']:6.2f} GiB")
    print(f"  speed  Shipyard / plain   {summary['shipyard_vs_plain_speed']:.2f}x")
    print(f"  memory Shipyard / plain   {summary['shipyard_vs_plain_memory']:.2f}x")


if __name__ == "__main__":
    main()
