"""Fine-tuning data: instruction and chat records as token samples with a loss mask.

Each record becomes one sample: its tokens, and per token whether it is trained on (the response;
with ``mask_prompt: false``, everything). Samples are stored once, cached by content like the text
stream: ``tokens-00000.bin``, ``loss.bin`` (one byte per token) and ``starts.npy`` (where each
sample begins). ``SampleRows`` then lays whole samples into rows of ``seq_len`` tokens: packed
several to a row, with positions restarting at each sample so that attention never crosses from
one into another, or one to a row, padded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shipyard.errors import DatasetError
from shipyard.schemas.jobspec import DataSection
from shipyard.schemas.records import Preference, instruction_of, messages_of, preference_of, records

IGNORE = -100
"""The target of a token that carries no loss (cross-entropy's default ``ignore_index``)."""
_FLUSH_TOKENS = 1 << 20


def load_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise DatasetError(
            f"no tokenizer can be loaded from {folder}: {str(exc).splitlines()[0][:300]}",
            hint="give data.tokenizer.path (or model.path) a folder with tokenizer.json and "
            "tokenizer_config.json",
        ) from None


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_samples(
    files: list[Path], data: DataSection, tokenizer: Any
) -> Iterator[tuple[list[int], list[int]]]:
    """``(token ids, loss flags)`` of every record, in file and line order."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DatasetError(
            "the tokenizer names no end-of-sequence token (eos_token)",
            hint="set eos_token in the tokenizer's tokenizer_config.json",
        )
    if data.format == "chat" and not has_chat_template(tokenizer):
        raise DatasetError(
            "data.format chat renders messages with the model's chat template, and this tokenizer has none",
            hint="use a chat model's tokenizer (chat_template in tokenizer_config.json), or "
            "data.format: instruction",
        )
    for path in files:
        for where, record in records(path):
            if data.format == "preference":
                yield from _preference_pair(tokenizer, preference_of(record, where), where)
                continue
            if data.format == "instruction":
                parts = instruction_of(record, data.fields, where)
                prompt = tokenizer(parts.prompt, add_special_tokens=True)["input_ids"]
                response = tokenizer(parts.response, add_special_tokens=False)["input_ids"] + [eos]
                ids, loss = prompt + response, [0] * len(prompt) + [1] * len(response)
            else:
                ids, loss = _chat_sample(tokenizer, messages_of(record, data.messages_field, where), where)
            yield ids, loss if data.mask_prompt else [1] * len(ids)


def _preference_pair(tokenizer: Any, pair: Preference, where: str) -> Iterator[tuple[list[int], list[int]]]:
    """The chosen sample, then the rejected one: each the prompt and its completion tokenized
    together (as the model reads them at inference), the completion carrying the loss. As TRL's
    DPOTrainer: text completions end with the end-of-sequence token, conversations are rendered by
    the chat template, and the completion starts where the prompt alone and prompt + completion
    first differ (a template may render a lone prompt otherwise)."""
    if pair.chat:
        if not has_chat_template(tokenizer):
            raise DatasetError(
                f"{where} is a conversation, rendered with the model's chat template, and this "
                "tokenizer has none",
                hint="use a chat model's tokenizer, or write the pair as prompt/chosen/rejected text",
            )
        assert isinstance(pair.prompt, list) and isinstance(pair.chosen, list)
        assert isinstance(pair.rejected, list)
        prompt = _ids(tokenizer.apply_chat_template(pair.prompt, tokenize=True, add_generation_prompt=True))
        chosen = _ids(tokenizer.apply_chat_template(pair.prompt + pair.chosen, tokenize=True))
        rejected = _ids(tokenizer.apply_chat_template(pair.prompt + pair.rejected, tokenize=True))
    else:
        eos = tokenizer.eos_token
        text = str(pair.prompt)
        prompt = tokenizer(text)["input_ids"]
        chosen, rejected = (
            tokenizer(text + c + ("" if c.endswith(eos) else eos))["input_ids"]
            for c in (str(pair.chosen), str(pair.rejected))
        )
    start = min(_shared(prompt, chosen), _shared(prompt, rejected))
    for ids in (chosen, rejected):
        if len(ids) - start < 1 or len(ids) < 2:
            raise DatasetError(
                f"{where} has an empty completion: nothing to compare",
                hint="drop the pair, or give both completions some text",
            )
    for ids in (chosen, rejected):
        yield list(ids), [0] * start + [1] * (len(ids) - start)


def _ids(rendered: Any) -> list[int]:
    """Token ids from ``apply_chat_template(tokenize=True)``, a list or (transformers 5) a mapping."""
    ids = rendered["input_ids"] if not isinstance(rendered, list) else rendered
    return [int(i) for i in ids]


def _shared(a: list[int], b: list[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


def _chat_sample(tokenizer: Any, messages: list[dict[str, str]], where: str) -> tuple[list[int], list[int]]:
    """The conversation rendered by the chat template; the tokens of the assistant's turns (their
    closing token included) carry loss. A turn's characters are found by rendering the
    conversation up to it, as the model will see it at inference."""

    def render(upto: int, prompt: bool = False) -> str:
        text: str = tokenizer.apply_chat_template(
            messages[:upto], tokenize=False, add_generation_prompt=prompt
        )
        return text

    full = render(len(messages))
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start, end = len(render(i, prompt=True)), len(render(i + 1))
        if not full.startswith(render(i + 1)):
            raise DatasetError(
                f"{where}: the chat template does not render a conversation as the sum of its turns",
                hint="use data.mask_prompt: false with this template, or one that renders turn by turn",
            )
        spans.append((start, end))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    loss = [int(any(a <= first < b for a, b in spans)) for first, _ in encoded["offset_mapping"]]
    return ids, loss


def write_samples(samples: Iterator[tuple[list[int], list[int]]], dtype: type, directory: Path) -> int:
    """Append every sample to the token and loss files; returns the number of tokens."""
    starts, total = [0], 0
    tokens: list[int] = []
    flags: list[int] = []
    with (
        open(directory / "tokens-00000.bin", "wb") as token_file,
        open(directory / "loss.bin", "wb") as loss_file,
    ):

        def flush() -> None:
            np.asarray(tokens, dtype=dtype).tofile(token_file)
            np.asarray(flags, dtype=np.uint8).tofile(loss_file)
            tokens.clear()
            flags.clear()

        for ids, loss in samples:
            if len(ids) < 2:
                continue  # nothing to predict
            tokens.extend(ids)
            flags.extend(loss)
            total += len(ids)
            starts.append(total)
            if len(tokens) >= _FLUSH_TOKENS:
                flush()
        flush()
    np.save(directory / "starts.npy", np.asarray(starts, dtype=np.int64))
    return total


EVAL_BLOCK_SAMPLES = 16
"""Eval samples are held out in blocks of this many consecutive records, spread over the data."""


class SampleRows:
    """Rows of ``seq_len`` tokens, each holding whole samples (truncated to ``seq_len``), split by
    sample into train and eval. A batch is inputs, targets (``IGNORE`` where there is no loss) and,
    when packed, the position of each token within its sample.

    ``pairs``: the samples are preference pairs (chosen, then rejected), kept together: a unit of
    the data is a pair, its two rows adjacent in a batch (``[c0, r0, c1, r1, ...]``), never packed."""

    def __init__(
        self,
        directory: Path,
        pad_id: int,
        seq_len: int,
        eval_fraction: float,
        seed: int,
        packing: bool,
        pairs: bool = False,
    ) -> None:
        self.seq_len, self.seed, self.pad_id = seq_len, seed, pad_id
        self.packing, self.pairs = packing and not pairs, pairs
        self._tokens = np.fromfile(directory / "tokens-00000.bin", dtype=_dtype_of(directory))
        self._loss = np.fromfile(directory / "loss.bin", dtype=np.uint8)
        self._starts = np.load(directory / "starts.npy")
        n = (len(self._starts) - 1) // (2 if pairs else 1)
        every = max(2, round(1 / eval_fraction))
        held_out = (np.arange(n) // EVAL_BLOCK_SAMPLES) % every == every - 1
        if n > 1 and not held_out.any():  # fewer records than one block: hold out the last one
            held_out[-1] = True
        self._train_units = self._units(np.flatnonzero(~held_out))
        self._eval_units = self._units(np.flatnonzero(held_out)) or self._train_units[-1:]
        self.n_train, self.n_eval = len(self._train_units), len(self._eval_units)
        if self.n_train < 1:
            raise DatasetError(
                f"dataset has {n} records: too few for training and eval",
                hint="add records, or lower data.eval_fraction",
            )
        self._epoch_cache: tuple[int, np.ndarray] | None = None

    def _units(self, records: np.ndarray) -> list[list[list[int]]]:
        """What a batch draws from: a pair's two rows, or one row of whole samples."""
        if self.pairs:
            return [[[2 * r], [2 * r + 1]] for r in records.tolist()]
        return [[row] for row in self._rows(records)]

    def _rows(self, samples: np.ndarray) -> list[list[int]]:
        """Whole samples laid into rows in order: as many as fit per row when packing, else one."""
        lengths = np.minimum(np.diff(self._starts)[samples], self.seq_len)
        rows: list[list[int]] = []
        used = self.seq_len
        for sample, length in zip(samples.tolist(), lengths.tolist(), strict=True):
            if not self.packing or used + length > self.seq_len:
                rows.append([])
                used = 0
            rows[-1].append(sample)
            used += length
        return rows

    def _row(self, samples: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = self.seq_len
        x = np.full(s, self.pad_id, dtype=np.int64)
        y = np.full(s, IGNORE, dtype=np.int64)
        positions = np.zeros(s, dtype=np.int64)
        offset = 0
        for sample in samples:
            start, end = int(self._starts[sample]), int(self._starts[sample + 1])
            take = min(end - start, s)
            x[offset : offset + take] = self._tokens[start : start + take]
            targets = min(take, end - start - 1)  # the last token of a sample predicts nothing
            nxt = slice(start + 1, start + 1 + targets)
            y[offset : offset + targets] = np.where(
                self._loss[nxt] > 0, self._tokens[nxt].astype(np.int64), IGNORE
            )
            positions[offset : offset + take] = np.arange(take)
            offset += take
        positions[offset:] = np.arange(s - offset)  # the padding: a sample of its own
        return x, y, positions

    def _batch(self, units: list[list[list[int]]]) -> tuple[torch.Tensor, ...]:
        rows = [row for unit in units for row in unit]
        x, y, positions = (torch.from_numpy(np.stack(a)) for a in zip(*map(self._row, rows), strict=True))
        return (x, y, positions) if self.packing else (x, y)

    def train_order(self, epoch: int) -> np.ndarray:
        """The order the train units are visited in during ``epoch``: a seeded permutation."""
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._epoch_cache = (epoch, rng.permutation(self.n_train))
        return self._epoch_cache[1]

    def train_batch(self, first_sample: int, size: int) -> tuple[torch.Tensor, ...]:
        units = []
        for sample in range(first_sample, first_sample + size):
            epoch, position = divmod(sample, self.n_train)
            units.append(self._train_units[int(self.train_order(epoch)[position])])
        return self._batch(units)

    def trained_units(self, batch: tuple[torch.Tensor, ...]) -> int:
        """What the step's loss is a mean over: preference pairs, else the targets that carry a
        loss (not prompt, not padding)."""
        if self.pairs:
            return batch[0].shape[0] // 2
        return int((batch[1] != IGNORE).sum())

    def eval_batch(self, index: int, size: int) -> tuple[torch.Tensor, ...]:
        return self._batch([self._eval_units[(index * size + i) % self.n_eval] for i in range(size)])


def _dtype_of(directory: Path) -> str:
    import json

    meta: dict[str, Any] = json.loads((directory / "meta.json").read_text())
    return str(meta["dtype"])


def attention_mask(positions: torch.Tensor) -> torch.Tensor:
    """``(batch, 1, seq, seq)``, true where a token may attend: earlier tokens of its own sample
    (a sample starts where its position is 0)."""
    segments = torch.cumsum(positions == 0, dim=1)
    same = segments[:, :, None] == segments[:, None, :]
    seq = positions.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=positions.device).tril()
    return (same & causal)[:, None]
