"""Fine-tuning data: instruction and chat records become samples whose prompt tokens carry no
loss, packed so that attention never crosses from one sample into the next."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from shipyard.errors import DatasetError
from shipyard.schemas.jobspec import DataSection, InstructionFields
from shipyard.schemas.records import check_records, instruction_of, messages_of, preference_of
from shipyard.training import finetune
from shipyard.training.data import prepare
from shipyard.training.model import Transformer
from shipyard.training.samples import IGNORE, SampleRows, attention_mask
from tests.support import tiny_models


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    tiny_models.tokenizer(folder)
    return folder


def _rows(
    tmp_path: Path, tokenizer_dir: Path, records: list[dict[str, object]], **data: object
) -> SampleRows:
    path = tiny_models.write_jsonl(tmp_path / "data.jsonl", records)
    section = DataSection.model_validate({"paths": [str(path)], **data})
    prepared = prepare(section, tmp_path / "cache", log=lambda _: None, tokenizer_dir=tokenizer_dir)
    pairs = section.format == "preference"
    return SampleRows(prepared.directory, prepared.pad_id, 64, 0.1, 0, section.packing, pairs=pairs)


def test_instruction_prompts_carry_no_loss_and_the_response_ends_with_eos(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    records = [{"prompt": "What colors are sky and snow?", "response": "blue and white"}] * 40
    rows = _rows(tmp_path, tokenizer_dir, records, format="instruction", packing=False)
    x, y = rows.train_batch(0, 1)
    trained = y[0][y[0] != IGNORE].tolist()
    assert tok.decode(trained) == "blue and white" + tok.eos_token
    prompt = tok("What colors are sky and snow?\n\n")["input_ids"]
    assert (y[0][: len(prompt) - 1] == IGNORE).all()  # no target inside the prompt
    assert x[0][: len(prompt)].tolist() == prompt

    everything = _rows(
        tmp_path, tokenizer_dir, records, format="instruction", packing=False, mask_prompt=False
    )
    _, y_all = everything.train_batch(0, 1)
    assert (y_all[0] != IGNORE).sum() > len(trained)


def test_chat_records_train_on_the_assistant_turns_only(tmp_path: Path, tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    rows = _rows(tmp_path, tokenizer_dir, tiny_models.chat_records(40), format="chat", packing=False)
    x, y = rows.train_batch(0, 1)
    trained = tok.decode(y[0][y[0] != IGNORE].tolist())
    assert trained.endswith("<|im_end|>\n") and " and " in trained
    assert "user" not in trained and "Answer with colors" not in trained
    assert "<|im_start|>assistant\n" in tok.decode(x[0].tolist())


def test_packed_rows_hold_several_samples_whose_attention_stays_within_each(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    rows = _rows(tmp_path, tokenizer_dir, tiny_models.instruction_records(60), format="instruction")
    x, y, positions = rows.train_batch(0, 2)
    assert x.shape == y.shape == positions.shape == (2, 64)
    assert int((positions[0] == 0).sum()) >= 3  # several samples (and the padding) in one row
    mask = attention_mask(positions)[0, 0]
    starts = (positions[0] == 0).nonzero().flatten().tolist()
    second = starts[1]
    assert not mask[second, second - 1] and mask[second + 1, second]

    # A packed row's logits are those of each sample alone, for Shipyard's LLaMA and for a
    # transformers model alike.
    from transformers import AutoModelForCausalLM

    from shipyard.schemas.presets import PRESETS

    torch.manual_seed(0)
    own = Transformer(PRESETS["llama-tiny"].with_vocab(tiny_models.VOCAB + 8)).eval()
    hf = finetune.CausalLM(
        AutoModelForCausalLM.from_config(tiny_models.config("qwen2", tiny_models.VOCAB + 8))
    )
    for model in (own, hf.eval()):
        with torch.no_grad():
            packed = model(x[:1], None, positions[:1])
            alone = model(x[:1, second : starts[2]])
        torch.testing.assert_close(packed[:, second : starts[2]], alone, atol=1e-5, rtol=1e-4)


def test_instruction_records_missing_a_field_are_named_by_line(tmp_path: Path) -> None:
    path = tiny_models.write_jsonl(
        tmp_path / "bad.jsonl", [{"prompt": "a", "response": "b"}, {"prompt": "c", "answer": "d"}]
    )
    section = DataSection.model_validate({"paths": [str(path)], "format": "instruction"})
    with pytest.raises(DatasetError) as caught:
        check_records(section, [path])
    assert f"{path}:2 has no field 'response' (its fields: answer, prompt)" in caught.value.message
    assert "data.fields.response" in (caught.value.hint or "")
    numeric = tiny_models.write_jsonl(tmp_path / "numeric.jsonl", [{"prompt": "2+2?", "response": 4}])
    with pytest.raises(DatasetError) as caught:  # there, but a number: said as it is, not as missing
        check_records(section.model_copy(update={"paths": [str(numeric)]}), [numeric])
    assert f"{numeric}:1 field 'response' is a number, not text" in caught.value.message

    alpaca = tiny_models.write_jsonl(
        tmp_path / "alpaca.jsonl", [{"instruction": "Name a color", "input": "", "output": "red"}]
    )
    fields = {"prompt": "instruction", "input": "input", "response": "output"}
    section = DataSection.model_validate({"paths": [str(alpaca)], "format": "instruction", "fields": fields})
    assert check_records(section, [alpaca]) == 1

    chat = tiny_models.write_jsonl(
        tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}]
    )
    section = DataSection.model_validate({"paths": [str(chat)], "format": "chat"})
    with pytest.raises(DatasetError, match=r"chat\.jsonl:1 has no assistant message"):
        check_records(section, [chat])


def test_the_prompt_template_is_plain_alpaca_or_ones_own() -> None:
    record = {"instruction": "Name a color", "input": "warm", "output": "red"}
    named = {"prompt": "instruction", "input": "input", "response": "output"}
    plain = instruction_of(record, InstructionFields(**named), "x:1").prompt
    assert plain == "Name a color\n\nwarm\n\n"  # as before: a resumed job reads the same tokens
    alpaca = instruction_of(record, InstructionFields(**named, template="alpaca"), "x:1").prompt
    assert alpaca.endswith("### Instruction:\nName a color\n\n### Input:\nwarm\n\n### Response:\n")
    bare = instruction_of({"prompt": "Hi", "response": "Hello"}, InstructionFields(template="alpaca"), "x:1")
    assert "### Input" not in bare.prompt and bare.prompt.startswith("Below is an instruction")
    own = InstructionFields(**named, template="<|user|>{prompt} ({input})<|assistant|>")
    assert instruction_of(record, own, "x:1").prompt == "<|user|>Name a color (warm)<|assistant|>"
    for bad, why in (("Q: {question}", "must hold {prompt}"), ("{prompt}", "the input would be lost")):
        with pytest.raises(ValidationError, match=re.escape(why)):
            InstructionFields(**named, template=bad)


def test_chat_content_as_a_list_of_text_parts_is_read_and_other_parts_are_refused() -> None:
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "there"}]
    record = {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "Hi"}]}
    assert messages_of(record, "messages", "x:1")[0] == {"role": "user", "content": "Hello, there"}
    image = {"type": "image_url", "image_url": {"url": "http://example.invalid/a.png"}}
    record["messages"][0]["content"] = [*parts, image]
    with pytest.raises(DatasetError, match="neither text nor a list of text parts") as caught:
        messages_of(record, "messages", "x:1")
    assert "images and other parts are not trained on" in (caught.value.hint or "")


def test_preference_pairs_stay_together_chosen_first_with_only_the_completions_trained(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    from transformers import AutoTokenizer

    pairs = tiny_models.preference_records(40)
    rows = _rows(tmp_path, tokenizer_dir, pairs, format="preference", packing=True)
    assert not rows.packing  # pairs are never packed
    tokens, targets = rows.train_batch(0, 3)
    assert tokens.shape == (6, 64) and rows.trained_units((tokens, targets)) == 3
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    for chosen, rejected in zip(range(0, 6, 2), range(1, 6, 2), strict=True):
        texts = [tokenizer.decode(targets[r][targets[r] != IGNORE]) for r in (chosen, rejected)]
        # The same prompt in both rows, no loss on it; each completion ends with the end token.
        prompt = tokens[chosen][: (targets[chosen] != IGNORE).nonzero()[0, 0] + 1]
        assert torch.equal(tokens[rejected][: len(prompt)], prompt)
        record = next(p for p in pairs if p["chosen"] + tokenizer.eos_token == texts[0])
        assert texts[1] == record["rejected"] + tokenizer.eos_token


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"prompt": "p", "chosen": "a"}, "has no field 'rejected'"),
        ({"prompt": "p", "chosen": 1, "rejected": "b"}, "chosen is a number and rejected is text"),
        ({"chosen": "a", "rejected": "b"}, "has no field 'prompt'"),
        (
            {
                "chosen": [{"role": "user", "content": "q"}],
                "rejected": [{"role": "assistant", "content": "a"}],
            },
            "chosen has no assistant turn",
        ),
    ],
)
def test_a_bad_preference_pair_is_named_with_its_fix(record: dict[str, object], message: str) -> None:
    with pytest.raises(DatasetError, match=re.escape(message)):
        preference_of(record, "pairs.jsonl:7")


def test_conversation_pairs_share_their_prompt_as_trl_reads_them() -> None:
    user = {"role": "user", "content": "What colors are sky and coal?"}
    good, bad = {"role": "assistant", "content": "blue and black"}, {"role": "assistant", "content": "red"}
    implicit = preference_of({"chosen": [user, good], "rejected": [user, bad]}, "x")
    explicit = preference_of({"prompt": [user], "chosen": [good], "rejected": [bad]}, "x")
    assert implicit == explicit and implicit.chat
    assert implicit.prompt == [user] and implicit.chosen == [good]
