"""Fine-tuning: a Shipyard job vs the PEFT + ``transformers.Trainer`` script teams write today,
on the same base model, adapters, data, batch and step count, LoRA and full fine-tuning.

    .venv/bin/python benchmarks/finetune_throughput.py [--methods lora,full] [--steps 20]
        [--rounds 1] [--family llama] [--device cpu|cuda] [--json]

The base model is built offline (a config, random weights and a tokenizer trained on local text,
as the tests do), of the family and shape given. The data is an instruction set whose prompts carry
no loss in both ways; the Shipyard job pads each record to ``--seq-len`` (``packing: false``) as the
script's collator does, so both train on the same tokens. Each way runs in a fresh child process,
one after the other, ``--rounds`` times (round r seeds both ways with r): tokens/s is the global
batch over the median step time after two warm-up steps; peak memory is the process's (GPU:
allocated; CPU: resident); eval loss is the mean over the records Shipyard holds out, which the
script evaluates too. Each figure is the median over the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support builds the base model

import torch

from benchmarks.finetune_ways import accelerator_type, base_model, peak_gib, shipyard_job, steady, step_timer
from shipyard.training.samples import EVAL_BLOCK_SAMPLES, IGNORE
from tests.support import tiny_models

EVAL_FRACTION = 0.05
RECORDS = 2000


LORA = {"rank": 16, "alpha": 32, "dropout": 0.05}


def shipyard_way(args: argparse.Namespace, method: str, base: Path, data: Path) -> dict[str, float]:
    """``shipyard jobs submit --wait``: the local agent places the job, the runtime trains it."""
    spec = {
        "name": "bench",
        "model": {"path": str(base)},
        "finetune": {"method": method, "lora": LORA},
        "data": {
            "paths": [str(data)],
            "format": "instruction",
            "packing": False,
            "eval_fraction": EVAL_FRACTION,
        },
        "training": {
            "steps": args.steps,
            "global_batch_tokens": args.micro * args.seq_len,
            "micro_batch_size": args.micro,
            "seq_len": args.seq_len,
            "precision": args.precision,
            "eval_batches": args.eval_batches,
            "optimizer": {"lr": args.lr, "weight_decay": 0.0},
            "seed": args.seed,
            "schedule": {"decay": "linear", "min_lr_ratio": 0.0},
        },
        "resources": {"accelerator": accelerator_type(args.device), "devices": 1},
    }
    records, _ = shipyard_job(spec)
    train = [r for r in records if r["kind"] == "train"]
    return {
        "tokens_per_s": args.micro * args.seq_len / steady([r["step_time_s"] for r in train]),
        "peak_memory_gib": max(r["mem_gib"] for r in train),
        "eval_loss": [r for r in records if r["kind"] == "eval"][-1]["loss"],
    }


def peft_trainer(args: argparse.Namespace, method: str, base: Path, data: Path) -> dict[str, float]:
    """The script: tokenize prompt and response, mask the prompt, pad; PEFT adapters; Trainer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    rows = [json.loads(line) for line in data.read_text().splitlines()]

    def encode(row: dict[str, str]) -> dict[str, torch.Tensor]:
        prompt = tokenizer(row["prompt"] + "\n\n")["input_ids"]
        response = tokenizer(row["response"], add_special_tokens=False)["input_ids"] + [
            tokenizer.eos_token_id
        ]
        ids = (prompt + response)[: args.seq_len]
        labels = ([IGNORE] * len(prompt) + response)[: args.seq_len]
        pad = args.seq_len - len(ids)
        return {
            "input_ids": torch.tensor(ids + [tokenizer.pad_token_id] * pad),
            "labels": torch.tensor(labels + [IGNORE] * pad),
            "attention_mask": torch.tensor([1] * len(ids) + [0] * pad),
        }

    every = max(2, round(1 / EVAL_FRACTION))  # the records Shipyard holds out
    held_out = [(i // EVAL_BLOCK_SAMPLES) % every == every - 1 for i in range(len(rows))]
    train = [encode(r) for r, out in zip(rows, held_out, strict=True) if not out]
    evaluation = [encode(r) for r, out in zip(rows, held_out, strict=True) if out]
    evaluation = evaluation[: args.eval_batches * args.micro]
    torch.manual_seed(args.seed)  # the adapters' initialisation, as the Shipyard job seeds it
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=LORA["rank"],
            lora_alpha=LORA["alpha"],
            lora_dropout=LORA["dropout"],
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, config)
    times: list[float] = []
    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=args.micro,
            per_device_eval_batch_size=args.micro,
            learning_rate=args.lr,
            weight_decay=0.0,
            adam_beta2=0.95,
            max_grad_norm=1.0,
            lr_scheduler_type="linear",
            bf16=args.precision == "bf16",
            use_cpu=args.device == "cpu",
            save_strategy="no",
            report_to=[],
            logging_steps=10_000,
            dataloader_num_workers=0,
            disable_tqdm=True,
            seed=args.seed,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=train,
            eval_dataset=evaluation,
            callbacks=[step_timer(device, times)],
        )
        trainer.train()
        eval_loss = trainer.evaluate()["eval_loss"]
    return {
        "tokens_per_s": args.micro * args.seq_len / steady(times),
        "peak_memory_gib": peak_gib(device),
        "eval_loss": float(eval_loss),
    }


WAYS = {"Shipyard job": shipyard_way, "PEFT + Trainer": peft_trainer}


def prepare(args: argparse.Namespace, root: Path) -> tuple[Path, Path]:
    base = base_model(root, args.family, args.hidden, args.layers)
    data = tiny_models.write_jsonl(root / "instructions.jsonl", tiny_models.instruction_records(RECORDS))
    return base, data


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--methods", default="lora,full")
    parser.add_argument("--family", choices=tiny_models.FAMILIES, default="llama")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="fp32")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--seed", type=int, default=0, help="of the first round; round r uses seed + r")
    parser.add_argument("--way", choices=list(WAYS), help=argparse.SUPPRESS)  # one way, in a child
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:
        base, data = prepare(args, Path(args.workdir))
        print(json.dumps(WAYS[args.way](args, args.method, base, data)))
        return
    argv = [a for a in sys.argv[1:] if a != "--json"]
    summary: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k not in ("json", "way")}}
    with tempfile.TemporaryDirectory() as workdir:
        prepare(args, Path(workdir))
        for method in args.methods.split(","):
            rounds: dict[str, list[dict[str, float]]] = {name: [] for name in WAYS}
            for round_ in range(args.rounds):
                names = list(WAYS)[round_ % 2 :] + list(WAYS)[: round_ % 2]  # alternate who goes first
                for name in names:
                    seed = str(args.seed + round_)  # the eval loss: a median over seeds
                    way = ["--way", name, "--method", method, "--workdir", workdir, "--seed", seed]
                    command = [sys.executable, __file__, *argv, *way]
                    done = subprocess.run(command, capture_output=True, text=True)
                    if done.returncode != 0:
                        raise SystemExit(f"{name} ({method}) failed:\n{done.stderr[-3000:]}")
                    rounds[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
                    print(f"  {method} {name}: {rounds[name][-1]}", file=sys.stderr)
            median = {
                name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
                for name, runs in rounds.items()
            }
            ours, theirs = median["Shipyard job"], median["PEFT + Trainer"]
            summary[method] = {
                "median": median,
                "tokens_per_s_ratio": ours["tokens_per_s"] / theirs["tokens_per_s"],
                "peak_memory_ratio": ours["peak_memory_gib"] / theirs["peak_memory_gib"],
                "eval_loss_difference": ours["eval_loss"] - theirs["eval_loss"],
            }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(
        f"{args.family} h={args.hidden} x{args.layers}, {args.precision}, batch {args.micro}x{args.seq_len}, "
        f"{args.steps} steps on {args.device}, median of {args.rounds} round(s)"
    )
    for method in args.methods.split(","):
        s = summary[method]
        for name, figures in s["median"].items():
            print(
                f"  {method:<5} {name:<15} {figures['tokens_per_s']:>9,.0f} tokens/s  "
                f"{figures['peak_memory_gib']:.3f} GiB  eval loss {figures['eval_loss']:.4f}"
            )
        print(
            f"  {method:<5} Shipyard / script: tokens/s {s['tokens_per_s_ratio']:.3f}, "
            f"peak memory {s['peak_memory_ratio']:.3f}, eval loss {s['eval_loss_difference']:+.4f}"
        )


if __name__ == "__main__":
    main()
