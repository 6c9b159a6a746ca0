"""Checkpoint writes: one ``torch.save`` of the whole state (what a hand-written loop does, and
what Shipyard did before) vs Shipyard's sharded checkpoint, written in the foreground and in the
background, on the same model and optimizer state.

    .venv/bin/python benchmarks/checkpoint_write.py [--preset llama-125m] [--ranks 2] [--rounds 3]
        [--device cpu|cuda] [--json]

With ``--ranks N`` the model is sharded over N processes (FSDP2, torchrun, gloo on the CPU, NCCL on
GPUs): every rank writes its own shards at once, where ``torch.save`` has rank 0 gather and write
everything. Each round writes a fresh folder, fsynced, and reports the state's size over the time
it took; for the background write, also how long training was held (the copy to host memory).
Ratios are Shipyard over ``torch.save``: above 1 is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from shipyard.schemas.presets import PRESETS
from shipyard.schemas.training_spec import ActivationCheckpointingSection, ParallelismSection


def build(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """A model and its AdamW state (one step taken), spread over the ranks."""
    from shipyard.training import parallel
    from shipyard.training.model import Transformer
    from shipyard.training.parallelize import parallelize

    world = int(os.environ.get("WORLD_SIZE", "1"))
    layout = ParallelismSection(tp=1, dp_shard=world, dp_replicate=1)
    d = parallel.init(args.device, layout)
    torch.manual_seed(0)
    model = Transformer(PRESETS[args.preset]).to(d.device)
    none = ActivationCheckpointingSection(mode="none")
    spread = parallelize(model, d, checkpointing=none, compile_blocks=False, bf16=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=not spread.fsdp or None)
    tokens = torch.randint(0, 1000, (1, 64), device=d.device)
    model(tokens, tokens).backward()
    optimizer.step()
    return d, model, optimizer


def state_bytes(model: Any, optimizer: Any) -> int:
    """What this rank holds: its shards of the weights and of Adam's moments."""
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    params = sum(local(p).numel() * p.element_size() for p in model.parameters())
    moments = sum(
        local(t).numel() * t.element_size()
        for s in optimizer.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor)
    )
    return params + moments


def whole_torch_save(d: Any, model: Any, optimizer: Any, folder: Path) -> float:
    """Gather everything on rank 0 and ``torch.save`` it: the seconds until it is on disk."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from shipyard.training import parallel

    parallel.barrier(d)
    start = time.perf_counter()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    if d.is_main:
        folder.mkdir(parents=True)
        with open(folder / "state.pt", "wb") as f:
            torch.save({"model": model_state, "optimizer": optim_state}, f)
            f.flush()
            os.fsync(f.fileno())
    parallel.barrier(d)
    return time.perf_counter() - start


def sharded(saver: Any, step: int, model: Any, optimizer: Any, background: bool) -> tuple[float, float]:
    """Shipyard's checkpointer (one per run, as the runtime keeps it): (seconds training is held,
    seconds until the checkpoint is committed)."""
    from shipyard.training import parallel

    parallel.barrier(saver.d)
    start = time.perf_counter()
    saver.save(step, model, optimizer, {}, {"format": "dcp"}, background=background)
    held = time.perf_counter() - start
    saver.wait()
    parallel.barrier(saver.d)
    return held, time.perf_counter() - start


def measure(args: argparse.Namespace) -> dict[str, Any]:
    d, model, optimizer = build(args)
    size = state_bytes(model, optimizer)
    totals = [0] * d.world_size
    if d.enabled:
        import torch.distributed as dist

        dist.all_gather_object(totals, size)
    size = sum(totals) if d.enabled else size
    rounds: dict[str, list[float]] = {
        "torch.save": [],
        "sharded": [],
        "background held": [],
        "background": [],
    }
    scratch = Path(args.scratch)
    from shipyard.training.checkpoint import Checkpointer

    foreground = Checkpointer(scratch / "sharded", d, keep=1)
    background = Checkpointer(scratch / "background", d, keep=1)

    def write(way: str, round_: int) -> None:
        if way == "torch.save":
            rounds[way].append(whole_torch_save(d, model, optimizer, scratch / f"whole-{round_}"))
        elif way == "sharded":
            rounds[way].append(sharded(foreground, round_, model, optimizer, False)[1])
        else:
            held, done = sharded(background, round_, model, optimizer, True)
            rounds["background held"].append(held)
            rounds["background"].append(done)

    order = ["torch.save", "sharded", "background"]
    for round_ in range(args.rounds):
        # Each round starts with the next way: a write pays for the one before it still flushing.
        for way in order[round_ % 3 :] + order[: round_ % 3]:
            write(way, round_)
    background.close()
    median = {k: statistics.median(v) for k, v in rounds.items()}
    return {
        "state_gib": size / 2**30,
        "ranks": d.world_size,
        "seconds": median,
        "gb_per_s": {k: size / 1e9 / v for k, v in median.items() if k != "background held"},
        "sharded_vs_torch_save": median["torch.save"] / median["sharded"],
        "training_held_vs_torch_save": median["torch.save"] / median["background held"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="llama-125m", choices=list(PRESETS))
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--scratch", help=argparse.SUPPRESS)  # a rank of a --ranks run
    args = parser.parse_args()
    if args.scratch:
        figures = measure(args)
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps(figures))
        os._exit(0)  # skip the process group's teardown, as the runtime does
    with tempfile.TemporaryDirectory(dir=os.environ.get("SHIPYARD_BENCH_DIR")) as scratch:
        argv = [a for a in sys.argv[1:] if a != "--json"]
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={args.ranks}",
        ]
        done = subprocess.run(
            [*launcher, __file__, *argv, "--scratch", scratch],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // args.ranks))},
        )
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps({"config": vars(args) | {"scratch": None}, **figures}, indent=2))
        return
    print(
        f"{args.preset}: {figures['state_gib']:.2f} GiB of weights and Adam state, "
        f"{args.ranks} rank(s), {args.device}"
    )
    for way, seconds in figures["seconds"].items():
        rate = figures["gb_per_s"].get(way)
        print(f"  {way:<18} {seconds:7.2f} s" + (f"  {rate:6.2f} GB/s" if rate else ""))
    print(f"  sharded / torch.save (speed)          {figures['sharded_vs_torch_save']:.2f}x")
    print(f"  training held: torch.save / background {figures['training_held_vs_torch_save']:.2f}x")


if __name__ == "__main__":
    main()
