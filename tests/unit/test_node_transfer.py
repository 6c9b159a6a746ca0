"""A node's own way to the artifact store (``storage.transfer``), on real local roots and a real
SQLite catalog: the node writes a checkpoint's files, the agent gets their records and commits
them, a relaunch's node reads them back; encrypted projects' keys never reach a disk unwrapped."""

from __future__ import annotations

import base64
import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shipyard.errors import Conflict, CorruptData
from shipyard.services.context import ServiceContext, open_context
from shipyard.services.storage import storage
from shipyard.settings import Settings
from shipyard.storage import config as storage_config
from shipyard.storage.transfer import HANDED, FolderTransfer

NAME = "jobs/j1/checkpoint/step-3"


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[ServiceContext]:
    home = tmp_path / "home"
    home.mkdir()
    config = storage_config.StorageConfig(
        replicas=1,
        projects={
            "secret": storage_config.ProjectStorage(encrypt=True),
            "tight": storage_config.ProjectStorage(quota_gib=0.001),
        },
    )
    storage_config.save(home, config)
    context = open_context(Settings(home=home, db_url=f"sqlite:///{home / 'db.sqlite'}"))
    yield context
    context.close()


@pytest.fixture
def node_checkpoint(tmp_path: Path) -> Path:
    """A node's part of a checkpoint: shards larger than one 4 MiB block, and a nested file."""
    folder = tmp_path / "node" / "step_000003"
    (folder / "extra").mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(os.urandom(5 * 2**20 + 17))
    (folder / "checkpoint.json").write_text(json.dumps({"step": 3}))
    (folder / "extra" / "rng.pt").write_bytes(os.urandom(100))
    return folder


def _node_writes(
    ctx: ServiceContext, project: str, folder: Path
) -> tuple[FolderTransfer, list[dict[str, Any]]]:
    # The mover crosses to the node pickled, as Ray sends it.
    mover = pickle.loads(pickle.dumps(storage.transfer_for(ctx, project)))
    return mover, mover.write(folder)


def _same_files(a: Path, b: Path) -> None:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for path in files:
        assert (a / path).read_bytes() == (b / path).read_bytes(), path


@pytest.mark.parametrize("project", ["default", "secret"])
def test_a_checkpoint_a_node_stored_is_committed_from_its_records_and_read_back_by_another_node(
    ctx: ServiceContext, node_checkpoint: Path, tmp_path: Path, project: str
) -> None:
    mover, records = _node_writes(ctx, project, node_checkpoint)
    # What reaches the agent: names, digests and sizes; no byte of the files.
    assert sorted(r["path"] for r in records) == ["__0_0.distcp", "checkpoint.json", "extra/rng.pt"]
    assert len(json.dumps(records)) < 4096
    encrypted = project == "secret"
    assert all((r["key_id"] == HANDED) == encrypted for r in records)
    kept = storage.sealed(ctx, records)  # what the agent's database keeps until the commit
    assert all(r["key_id"] != HANDED for r in kept)
    assert all((r["key"] is None) != encrypted for r in kept)

    storage.commit_written(ctx, kept, NAME, project=project, owner="alice")
    view = storage.stat(ctx, NAME, project=project)
    assert view.encrypted == encrypted and view.size_bytes == sum(r["size_bytes"] for r in records)
    storage.get(ctx, NAME, tmp_path / "got", project=project)
    _same_files(node_checkpoint, tmp_path / "got")

    # A relaunch's node reads them from the store, each verified, the folder whole or absent.
    again = mover.read(storage.handed(ctx, kept), tmp_path / "other-node" / "resume" / "step_000003")
    _same_files(node_checkpoint, again)


def test_a_damaged_record_or_one_that_leaves_its_folder_is_refused_by_the_reading_node(
    ctx: ServiceContext, node_checkpoint: Path, tmp_path: Path
) -> None:
    mover, records = _node_writes(ctx, "default", node_checkpoint)
    # A record whose block checksums are not those of the blob's bytes (a bit flipped at rest).
    wrong = base64.b64encode(b"\0\0\0\0").decode()
    damaged = [{**r, "block_crcs": wrong} if r["path"] == "checkpoint.json" else r for r in records]
    target = tmp_path / "resume" / "step_000003"
    with pytest.raises(CorruptData):
        mover.read(damaged, target)
    escaping = [{**records[0], "path": "../../outside"}]
    with pytest.raises(ValueError, match="leaves its folder"):
        mover.read(escaping, target)
    assert not target.exists() and not (tmp_path / "outside").exists()


def test_a_commit_over_the_projects_quota_is_refused_and_shows_nothing(
    ctx: ServiceContext, node_checkpoint: Path
) -> None:
    _, records = _node_writes(ctx, "tight", node_checkpoint)  # 5 MiB, past the 1 MiB quota
    with pytest.raises(Conflict, match="quota"):
        storage.commit_written(ctx, storage.sealed(ctx, records), NAME, project="tight", owner="alice")
    assert storage.list_artifacts(ctx, project="tight") == []


def test_a_nodes_cache_fetches_each_content_once_and_evicts_only_what_no_live_job_holds(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    mover = storage.transfer_for(ctx, "default")
    datasets = []
    for n in range(3):  # three stored datasets of 1 MiB each
        folder = tmp_path / f"data{n}"
        folder.mkdir()
        (folder / "part.jsonl").write_bytes(os.urandom(2**20))
        storage.put(ctx, folder, f"datasets/d{n}")
        datasets.append(folder)
    storage.put(ctx, datasets[0], "datasets/d0-again")  # the same content under another name
    with ctx.db.transaction() as session:
        inputs = {name: storage.node_input(ctx, session, name, "default")[0] for name in
                  ("datasets/d0", "datasets/d0-again", "datasets/d1", "datasets/d2")}  # fmt: skip
    cache = tmp_path / "node" / "cache"
    node = FolderTransfer(mover.config.model_copy(update={"node_cache_gib": 1.5 / 1024}), 1, False)

    first = node.cached(inputs["datasets/d0"].files, cache, "job-a")
    assert node.cached(inputs["datasets/d0-again"].files, cache, "job-b") == first  # fetched once
    _same_files(datasets[0], first)
    # A holder whose process ended holds nothing: d0 is the least recently used and goes first.
    for holder in (first.parent / "holders").iterdir():
        holder.write_text("999999999")
    second = node.cached(inputs["datasets/d1"].files, cache, "job-c")
    third = node.cached(inputs["datasets/d2"].files, cache, "job-d")  # 3 MiB > 1.5 MiB: evict
    # d1 is held by a live job (this process): the cache stays over its limit rather than take it.
    assert not first.exists() and second.is_dir() and third.is_dir()
    _same_files(datasets[2], third)
