from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shipyard.errors import DatasetError
from shipyard.schemas.jobspec import DataSection
from shipyard.training.data import EOS, TokenWindows, prepare


def corpus(tmp_path: Path, docs: int = 40) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(docs):
        (root / f"doc{i:03d}.txt").write_text(
            f"document {i}: " + "the quick brown fox jumps over the lazy dog. " * 20
        )
    return root


def prepared(tmp_path: Path, **data: object) -> object:
    section = DataSection.model_validate(
        {"paths": [str(corpus(tmp_path))], "tokenizer": {"vocab_size": 300}, **data}
    )
    return prepare(section, tmp_path / "cache", log=lambda _: None)


def test_tokenizes_once_and_reuses_the_cache(tmp_path: Path) -> None:
    data = prepared(tmp_path)
    shard = next(data.directory.glob("tokens-*.bin"))
    mtime = shard.stat().st_mtime_ns
    section = DataSection.model_validate(
        {"paths": [str(tmp_path / "corpus")], "tokenizer": {"vocab_size": 300}}
    )
    again = prepare(
        section,
        tmp_path / "cache",
        log=lambda _: (_ for _ in ()).throw(AssertionError("re-tokenized")),
    )
    assert again.directory == data.directory and shard.stat().st_mtime_ns == mtime


def test_documents_are_packed_with_end_of_text_between_them(tmp_path: Path) -> None:
    data = prepared(tmp_path)
    tokens = np.concatenate(data.shards())
    assert data.n_tokens == len(tokens)
    assert int((tokens == data.eos_id).sum()) == 40
    assert tokens[-1] == data.eos_id
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(data.tokenizer_path)).token_to_id(EOS) == data.eos_id


def test_windows_are_deterministic_per_seed_and_reshuffled_each_epoch(tmp_path: Path) -> None:
    data = prepared(tmp_path)
    a = TokenWindows(data, seq_len=16, eval_fraction=0.1, seed=1)
    b = TokenWindows(data, seq_len=16, eval_fraction=0.1, seed=1)
    c = TokenWindows(data, seq_len=16, eval_fraction=0.1, seed=2)
    x1, y1 = a.train_batch(0, 4)
    x2, _ = b.train_batch(0, 4)
    x3, _ = c.train_batch(0, 4)
    assert x1.equal(x2) and not x1.equal(x3)
    assert x1[:, 1:].equal(y1[:, :-1])  # targets are inputs shifted by one
    epoch0 = [a.train_window_id(i) for i in range(a.n_train)]
    epoch1 = [a.train_window_id(a.n_train + i) for i in range(a.n_train)]
    assert sorted(epoch0) == sorted(epoch1) and len(set(epoch0)) == a.n_train and epoch0 != epoch1


def test_eval_windows_are_held_out_from_training(tmp_path: Path) -> None:
    data = prepared(tmp_path)
    windows = TokenWindows(data, seq_len=16, eval_fraction=0.1, seed=0)
    assert windows.n_eval >= 16
    train_ids = {windows.train_window_id(i) for i in range(windows.n_train)}
    eval_ids = {windows.eval_window_id(i) for i in range(windows.n_eval)}
    assert not train_ids & eval_ids
    assert len(train_ids) + len(eval_ids) == (data.n_tokens - 1) // 16
    assert min(eval_ids) < len(train_ids) // 2 < max(eval_ids)  # spread over the corpus
    x, _ = windows.eval_batch(0, 2)
    stream = np.concatenate(data.shards())
    first = windows.eval_window_id(0) * 16
    assert x[0].numpy().tolist() == stream[first : first + 16].tolist()


def test_windows_cross_shard_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shipyard.training.data as data_module

    monkeypatch.setattr(data_module, "SHARD_TOKENS", 100)
    data = prepared(tmp_path)
    assert len(data.shards()) > 3
    windows = TokenWindows(data, seq_len=64, eval_fraction=0.1, seed=0)
    stream = np.concatenate(data.shards())
    for i in range(windows.n_train):
        x, _ = windows.train_batch(i, 1)
        start = windows.train_window_id(i) * 64
        assert x[0].numpy().tolist() == stream[start : start + 64].tolist()


def test_jsonl_reads_the_text_field_and_names_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"body": f"record {i} " * 30}) for i in range(30)) + "\n")
    good = DataSection.model_validate(
        {"paths": [str(path)], "text_field": "body", "tokenizer": {"vocab_size": 300}}
    )
    assert prepare(good, tmp_path / "cache", log=lambda _: None).n_tokens > 0
    bad = DataSection.model_validate({"paths": [str(path)], "tokenizer": {"vocab_size": 300}})
    with pytest.raises(DatasetError, match=r"d.jsonl:1 has no field 'text'"):
        prepare(bad, tmp_path / "cache2", log=lambda _: None)


def test_a_dataset_too_small_for_one_sequence_says_so(tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_text("tiny")
    section = DataSection.model_validate(
        {"paths": [str(tmp_path / "one.txt")], "tokenizer": {"vocab_size": 260}}
    )
    data = prepare(section, tmp_path / "cache", log=lambda _: None)
    with pytest.raises(DatasetError, match="too few for one training and one eval sequence"):
        TokenWindows(data, seq_len=256, eval_fraction=0.1, seed=0)
