"""Training throughput: a bare PyTorch loop vs Shipyard's runtime (through the local executor)
vs Hugging Face ``Trainer``, on the same model shape, batch, sequence length and step count.

    .venv/bin/python benchmarks/train_throughput.py [--steps 12] [--rounds 1] [--precision bf16]
        [--device cpu|cuda]

With ``--device cuda`` all three run on the node's first GPU (the Shipyard job asks for that GPU's
accelerator type and the agent places it), and the job's planner estimate is printed beside what it
measured.

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


def settle(device: torch.device) -> float:
    """The time once the device has finished what was queued (GPU kernels run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def bare_loop(args: argparse.Namespace) -> dict[str, float]:
    """The loop a researcher writes by hand: same model class, random tokens already in memory."""
    from shipyard.training.model import Transformer

    s = shape(args)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = Transformer(s["arch"]).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True
    )
    data = torch.randint(0, VOCAB, (args.steps * s["accum"], args.micro, args.seq_len + 1), device=device)
    times = []
    for step in range(args.steps):
        start = settle(device)
        for micro in range(s["accum"]):
            batch = data[step * s["accum"] + micro]
            with torch.autocast(device.type, dtype=s["autocast"], enabled=s["autocast"] is not None):
                loss = model(batch[:, :-1], batch[:, 1:]) / s["accum"]
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(settle(device) - start)
    return {"tokens_per_s": steady_tokens_per_s(times, args.batch_tokens)}


def accelerator_type(args: argparse.Namespace) -> str:
    """The catalog type the Shipyard job asks for: the node's first GPU under ``--device cuda``."""
    if args.device == "cpu":
        return "cpu"
    from shipyard.hardware import discover

    return next(d.accelerator_type for d in discover() if d.accelerator_type != "cpu")


def shipyard_runtime(args: argparse.Namespace) -> dict[str, float]:
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
            "optimizer": {"lr": 3e-4, "state_dtype": args.state_dtype},
            "activation_checkpointing": args.checkpointing,
            "compile": {"auto": "auto", "on": True, "off": False}[args.compile],
        },
        "resources": {"accelerator": accelerator_type(args), "devices": 1},
    }
    # The agent may still be storing the job's last artifacts when the job is reported done.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as home:
        path = Path(home) / "bench.yaml"
        path.write_text(yaml.safe_dump(spec))
        env = {**os.environ, "SHIPYARD_HOME": home, "SHIPYARD_AGENT_IDLE_EXIT_S": "1"}
        shipyard = [sys.executable, "-m", "shipyard.cli.main"]

        def run(*command: str) -> Any:
            done = subprocess.run(
                [*shipyard, *command, "--json"], env=env, check=True, capture_output=True, text=True
            )
            return json.loads(done.stdout)

        job = run("jobs", "submit", str(path), "--wait")
        if job["state"] != "succeeded":
            raise RuntimeError(f"benchmark job {job['state']}: {job['message']}")
        detail = run("jobs", "show", job["id"])
        lines = (Path(job["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        train = [r for r in map(json.loads, lines) if r["kind"] == "train"]
        time.sleep(1.5)  # let the agent go idle and exit before the next measurement
    estimate = detail["estimate"]
    return {
        "tokens_per_s": steady_tokens_per_s([r["step_time_s"] for r in train], args.batch_tokens),
        "mfu": statistics.median(r["mfu"] for r in train[WARMUP_STEPS:]),
        "peak_memory_gib": max(r["mem_gib"] for r in train),
        "peak_live_memory_gib": max(r.get("mem_live_gib", r["mem_gib"]) for r in train),
        "planned_tokens_per_s": estimate.get("tokens_per_s", float("nan")),
        "planned_mfu": estimate.get("mfu", float("nan")),
        "planned_memory_gib": estimate.get("memory_gib_per_device", float("nan")),
    }


def hf_trainer(args: argparse.Namespace) -> dict[str, float]:
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
    device = torch.device(args.device)

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *_args: Any, **_kwargs: Any) -> None:
            self.start = settle(device)

        def on_step_end(self, *_args: Any, **_kwargs: Any) -> None:
            times.append(settle(device) - self.start)

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
            use_cpu=args.device == "cpu",
            save_strategy="no",
            report_to=[],
            logging_steps=10_000,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        Trainer(model=model, args=training_args, train_dataset=dataset, callbacks=[StepTimer()]).train()
    return {"tokens_per_s": steady_tokens_per_s(times, args.batch_tokens)}


WAYS: dict[str, Callable[[argparse.Namespace], dict[str, float]]] = {
    "bare PyTorch loop": bare_loop,
    "Shipyard runtime": shipyard_runtime,
    "HF Trainer": hf_trainer,
}


def run_in_child(name: str, argv: list[str]) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, *argv, "--way", name], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


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
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--checkpointing", default="auto", choices=["auto", "none", "selective", "full"])
    parser.add_argument("--state-dtype", default="fp32", choices=["fp32", "bf16"], help="Adam's moments")
    parser.add_argument("--compile", default="auto", choices=["auto", "on", "off"], help="the Shipyard job's")
    parser.add_argument(
        "--ways",
        default=",".join(WAYS),
        help="which to run, comma-separated (a 7B shape fits only Shipyard's)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--way", choices=list(WAYS), help=argparse.SUPPRESS)  # one way, in a child
    args = parser.parse_args()
    if args.way:
        print(json.dumps(WAYS[args.way](args)))
        return
    argv = [a for a in sys.argv[1:] if a != "--json"]
    names = [name for name in WAYS if name in args.ways.split(",")]
    results: dict[str, list[float]] = {name: [] for name in names}
    planned: list[dict[str, float]] = []
    for round_ in range(args.rounds):
        # Rotate which way goes first: on a shared VM, speed drifts within a round.
        turn = round_ % len(names)
        for name in names[turn:] + names[:turn]:
            figures = run_in_child(name, argv)
            results[name].append(figures.pop("tokens_per_s"))
            if figures:
                planned.append(figures)
            print(f"  {name}: {results[name][-1]:,.0f} tokens/s", file=sys.stderr)
    median = {name: statistics.median(values) for name, values in results.items()}
    plan_vs_measured = (
        {key: statistics.median(p[key] for p in planned) for key in planned[0]} if planned else {}
    )
    ours = median.get("Shipyard runtime", float("nan"))
    summary = {
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "way")},
        "threads": torch.get_num_threads(),
        "tokens_per_s_each_round": results,
        "tokens_per_s": median,
        "shipyard_vs_bare": ours / median.get("bare PyTorch loop", float("nan")),
        "shipyard_vs_hf_trainer": ours / median.get("HF Trainer", float("nan")),
        "shipyard_job_planned_vs_measured": plan_vs_measured,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(
        f"{args.preset}, {args.precision}, batch {args.batch_tokens} tokens ({args.micro}x{args.seq_len}), "
        f"{args.steps} steps on {args.device}, {torch.get_num_threads()} threads, "
        f"median of {args.rounds} round(s)"
    )
    for name, value in median.items():
        print(f"  {name:<20} {value:>10,.0f} tokens/s")
    print(f"  Shipyard / bare loop   {summary['shipyard_vs_bare']:.3f}")
    print(f"  Shipyard / HF Trainer  {summary['shipyard_vs_hf_trainer']:.3f}")
    if plan_vs_measured:
        p = plan_vs_measured
        print(
            f"  Shipyard job: planned {p['planned_tokens_per_s']:,.0f} tokens/s "
            f"(MFU {p['planned_mfu']:.1%}), {p['planned_memory_gib']:.2f} GiB per device; "
            f"measured {ours:,.0f} tokens/s "
            f"(MFU {p['mfu']:.1%}), {p['peak_memory_gib']:.2f} GiB peak"
        )


if __name__ == "__main__":
    main()
