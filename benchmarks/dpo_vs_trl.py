"""Preference tuning: a Shipyard ``finetune.method: dpo`` job vs TRL's ``DPOTrainer``, on the same
base model, pairs, order, batch, optimizer and β, side by side.

    .venv/bin/python benchmarks/dpo_vs_trl.py [--weights full,lora] [--loss sigmoid] [--steps 20]
        [--hidden 256] [--layers 4] [--pairs 8] [--device cpu|cuda] [--json]

TRL is not one of Shipyard's dependencies: ``.venv/bin/pip install -e '.[trl]'`` first (it brings
``datasets``; measured with TRL 1.16.0). The base model is built offline (a config, random weights
and a tokenizer trained on local text, as the tests do); the pairs are prompts whose chosen answer
names the right colors and whose rejected one names others. Both ways run in fresh child
processes, Shipyard's first: its job's data order (the seeded permutation of the pairs it does not
hold out) is then handed to TRL, whose sampler reads it in sequence, so step N of each trains on
the same pairs. Shipyard pads each sequence to ``seq_len``, the longest of the data; TRL pads to
the longest of its batch (never more). Both use AdamW with the same betas, no weight decay, a
constant learning rate, gradient clipping at 1.0, fp32 (or bf16 autocast on a GPU); under ``lora``
both seed the adapters' initialisation alike (rank 16, no dropout, the same projections).

Figures: the loss of every step of each (their largest difference is the equality check); tokens/s
as the step's pairs x 2 x ``seq_len`` over the median step after two warm-up steps (the same pairs
per step for both, so the ratio is that of pairs per second); the process's peak memory (GPU:
allocated; CPU: resident).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support builds the base model

import torch

from benchmarks.finetune_ways import accelerator_type, base_model, peak_gib, shipyard_job, steady, step_timer
from tests.support import tiny_models

EVAL_FRACTION = 0.05
RECORDS = 600
BETAS = (0.9, 0.95)
LORA: dict[str, Any] = {"rank": 16, "alpha": 32, "dropout": 0.0}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def longest(base: Path, rows: list[dict[str, str]]) -> int:
    """The longest prompt + completion in tokens: both ways pad to it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base))
    eos = tokenizer.eos_token
    return max(
        len(tokenizer(r["prompt"] + r[k] + eos)["input_ids"]) for r in rows for k in ("chosen", "rejected")
    )


def shipyard_way(args: argparse.Namespace, base: Path, data: Path) -> dict[str, Any]:
    """``shipyard jobs submit --wait``, then the pairs each step trained on, in order: the job's
    own data order, for TRL to follow."""
    from shipyard.training.samples import SampleRows

    spec = {
        "name": "bench-dpo",
        "model": {"path": str(base)},
        "finetune": {
            "method": "dpo",
            "dpo": {"weights": args.weights, "beta": args.beta, "loss": args.loss},
            "lora": {**LORA, "target_modules": TARGETS},
        },
        "data": {"paths": [str(data)], "format": "preference", "eval_fraction": EVAL_FRACTION},
        "training": {
            "steps": args.steps,
            "global_batch_tokens": args.pairs * args.seq_len,
            "micro_batch_size": args.pairs,
            "seq_len": args.seq_len,
            "precision": args.precision,
            "eval_batches": 1,
            "optimizer": {"lr": args.lr, "weight_decay": 0.0, "betas": list(BETAS), "grad_clip": 1.0},
            "seed": args.seed,
            "schedule": {"decay": "constant", "warmup_steps": 0},
        },
        "resources": {"accelerator": accelerator_type(args.device), "devices": 1},
    }

    def data_order(home: Path, _run_dir: Path) -> list[int]:
        [dataset] = [p.parent for p in home.rglob("meta.json") if (p.parent / "starts.npy").is_file()]
        rows = SampleRows(dataset, 0, args.seq_len, EVAL_FRACTION, args.seed, packing=False, pairs=True)
        order = []
        for sample in range(args.steps * args.pairs):
            epoch, position = divmod(sample, rows.n_train)
            [[chosen], _] = rows._train_units[int(rows.train_order(epoch)[position])]
            order.append(chosen // 2)
        return order

    records, order = shipyard_job(spec, data_order)
    train = [r for r in records if r["kind"] == "train"]
    return {
        "losses": [r["loss"] for r in train],
        "step_s": steady([r["step_time_s"] for r in train]),
        "peak_memory_gib": max(r["mem_gib"] for r in train),
        "reward_accuracy": train[-1]["reward_accuracy"],
        "order": order,
    }


def trl_trainer(args: argparse.Namespace, base: Path, data: Path) -> dict[str, Any]:
    """TRL's DPOTrainer as its documentation writes it, reading the pairs in the given order."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    device = torch.device(args.device)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    order = json.loads(Path(args.order).read_text())
    dataset = Dataset.from_list([rows[i] for i in order])
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    peft_config = None
    if args.weights == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=LORA["rank"],
            lora_alpha=LORA["alpha"],
            lora_dropout=0.0,
            target_modules=TARGETS,
            task_type="CAUSAL_LM",
        )
    times: list[float] = []
    with tempfile.TemporaryDirectory() as out:
        config = DPOConfig(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=args.pairs,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            weight_decay=0.0,
            adam_beta1=BETAS[0],
            adam_beta2=BETAS[1],
            max_grad_norm=1.0,
            beta=args.beta,
            loss_type=[args.loss],
            max_length=args.seq_len,
            bf16=args.precision == "bf16",
            use_cpu=args.device == "cpu",
            train_sampling_strategy="sequential",
            save_strategy="no",
            report_to=[],
            logging_steps=1,
            dataloader_num_workers=0,
            disable_tqdm=True,
            seed=args.seed,
        )
        trainer = DPOTrainer(
            model=model,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[step_timer(device, times)],
        )
        trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
    return {
        "losses": [float(h["loss"]) for h in logged],
        "step_s": steady(times),
        "peak_memory_gib": peak_gib(device),
        "reward_accuracy": float(logged[-1].get("rewards/accuracies", float("nan"))),
    }


WAYS = {"Shipyard job": shipyard_way, "TRL DPOTrainer": trl_trainer}


def prepare(args: argparse.Namespace, root: Path) -> tuple[Path, Path]:
    base = base_model(root, "llama", args.hidden, args.layers)
    data = tiny_models.write_jsonl(root / "pairs.jsonl", tiny_models.preference_records(RECORDS))
    return base, data


def run_way(name: str, argv: list[str], workdir: str, weights: str, extra: list[str]) -> dict[str, Any]:
    way = ["--way", name, "--weights", weights, "--workdir", workdir, *extra]
    done = subprocess.run([sys.executable, __file__, *argv, *way], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} ({weights}) failed:\n{done.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--weights", default="full,lora", help="full, lora or both")
    parser.add_argument("--loss", choices=["sigmoid", "ipo"], default="sigmoid")
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=8, help="pairs per step")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="fp32")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--seq-len", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--way", choices=list(WAYS), help=argparse.SUPPRESS)  # one way, in a child
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--order", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:
        base, data = prepare(args, Path(args.workdir))
        print(json.dumps(WAYS[args.way](args, base, data)))
        return
    argv = [a for a in sys.argv[1:] if a not in ("--json",) and not a.startswith("--weights")]
    if "--weights" in sys.argv:
        at = sys.argv.index("--weights")
        argv = [a for i, a in enumerate(sys.argv[1:], 1) if a != "--json" and i not in (at, at + 1)]
    summary: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "way", "order")}
    }
    with tempfile.TemporaryDirectory() as workdir:
        base, data = prepare(args, Path(workdir))
        seq_len = longest(base, tiny_models.preference_records(RECORDS))
        summary["config"]["seq_len"] = seq_len
        argv += ["--seq-len", str(seq_len)]
        for weights in args.weights.split(","):
            ours = run_way("Shipyard job", argv, workdir, weights, [])
            order_file = Path(workdir) / f"order-{weights}.json"
            order_file.write_text(json.dumps(ours.pop("order")))
            theirs = run_way("TRL DPOTrainer", argv, workdir, weights, ["--order", str(order_file)])
            steps = min(len(ours["losses"]), len(theirs["losses"]))
            gaps = [abs(a - b) for a, b in zip(ours["losses"][:steps], theirs["losses"][:steps], strict=True)]
            tokens_per_step = 2 * args.pairs * seq_len
            summary[weights] = {
                "shipyard": ours,
                "trl": theirs,
                "loss_largest_difference": max(gaps),
                "loss_first_step": [ours["losses"][0], theirs["losses"][0]],
                "tokens_per_s": [tokens_per_step / ours["step_s"], tokens_per_step / theirs["step_s"]],
                "tokens_per_s_ratio": theirs["step_s"] / ours["step_s"],
                "peak_memory_ratio": ours["peak_memory_gib"] / theirs["peak_memory_gib"],
            }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    seq_len = summary["config"]["seq_len"]
    print(
        f"llama h={args.hidden} x{args.layers}, {args.loss} β={args.beta}, {args.pairs} pairs x {seq_len} "
        f"tokens, {args.steps} steps, lr {args.lr:g}, {args.precision} on {args.device}"
    )
    for weights in args.weights.split(","):
        s = summary[weights]
        for who in ("shipyard", "trl"):
            f = s[who]
            print(
                f"  {weights:<5} {who:<9} loss {f['losses'][0]:.4f} -> {f['losses'][-1]:.4f}  "
                f"{2 * args.pairs * seq_len / f['step_s']:>9,.0f} tokens/s  "
                f"{f['peak_memory_gib']:.3f} GiB  reward accuracy {f['reward_accuracy']:.3f}"
            )
        print(
            f"  {weights:<5} Shipyard / TRL: tokens/s {s['tokens_per_s_ratio']:.3f}, peak memory "
            f"{s['peak_memory_ratio']:.3f}, largest loss difference {s['loss_largest_difference']:.2e}"
        )


if __name__ == "__main__":
    main()
