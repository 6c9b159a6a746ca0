"""Training throughput: a bare PyTorch loop vs Shipyard's runtime (through the local executor)
vs Hugging Face ``Trainer``, on the same model shape, batch, sequence length and step count.

    .venv/bin/python benchmarks/train_throughput.py [--steps 12] [--rounds 1] [--precision bf16]

Each way runs in a fresh child process (so none inherits another's warm allocator or threads), one
after the other in this one invocation, ``--rounds`` times, interleaved. A way's tokens/s is the
global batch divided by its median step time after two warm-up steps; the median over rounds is
reported with the ratios Shipyard/bare and Shipyard/Trainer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from shipyard.schemas.presets import PRESETS

WARMUP_STEPS = 2
VOCAB = 4096


def shape(args: argparse.Namespace) -> dict[str, Any]:
    world_tokens = args.micro * args.seq_len
    return {
        "preset": args.preset,
        "arch": PRESETS[args.preset].with_vocab(VOCAB),
        "accum": args.batch_tokens // world_tokens,
        "autocast": {"bf16": torch.bfloat16, "fp32": None}[args.precision],
    }


def steady_tokens_per_s(step_times: list[float], batch_tokens: int) -> float:
    return batch_tokens / statistics.median(step_times[WARMUP_STEPS:])


def bare_loop(args: argparse.Namespace) -> float:
    """The loop a researcher writes by hand: same model class, random tokens already in memory."""
    from shipyard.training.model import Transformer

    s = shape(args)
    torch.manual_seed(0)
    model = Transformer(s["arch"])
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True
    )
    data = torch.randint(0, VOCAB, (args.steps * s["accum"], args.micro, args.seq_len + 1))
    times = []
    for step in range(args.steps):
        start = time.perf_counter()
        for micro in range(s["accum"]):
            batch = data[step * s["accum"] + micro]
            with torch.autocast("cpu", dtype=s["autocast"], enabled=s["autocast"] is not None):
                loss = model(batch[:, :-1], batch[:, 1:]) / s["accum"]
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return steady_tokens_per_s(times, args.batch_tokens)


def shipyard_runtime(args: argparse.Namespace) -> float:
    """A real job: ``shipyard jobs submit --wait`` -> local agent -> executor -> runtime."""
    import yaml

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    spec = {
        "apiVersion": "shipyard/v1",
        "name": "bench",
        "model": {"preset": args.preset},
        "data": {
            "paths": [str(stdlib / d) for d in ("asyncio", "email", "json", "unittest")],
            "tokenizer": {"vocab_size": VOCAB},
        },
        "training": {
            "steps": args.steps,
            "global_batch_tokens": args.batch_tokens,
            "micro_batch_size": args.micro,
            "seq_len": args.seq_len,
            "precision": args.precision,
            "eval_batches": 1,
            "optimizer": {"lr": 3e-4},
        },
        "resources": {"accelerator": "cpu", "devices": 1},
    }
    with tempfile.TemporaryDirectory() as home:
        path = Path(home) / "bench.yaml"
        path.write_text(yaml.safe_dump(spec))
        env = {**os.environ, "SHIPYARD_HOME": home, "SHIPYARD_AGENT_IDLE_EXIT_S": "1"}
        shipyard = [sys.executable, "-m", "shipyard.cli.main"]
        job = json.loads(
            subprocess.run(
                [*shipyard, "jobs", "submit", str(path), "--wait", "--json"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        if job["state"] != "succeeded":
            raise RuntimeError(f"benchmark job {job['state']}: {job['message']}")
        lines = (Path(job["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        times = [r["step_time_s"] for r in map(json.loads, lines) if r["kind"] == "train"]
        time.sleep(1.5)  # let the agent go idle and exit before the next measurement
    return steady_tokens_per_s(times, args.batch_tokens)


def hf_trainer(args: argparse.Namespace) -> float:
    """``transformers.Trainer`` on a ``LlamaForCausalLM`` of the same shape."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from shipyard.training.hf import hf_config

    s = shape(args)
    arch = s["arch"]
    config = LlamaConfig(**hf_config(arch, eos_id=0))  # the shape Shipyard exports
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    tokens = torch.randint(0, VOCAB, (args.steps * s["accum"] * args.micro, args.seq_len))
    dataset = [{"input_ids": row, "labels": row} for row in tokens]
    times: list[float] = []

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *_args: Any, **_kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *_args: Any, **_kwargs: Any) -> None:
            times.append(time.perf_counter() - self.start)

    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=args.micro,
            gradient_accumulation_steps=s["accum"],
            learning_rate=3e-4,
            weight_decay=0.1,
            adam_beta2=0.95,
            max_grad_norm=1.0,
            bf16=args.precision == "bf16",
            use_cpu=True,
            save_strategy="no",
            report_to=[],
            logging_steps=10_000,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        Trainer(model=model, args=training_args, train_dataset=dataset, callbacks=[StepTimer()]).train()
    return steady_tokens_per_s(times, args.batch_tokens)


WAYS: dict[str, Callable[[argparse.Namespace], float]] = {
    "bare PyTorch loop": bare_loop,
    "Shipyard runtime": shipyard_runtime,
    "HF Trainer": hf_trainer,
}


def run_in_child(name: str, argv: list[str]) -> float:
    done = subprocess.run(
        [sys.executable, __file__, *argv, "--way", name], check=True, capture_output=True, text=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="llama-12m")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-tokens", type=int, default=8192)
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--way", choices=list(WAYS), help=argparse.SUPPRESS)  # one way, in a child
    args = parser.parse_args()
    if args.way:
        print(WAYS[args.way](args))
        return
    argv = [a for a in sys.argv[1:] if a != "--json"]
    results: dict[str, list[float]] = {name: [] for name in WAYS}
    names = list(WAYS)
    for round_ in range(args.rounds):
        # Rotate which way goes first: on a shared VM, speed drifts within a round.
        for name in names[round_ % 3 :] + names[: round_ % 3]:
            results[name].append(run_in_child(name, argv))
            print(f"  {name}: {results[name][-1]:,.0f} tokens/s", file=sys.stderr)
    median = {name: statistics.median(values) for name, values in results.items()}
    ours = median["Shipyard runtime"]
    summary = {
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "way")},
        "threads": torch.get_num_threads(),
        "tokens_per_s_each_round": results,
        "tokens_per_s": median,
        "shipyard_vs_bare": ours / median["bare PyTorch loop"],
        "shipyard_vs_hf_trainer": ours / median["HF Trainer"],
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(
        f"{args.preset}, {args.precision}, batch {args.batch_tokens} tokens ({args.micro}x{args.seq_len}), "
        f"{args.steps} steps, {torch.get_num_threads()} threads, median of {args.rounds} round(s)"
    )
    for name, value in median.items():
        print(f"  {name:<20} {value:>10,.0f} tokens/s")
    print(f"  Shipyard / bare loop   {summary['shipyard_vs_bare']:.3f}")
    print(f"  Shipyard / HF Trainer  {summary['shipyard_vs_hf_trainer']:.3f}")


if __name__ == "__main__":
    main()
