"""How long the host takes to queue one training step on a GPU, against how long the GPU takes to run
it: the planner's host term for GPUs is fitted on these figures.

    python benchmarks/host_dispatch.py [--presets llama-125m,llama-1b] [--micros 1,4,16]
        [--seq-len 1024] [--vocab 4096] [--no-compile] [--json]

For each model and micro-batch, one step (forward, backward, fused AdamW, loss summed on the
device, no host synchronization: what a job's step does) is timed three ways:

- ``step_s``: wall time per step, many steps back to back;
- ``issue_s``: the host's time to queue one step while the GPU is still busy with a long sleep
  kernel queued before it, so the host never waits for the device: the host's own cost;
- ``gpu_s``: the GPU's time for one step, from CUDA events around a step queued behind a sleep
  (the kernels run back to back, the host never starves them).

A step takes about max(issue_s, gpu_s) when the host keeps ahead; the GPU idles for the difference
when the host is slower. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from shipyard.schemas.presets import PRESETS
from shipyard.training.model import Transformer
from shipyard.training.parallelize import blocks

SLEEP_CYCLES = 2_000_000_000
"""About a second at the H200's clock: longer than queuing any step measured here."""


def measure(preset: str, micro: int, args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda")
    torch.manual_seed(0)
    arch = PRESETS[preset].with_vocab(args.vocab)
    model = Transformer(arch).to(device)
    if args.compile:
        # Each shape compiled for itself, as a job's fixed micro-batch is, and never a fallback to
        # eager after many shapes.
        torch._dynamo.config.automatic_dynamic_shapes = False
        torch._dynamo.config.cache_size_limit = 64
        for block in blocks(model):
            block.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    batch = torch.randint(0, args.vocab, (micro, args.seq_len + 1), device=device)
    total = torch.zeros((), device=device)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        total.add_(loss.detach())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - began) / args.steps

    issue, gpu, sleep = [], [], []
    for _ in range(args.repeats):
        slept, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        slept.record()
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        began = time.perf_counter()
        step()
        issue.append(time.perf_counter() - began)
        end.record()
        torch.cuda.synchronize()
        sleep.append(slept.elapsed_time(start) / 1e3)
        gpu.append(start.elapsed_time(end) / 1e3)
    return {
        "preset": preset,
        "layers": arch.n_layers,
        "dim": arch.dim,
        "micro": micro,
        "seq_len": args.seq_len,
        "compile": args.compile,
        "step_s": step_s,
        "issue_s": min(issue),
        "gpu_s": min(gpu),
        # The host waited on the device after all (a full launch queue, a synchronizing call): its
        # issue time is then not its own.
        "host_waited": max(issue) > 0.8 * min(sleep),
        "tokens_per_s": micro * args.seq_len / step_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presets", default="llama-125m,llama-1b")
    parser.add_argument("--micros", default="1,4,16")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.exit(1, "host_dispatch.py needs a CUDA GPU: run it on a GPU node (benchmarks/gpu_node.sh)\n")
    rows = []
    for preset in args.presets.split(","):
        for micro in (int(m) for m in args.micros.split(",")):
            row = measure(preset, micro, args)
            torch.cuda.empty_cache()
            rows.append(row)
            if not args.json:
                print(
                    f"{preset:<12} micro {micro:>3}  step {row['step_s'] * 1e3:7.2f} ms  "
                    f"host {row['issue_s'] * 1e3:7.2f} ms  GPU {row['gpu_s'] * 1e3:7.2f} ms  "
                    f"{row['tokens_per_s']:>10,.0f} tokens/s"
                    + ("  (host waited)" if row["host_waited"] else ""),
                    flush=True,
                )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
