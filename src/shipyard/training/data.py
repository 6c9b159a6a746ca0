"""Data pipeline: read text, train or load a tokenizer, tokenize once into memory-mapped shards.

Tokenization runs once per (corpus, tokenizer) and is cached by content under the cache directory,
so a resubmitted or resumed job starts training at once. Training samples are windows of
``seq_len + 1`` tokens over the concatenated stream (documents separated by the end-of-text token,
i.e. packed). Which window a step reads is a pure function of (seed, step, rank, micro-step), so the
data position of a checkpoint is just its step.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from shipyard.errors import DatasetError
from shipyard.schemas.dataset_files import files_of
from shipyard.schemas.jobspec import DataSection, JobSpec
from shipyard.schemas.records import json_kind
from shipyard.storage.digests import digest_of
from shipyard.training._atomic import staged_directory

EOS = "<|endoftext|>"
SHARD_TOKENS = 1 << 24
"""Tokens per shard file (32 MiB of uint16)."""
_ENCODE_BATCH = 256


# --- corpus -------------------------------------------------------------------------------------


def iter_documents(files: list[Path], text_field: str) -> Iterator[str]:
    """One document per text file, one per JSON line for ``.jsonl``."""
    for path in files:
        if path.suffix == ".jsonl":
            yield from _jsonl_documents(path, text_field)
        else:
            text = path.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                yield text


def _jsonl_documents(path: Path, text_field: str) -> Iterator[str]:
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    f"{path}:{number} is not valid JSON ({exc.msg})",
                    hint="each line of a .jsonl file must be one JSON object",
                ) from None
            text = record.get(text_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                there = isinstance(record, dict) and text_field in record
                raise DatasetError(
                    f"{path}:{number} field {text_field!r} is {json_kind(text)}, not text"
                    if there
                    else f"{path}:{number} has no field {text_field!r}",
                    hint="write it as a JSON string"
                    if there
                    else "set data.text_field to the field that holds the text",
                )
            if text.strip():
                yield text


def corpus_fingerprint(files: list[Path], text_field: str) -> str:
    """Content identity of the corpus, cheap enough to compute at every start (paths, sizes, mtimes)."""
    digest = hashlib.sha256(text_field.encode())
    for path in files:
        stat = path.stat()
        digest.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


# --- tokenizer ----------------------------------------------------------------------------------


def train_tokenizer(documents: Iterator[str], vocab_size: int) -> object:
    """A byte-level BPE tokenizer (GPT-2 style) trained on the documents."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return tokenizer


def job_tokenizer(spec: JobSpec) -> Path | None:
    """The tokenizer a job reads with: ``data.tokenizer.path``, else a fine-tuned model's own."""
    if spec.data.tokenizer.path:
        return Path(spec.data.tokenizer.path)
    if spec.model.path and (Path(spec.model.path) / "tokenizer.json").is_file():
        return Path(spec.model.path)
    return None


@dataclass(frozen=True, slots=True)
class TokenizedData:
    directory: Path
    tokenizer_path: Path
    vocab_size: int
    eos_id: int
    n_tokens: int
    dtype: str
    format: str = "text"
    pad_id: int = 0
    digest: str = ""
    """The content digest of the data files (for lineage)."""

    def shards(self) -> list[np.memmap]:
        paths = sorted(self.directory.glob("tokens-*.bin"))
        return [np.memmap(p, dtype=self.dtype, mode="r") for p in paths]


def prepare(
    data: DataSection,
    cache_dir: Path,
    log: object = print,
    within: list[Path] | None = None,
    tokenizer_dir: Path | None = None,
) -> TokenizedData:
    """Tokenizer and token shards for ``data``, built once and cached by content; ``within``:
    folders every data file must resolve inside; ``tokenizer_dir``: the tokenizer to use
    (``data.tokenizer.path``, else the fine-tuned model's own), or None to train one.

    Safe to call from several processes: one builds under a file lock while the others wait.
    """
    files = files_of(data, within)
    fingerprint = corpus_fingerprint(files, data.text_field)
    tok = data.tokenizer
    if tokenizer_dir is None and tok.path:
        tokenizer_dir = Path(tok.path)
    tokenizer_key = _dir_digest(tokenizer_dir) if tokenizer_dir else f"bpe-{tok.vocab_size}-{fingerprint}"
    reading = data.model_dump_json(include={"format", "fields", "messages_field", "mask_prompt"})
    key = hashlib.sha256(f"{fingerprint}\0{tokenizer_key}\0{reading}".encode()).hexdigest()[:24]
    target = cache_dir / "datasets" / key
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "meta.json").exists():
            build = _build if data.format == "text" else _build_samples
            build(files, data, target, log, tokenizer_dir)
    meta = json.loads((target / "meta.json").read_text())
    return TokenizedData(
        directory=target,
        tokenizer_path=target / "tokenizer.json",
        vocab_size=meta["vocab_size"],
        eos_id=meta["eos_id"],
        n_tokens=meta["n_tokens"],
        dtype=meta["dtype"],
        format=meta.get("format", "text"),
        pad_id=meta.get("pad_id", meta["eos_id"]),
        digest=meta.get("digest", ""),
    )


def _dir_digest(directory: Path) -> str:
    """The tokenizer's identity: its vocabulary and its config (special tokens, chat template)."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise DatasetError(
            f"tokenizer directory {directory} has no tokenizer.json",
            hint="give data.tokenizer.path a Hugging Face tokenizer folder, or drop it to train one",
        )
    digest = hashlib.sha256(path.read_bytes())
    for extra in ("tokenizer_config.json", "chat_template.jinja"):
        if (directory / extra).is_file():
            digest.update((directory / extra).read_bytes())
    return digest.hexdigest()


def _content_digest(files: list[Path]) -> str:
    """What lineage records of the data: the content of its files, whatever their names."""
    outer = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            outer.update(digest_of(f.read).encode())
    return outer.hexdigest()


def _config_eos(directory: Path) -> str | None:
    """The end-of-sequence token a Hugging Face tokenizer folder names, if any."""
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    eos = json.loads(config.read_text()).get("eos_token")
    return eos.get("content") if isinstance(eos, dict) else eos


def _build_samples(
    files: list[Path], data: DataSection, target: Path, log: object, tokenizer_dir: Path | None
) -> None:
    from shipyard.training import samples

    say = log if callable(log) else print
    if tokenizer_dir is None:
        raise DatasetError(
            f"data.format {data.format!r} needs the model's tokenizer",
            hint="fine-tune a model.path that holds its tokenizer, or set data.tokenizer.path",
        )
    tokenizer = samples.load_tokenizer(tokenizer_dir)
    vocab_size = len(tokenizer)
    dtype = np.uint16 if vocab_size < 2**16 else np.uint32
    with staged_directory(target) as staging:
        say(f"tokenizing {data.format} records from {len(files)} files")
        n_tokens = samples.write_samples(samples.encode_samples(files, data, tokenizer), dtype, staging)
        if n_tokens == 0:
            raise DatasetError(
                f"dataset {data.paths} holds no records", hint="point data.paths at JSONL records"
            )
        pad = tokenizer.pad_token_id
        meta = {
            "vocab_size": vocab_size,
            "eos_id": tokenizer.eos_token_id,
            "pad_id": tokenizer.eos_token_id if pad is None else pad,
            "n_tokens": n_tokens,
            "dtype": np.dtype(dtype).name,
            "files": len(files),
            "format": data.format,
            "digest": _content_digest(files),
        }
        (staging / "meta.json").write_text(json.dumps(meta))


def _build(
    files: list[Path], data: DataSection, target: Path, log: object, tokenizer_dir: Path | None
) -> None:
    from tokenizers import Tokenizer

    say = log if callable(log) else print
    with staged_directory(target) as staging:
        if tokenizer_dir:
            tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        else:
            say(f"training a {data.tokenizer.vocab_size}-token BPE tokenizer on {len(files)} files")
            tokenizer = train_tokenizer(iter_documents(files, data.text_field), data.tokenizer.vocab_size)  # type: ignore[assignment]
        tokenizer.save(str(staging / "tokenizer.json"))
        named = _config_eos(tokenizer_dir) if tokenizer_dir else None
        eos_id = tokenizer.token_to_id(named or EOS)
        if eos_id is None:
            eos_id = tokenizer.token_to_id("</s>")
        if eos_id is None:
            raise DatasetError(
                f"tokenizer has neither {EOS!r} nor '</s>' as a token",
                hint="use a tokenizer with an end-of-text token, or let Shipyard train one",
            )
        vocab_size = tokenizer.get_vocab_size()
        dtype = np.uint16 if vocab_size < 2**16 else np.uint32
        say("tokenizing the corpus into memory-mapped shards")
        documents = iter_documents(files, data.text_field)
        n_tokens = _write_shards(tokenizer, documents, eos_id, dtype, staging)
        if n_tokens == 0:
            raise DatasetError(
                f"dataset {data.paths} holds no text", hint="point data.paths at non-empty files"
            )
        meta = {
            "vocab_size": vocab_size,
            "eos_id": eos_id,
            "n_tokens": n_tokens,
            "dtype": np.dtype(dtype).name,
            "files": len(files),
            "digest": _content_digest(files),
        }
        (staging / "meta.json").write_text(json.dumps(meta))


def _write_shards(
    tokenizer: object, documents: Iterator[str], eos_id: int, dtype: type, directory: Path
) -> int:
    buffer: list[int] = []
    shard_index = total = 0

    def flush(final: bool) -> None:
        nonlocal buffer, shard_index
        while len(buffer) >= SHARD_TOKENS or (final and buffer):
            chunk, buffer = buffer[:SHARD_TOKENS], buffer[SHARD_TOKENS:]
            np.asarray(chunk, dtype=dtype).tofile(directory / f"tokens-{shard_index:05d}.bin")
            shard_index += 1

    batch: list[str] = []
    for document in documents:
        batch.append(document)
        if len(batch) == _ENCODE_BATCH:
            total += _encode_into(tokenizer, batch, eos_id, buffer)
            batch = []
            flush(final=False)
    if batch:
        total += _encode_into(tokenizer, batch, eos_id, buffer)
    flush(final=True)
    return total


def _encode_into(tokenizer: object, batch: list[str], eos_id: int, buffer: list[int]) -> int:
    before = len(buffer)
    for encoding in tokenizer.encode_batch(batch):  # type: ignore[attr-defined]
        buffer.extend(encoding.ids)
        buffer.append(eos_id)
    return len(buffer) - before


# --- sampling -----------------------------------------------------------------------------------


EVAL_BLOCK_WINDOWS = 16
"""Eval windows are held out in blocks of this many consecutive windows, spread over the corpus."""


class TokenWindows:
    """Fixed-length windows over the token stream, split into train and eval.

    Every ``round(1 / eval_fraction)``-th block of consecutive windows is held out for eval, so
    the eval split samples the whole corpus (not just its last files) while train and eval never
    share a token. Train windows are visited in a fresh seeded permutation each epoch.
    """

    def __init__(self, data: TokenizedData, seq_len: int, eval_fraction: float, seed: int) -> None:
        self.seq_len, self.seed = seq_len, seed
        self._shards = data.shards()
        self._offsets = np.cumsum([0] + [len(s) for s in self._shards])
        n_windows = (data.n_tokens - 1) // seq_len
        every = max(2, round(1 / eval_fraction))
        block = np.arange(n_windows) // EVAL_BLOCK_WINDOWS
        held_out = (block % every) == every - 1
        if not held_out.any():  # a corpus of fewer blocks: hold out its last window
            held_out[-1:] = True
        self._train_ids = np.flatnonzero(~held_out)
        self._eval_ids = np.flatnonzero(held_out)
        self.n_train, self.n_eval = len(self._train_ids), len(self._eval_ids)
        if self.n_train < 1:
            raise DatasetError(
                f"dataset has {data.n_tokens} tokens: too few for one training and one eval "
                f"sequence of {seq_len} tokens",
                hint="add more text or lower training.seq_len",
            )
        self._epoch_cache: tuple[int, np.ndarray] | None = None

    def _tokens(self, start: int, length: int) -> np.ndarray:
        pieces, end = [], start + length
        shard = int(np.searchsorted(self._offsets, start, side="right")) - 1
        while start < end:
            local = start - int(self._offsets[shard])
            take = min(end - start, len(self._shards[shard]) - local)
            pieces.append(self._shards[shard][local : local + take])
            start += take
            shard += 1
        return np.concatenate(pieces).astype(np.int64)

    def _window(self, index: int) -> np.ndarray:
        return self._tokens(index * self.seq_len, self.seq_len + 1)

    def train_window_id(self, sample: int) -> int:
        """The window the ``sample``-th training sample reads (a pure function of seed and sample)."""
        epoch, position = divmod(sample, self.n_train)
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._epoch_cache = (epoch, rng.permutation(self.n_train))
        return int(self._train_ids[self._epoch_cache[1][position]])

    def eval_window_id(self, index: int) -> int:
        return int(self._eval_ids[index % self.n_eval])

    def train_batch(self, first_sample: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of train samples ``first_sample .. first_sample + size - 1``."""
        ids = [self.train_window_id(first_sample + i) for i in range(size)]
        return _split(np.stack([self._window(i) for i in ids]))

    def trained_units(self, batch: tuple[torch.Tensor, ...]) -> int:
        """Every target of a window is trained."""
        return batch[1].numel()

    def eval_batch(self, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``index``-th eval batch (wrapping around a small eval split)."""
        ids = [self.eval_window_id(index * size + i) for i in range(size)]
        return _split(np.stack([self._window(i) for i in ids]))


def _split(rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    tensor = torch.from_numpy(rows)
    return tensor[:, :-1].contiguous(), tensor[:, 1:].contiguous()
