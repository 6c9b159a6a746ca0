"""Sample a completion: ``python -m shipyard.training.generate MODEL_DIR --prompt TEXT``.

``MODEL_DIR`` is a full model (a Shipyard export or any local ``transformers`` causal LM) or a
PEFT adapter folder (on the base model its ``adapter_config.json`` names). A model whose tokenizer
has a chat template gets the prompt as a user turn, as it was fine-tuned to read it. Prints one
JSON object ``{"prompt", "completion", "tokens"}`` on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from shipyard.errors import InvalidSpec, ShipyardError
from shipyard.schemas.jobspec import InstructionFields
from shipyard.schemas.records import instruction_of
from shipyard.training import hf
from shipyard.training.finetune import PROMPT_FORMAT_FILE, CausalLM
from shipyard.training.model import Transformer


@torch.no_grad()
def sample(
    model: Transformer | CausalLM,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    eos_id: int | None,
    generator: torch.Generator,
) -> list[int]:
    model.eval()
    max_seq_len = model.arch.max_seq_len if isinstance(model, Transformer) else model.max_seq_len
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    out: list[int] = []
    for _ in range(max_new_tokens):
        context = ids[:, -max_seq_len:]
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
    parser.add_argument("--raw", action="store_true", help="the prompt as it is, without the chat template")
    args = parser.parse_args(argv)
    try:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        model, encode, decode, eos_id = _load(args.model_dir, raw=args.raw)
        generator = torch.Generator().manual_seed(args.seed)
        ids = sample(
            model, encode(args.prompt), args.max_new_tokens, args.temperature, args.top_k, eos_id, generator
        )
    except ShipyardError as exc:
        print(json.dumps({"error": exc.message, "hint": exc.hint}))
        return 1
    print(json.dumps({"prompt": args.prompt, "completion": decode(ids), "tokens": len(ids)}))
    return 0


Encode = Callable[[str], list[int]]
Decode = Callable[[list[int]], str]


def _load(folder: Path, raw: bool) -> tuple[Transformer | CausalLM, Encode, Decode, int | None]:
    """The model of ``folder`` with its tokenizer: Shipyard's own LLaMA where it loads, else
    ``transformers`` (and PEFT for an adapter folder)."""
    adapter = (folder / "adapter_config.json").is_file()
    config = {} if adapter else json.loads((folder / "config.json").read_text())
    if not adapter and config.get("model_type") == "llama" and not (folder / "chat_template.jinja").is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return (
            hf.load_model(folder),
            lambda text: tokenizer.encode(text).ids,
            tokenizer.decode,
            config.get("eos_token_id"),
        )
    from shipyard.training.samples import has_chat_template, load_tokenizer

    hf_tokenizer = load_tokenizer(folder)
    model = _hf_model(folder, adapter)
    trained_on = _prompt_format(folder)

    def encode(text: str) -> list[int]:
        if trained_on == "instruction" and not raw:
            text = instruction_of({"prompt": text, "response": ""}, InstructionFields(), "--prompt").prompt
        if raw or trained_on in ("instruction", "text") or not has_chat_template(hf_tokenizer):
            return list(hf_tokenizer(text)["input_ids"])
        turn = [{"role": "user", "content": text}]
        rendered = hf_tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
        return list(hf_tokenizer(rendered, add_special_tokens=False)["input_ids"])

    def decode(ids: list[int]) -> str:
        return str(hf_tokenizer.decode(ids, skip_special_tokens=True))

    return model, encode, decode, hf_tokenizer.eos_token_id


def _prompt_format(folder: Path) -> str | None:
    """How the model in ``folder`` was fine-tuned to read a prompt, if Shipyard trained it."""
    for candidate in (folder / PROMPT_FORMAT_FILE, folder.parent / PROMPT_FORMAT_FILE):
        if candidate.is_file():
            return str(json.loads(candidate.read_text()).get("data_format"))
    return None


def _hf_model(folder: Path, adapter: bool) -> CausalLM:
    from transformers import AutoModelForCausalLM

    if not adapter:
        return CausalLM(AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True))
    from peft import PeftModel

    base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base or not (Path(base) / "config.json").is_file():
        raise InvalidSpec(
            f"the adapters in {folder} name base model {base!r}, which is not a model folder here",
            hint="sample from the merged export (finetune.merge: true) or put the base model back",
        )
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    return CausalLM(PeftModel.from_pretrained(model, str(folder)))


if __name__ == "__main__":
    sys.exit(main())
