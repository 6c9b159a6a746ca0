"""Sharded, asynchronous, resumable checkpoints (``torch.distributed.checkpoint``).

A checkpoint is a directory ``step_000123``: every rank's shards of the model and the optimizer
(``__R_0.distcp`` and DCP's ``.metadata``), the trainer's own state (``trainer.pt``: LR schedule,
step, every rank's RNG) and ``checkpoint.json``, which says what it holds. Every rank writes its own
shards, in the background while training goes on: nothing is gathered on one process.

The ranks write into ``step_000123.tmp``; once all of them are done, rank 0 adds
``checkpoint.json``, fsyncs and renames the folder, and only then names it in ``latest`` (itself
replaced atomically). A kill at any point leaves the previous checkpoint as ``latest`` and no
half-written folder under a final name. On nodes that do not share rank 0's disk, each node's first
rank renames its own part; the executor brings the parts together.

Resuming reads into whatever layout the job has now (another device count, tensor parallel or
not): DCP reshards. A checkpoint of an earlier Shipyard (one ``state.pt``) still loads.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from shipyard.durable import fsync_dir, fsync_file
from shipyard.errors import CheckpointError
from shipyard.schemas.launch import CHECKPOINT_MARKER as MARKER
from shipyard.schemas.launch import CHECKPOINT_POINTER as LATEST
from shipyard.schemas.launch import CHECKPOINT_STATE_FILE as LEGACY_STATE_FILE
from shipyard.schemas.launch import latest_checkpoint
from shipyard.training import parallel
from shipyard.training.faults import Faults
from shipyard.training.parallel import Dist

__all__ = ["Checkpointer", "latest", "rng_state", "set_rng_state", "step_dir_name"]

TRAINER_FILE = "trainer.pt"
OWNER_FILE = ".owner"
"""In a staging folder: the host of rank 0, so that a node sharing its disk leaves the rename to it."""


def latest(directory: Path) -> Path | None:
    """The newest complete checkpoint under ``directory``, or None."""
    return latest_checkpoint(directory)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


class Checkpointer:
    """Writes a job's checkpoints into ``directory`` and reads them back, on every rank."""

    def __init__(
        self,
        directory: Path,
        d: Dist,
        keep: int,
        *,
        trainable_only: bool = False,
        faults: Faults | None = None,
    ) -> None:
        self.directory = directory
        self.faults = faults or Faults()
        self.d = d
        self.keep = keep
        self.trainable_only = trainable_only
        """Adapters: the trained parameters alone (and their optimizer state), not the frozen base."""
        self.kept: set[str] = set()
        """Checkpoints never pruned, by folder name: early stopping's best."""
        self._pending: Future[None] | None = None
        """The checkpoint being written in the background: done once it is committed."""
        self._stager: Any = None
        """Host memory the background writes copy the state into, kept from one checkpoint to the
        next (pinned on GPUs): allocating it anew each time costs more than the copy."""

    # -- saving --------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        trainer_state: dict[str, Any],
        description: dict[str, Any],
        *,
        background: bool,
        on_commit: Any = None,
    ) -> Path:
        """Write the checkpoint of ``step`` (every rank calls); ``background``: return once the
        state is copied to host memory and write it while training goes on. ``description``
        becomes ``checkpoint.json``; ``on_commit(path)`` runs on rank 0 once it is complete."""
        from torch.distributed.checkpoint import state_dict_saver

        self.wait()  # one write at a time: the previous one is whole before the next starts
        d = self.d
        final = self.directory / step_dir_name(step)
        staging = final.with_name(final.name + ".tmp")
        commits = self._prepare(staging)
        rngs = _gather_rng(d)
        model_state, optim_state = self._state(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        where = {
            "checkpoint_id": str(staging),
            "process_group": d.checkpoint_group,
            "storage_writer": self.faults.checkpoint_writer(step, staging),
        }
        try:
            if d.is_main:
                with open(staging / TRAINER_FILE, "wb") as f:
                    torch.save({**trainer_state, "step": step, "rng_by_rank": rngs}, f)
            # Written from a copy in host memory either way: DCP writes a copy faster than the
            # live tensors, and the copy's buffers are kept for the next checkpoint.
            future = state_dict_saver.async_save(state, **where, async_stager=self._staging_buffers())
        except (OSError, RuntimeError) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise _write_error(final, exc) from exc
        meta = {**description, "step": step, "world_size": d.world_size, "layout": _layout(d)}

        committed: Future[None] = Future()

        def commit(written: Future[Any]) -> None:
            try:
                written.result()
                if commits:
                    self._commit(staging, final, meta if d.is_main else None)
                if d.is_main and on_commit is not None:
                    on_commit(final)
                committed.set_result(None)
            except BaseException as exc:  # raised again in the loop, by the next save or wait
                shutil.rmtree(staging, ignore_errors=True)
                committed.set_exception(exc)

        self._pending = committed
        assert isinstance(future, Future)
        future.add_done_callback(commit)
        if not background:
            self.wait()
        return final

    def _staging_buffers(self) -> Any:
        if self._stager is not None and _closed(self._stager):
            self._stager = None
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            gpu = self.d.device.type == "cuda"
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=gpu,
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=gpu,
                )
            )
        return self._stager

    def close(self) -> None:
        """Wait for the checkpoint being written and free the host memory kept for the next."""
        try:
            self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None

    def wait(self) -> None:
        """Until the checkpoint being written is complete; raises if writing it failed."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.result()
        except CheckpointError:
            raise
        except BaseException as exc:
            raise _write_error(self.directory, exc) from exc

    def _prepare(self, staging: Path) -> bool:
        """An empty staging folder on every disk the ranks write to; whether this rank renames
        it when done (rank 0, and the first rank of each node that does not share its disk)."""
        d = self.d
        if d.is_main:
            _fresh(staging)
            (staging / OWNER_FILE).write_text(socket.gethostname())
        parallel.barrier(d)
        commits = d.is_main
        if d.local_rank == 0 and not d.is_main and not (staging / OWNER_FILE).exists():
            _fresh(staging)
            commits = True
        parallel.barrier(d)
        return commits

    def _commit(self, staging: Path, final: Path, meta: dict[str, Any] | None) -> None:
        try:
            if meta is not None:
                (staging / MARKER).write_text(json.dumps(meta, indent=2) + "\n")
            (staging / OWNER_FILE).unlink(missing_ok=True)
            for path in staging.iterdir():
                fsync_file(path)
            fsync_dir(staging)
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
            fsync_dir(self.directory)
            if meta is not None:
                _write_latest(self.directory, final.name)
        except OSError as exc:
            raise _write_error(final, exc) from exc
        self._prune()

    def _prune(self) -> None:
        steps = sorted(p for p in self.directory.glob("step_*") if ".tmp" not in p.name)
        for old in steps[: -self.keep]:
            if old.name not in self.kept:
                shutil.rmtree(old, ignore_errors=True)

    def _state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(ignore_frozen_params=self.trainable_only)
        return get_state_dict(model, optimizer, options=options)

    # -- loading -------------------------------------------------------------------------------

    def load(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Read ``path`` into the model and optimizer as they are spread now; returns the
        trainer's state (``step``, ``scheduler``, ``rng_by_rank``, ...)."""
        if (path / LEGACY_STATE_FILE).is_file() and not (path / MARKER).is_file():
            return self._load_legacy(path, model, optimizer)
        if not (path / MARKER).is_file() or not (path / TRAINER_FILE).is_file():
            raise CheckpointError(
                f"{path} is not a checkpoint (no {MARKER})",
                hint="resume from a job's checkpoint directory, e.g. RUN_DIR/checkpoints/step_000100",
            )
        from torch.distributed.checkpoint import state_dict_loader
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        model_state, optim_state = self._state(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        try:
            state_dict_loader.load(state, checkpoint_id=str(path), process_group=self.d.checkpoint_group)
        except (Exception, CheckpointException) as exc:  # the latter is a BaseException
            raise _load_error(path, exc) from exc
        options = StateDictOptions(strict=not self.trainable_only)
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=options,
        )
        trainer: dict[str, Any] = torch.load(path / TRAINER_FILE, map_location="cpu", weights_only=False)
        return trainer

    def _load_legacy(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """A whole-state ``state.pt`` of an earlier Shipyard, loaded into any layout."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        try:
            state: dict[str, Any] = torch.load(
                path / LEGACY_STATE_FILE, map_location="cpu", weights_only=False
            )
        except Exception as exc:
            raise CheckpointError(f"checkpoint {path} cannot be read: {exc}") from exc
        options = StateDictOptions(full_state_dict=True, strict=not self.trainable_only)
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state.pop("model"),
            optim_state_dict=_by_name(state.pop("optimizer"), model, optimizer),
            options=options,
        )
        return state


MISMATCH_WORDS = ("missing key", "unexpected key", "size mismatch", "shape mismatch")
"""How torch.distributed.checkpoint says a checkpoint's tensors are not this model's."""


def _load_error(path: Path, exc: BaseException) -> CheckpointError:
    """A checkpoint of another model, or one whose files cannot be read: said as such. A
    ``CheckpointException`` carries each rank's own exception; the first one says what happened."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        found = next(iter(failures.values()))
        exc = found[0] if isinstance(found, tuple) and found and isinstance(found[0], BaseException) else exc
    first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    if any(word in str(exc).lower() for word in MISMATCH_WORDS):
        return CheckpointError(
            f"checkpoint {path} does not fit this model: {first}",
            hint="resume onto the model and fine-tuning method it was written by "
            "(any device count or parallelism works)",
        )
    return CheckpointError(
        f"checkpoint {path} cannot be read: {first}",
        hint="its files are damaged or incomplete: resume from another checkpoint of the job "
        "(RUN_DIR/checkpoints), or from the artifact store's copy",
    )


def _by_name(
    optim_state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """An optimizer state keyed by parameter number (``Optimizer.state_dict``, as an unsharded
    model's checkpoint had it) keyed by parameter name instead, which any layout loads."""
    if not all(isinstance(key, int) for key in optim_state["state"]):
        return optim_state
    from shipyard.training.parallelize import clean_name

    names = {id(param): clean_name(name) for name, param in model.named_parameters()}
    order = [names[id(param)] for group in optimizer.param_groups for param in group["params"]]
    groups = []
    for saved in optim_state["param_groups"]:
        groups.append({**saved, "params": [order[index] for index in saved["params"]]})
    return {
        "state": {order[key]: value for key, value in optim_state["state"].items()},
        "param_groups": groups,
    }


def read_whole(path: Path, part: str = "model") -> dict[str, torch.Tensor]:
    """Every tensor of ``part`` (``model`` or ``optimizer``) of a checkpoint, whole, by name, in
    this one process: for tools and checks, not for training (which reads its own shards)."""
    from torch.distributed.checkpoint import state_dict_loader
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if (path / LEGACY_STATE_FILE).is_file() and not (path / MARKER).is_file():
        legacy: dict[str, torch.Tensor] = torch.load(path / LEGACY_STATE_FILE, weights_only=False)[part]
        return legacy
    metadata = FileSystemReader(str(path)).read_metadata()
    wanted = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith(f"{part}.") and isinstance(meta, TensorStorageMetadata)
    }
    state_dict_loader.load(wanted, checkpoint_id=str(path), no_dist=True)
    return {key.removeprefix(f"{part}."): value for key, value in wanted.items()}


def _layout(d: Dist) -> dict[str, int]:
    return {
        "tp": d.layout.tp or 1,
        "dp_shard": d.layout.dp_shard or 1,
        "dp_replicate": d.layout.dp_replicate or 1,
    }


def _fresh(folder: Path) -> None:
    """An empty folder (a killed attempt may have left a half-written one of the same name)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def _write_latest(directory: Path, name: str) -> None:
    tmp = directory / f".{LATEST}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / LATEST)
    fsync_dir(directory)


def _write_error(final: Path, exc: BaseException) -> CheckpointError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0][:300]
    return CheckpointError(
        f"could not write checkpoint {final}: {reason}",
        hint="free disk space under the job's run directory; the previous checkpoint is intact",
    )


def _gather_rng(d: Dist) -> list[dict[str, Any]]:
    state = rng_state()
    if not d.enabled:
        return [state]
    import torch.distributed as dist

    gathered: list[Any] = [None] * d.world_size
    dist.all_gather_object(gathered, state)
    return gathered


def _closed(stager: Any) -> bool:
    """Whether torch closed a stager it was given: ``async_save`` of some versions (2.11 among them)
    closes even a caller's stager after one use, which empties its copy table (the next save then
    fails on the first class it meets); later versions close only a stager of their own."""
    table = getattr(getattr(stager, "_state_dict_stager", None), "_deepcopy_dispatch", None)
    return table is not None and not table
