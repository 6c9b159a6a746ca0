"""Sample a completion: ``python -m shipyard.training.generate MODEL_DIR --prompt TEXT``.

Prints one JSON object ``{"prompt", "completion", "tokens"}`` on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from shipyard.errors import ShipyardError
from shipyard.training import hf
from shipyard.training.model import Transformer


@torch.no_grad()
def sample(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    eos_id: int | None,
    generator: torch.Generator,
) -> list[int]:
    model.eval()
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    out: list[int] = []
    for _ in range(max_new_tokens):
        context = ids[:, -model.arch.max_seq_len :]
        logits = model(context)[0, -1].float()
        if temperature <= 0:
            token = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits[logits < kth] = -float("inf")
            token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
        if token == eos_id:
            break
        out.append(token)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shipyard.training.generate")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        from tokenizers import Tokenizer

        torch.set_num_threads(max(1, torch.get_num_threads()))
        model = hf.load_model(args.model_dir)
        tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
        config = json.loads((args.model_dir / "config.json").read_text())
        generator = torch.Generator().manual_seed(args.seed)
        prompt_ids = tokenizer.encode(args.prompt).ids
        ids = sample(
            model,
            prompt_ids,
            args.max_new_tokens,
            args.temperature,
            args.top_k,
            config.get("eos_token_id"),
            generator,
        )
    except ShipyardError as exc:
        print(json.dumps({"error": exc.message, "hint": exc.hint}))
        return 1
    print(json.dumps({"prompt": args.prompt, "completion": tokenizer.decode(ids), "tokens": len(ids)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
