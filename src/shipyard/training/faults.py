"""Faults injected into an attempt on purpose, from ``$SHIPYARD_FAULTS`` (JSON): how the chaos
benchmark and the tests cause what this machine would not by itself — an out-of-memory error
of a device it lacks, a collective that never returns, one slow device among several.

``{"attempts": [1], "oom_above_micro_batch": 4, "hang_at_step": 6, "slow_rank": 1, "slow_s": 0.2}``:
on the first attempt only, a micro-batch above 4 runs out of memory, step 6 never ends, and
rank 1 spends 0.2 s more on each forward pass. ``stall_checkpoint_at_step`` leaves that step's
checkpoint half-written for good; ``raise_at_step`` raises an exception of the job's own there.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from shipyard.schemas.launch import FAULTS_ENV


@dataclass(frozen=True, slots=True)
class Faults:
    oom_above_micro_batch: int | None = None
    hang_at_step: int | None = None
    slow_rank: int | None = None
    slow_s: float = 0.0
    stall_checkpoint_at_step: int | None = None
    raise_at_step: int | None = None

    @classmethod
    def of_attempt(cls, attempt: int) -> Faults:
        text = os.environ.get(FAULTS_ENV)
        if not text:
            return cls()
        given = json.loads(text)
        if attempt not in given.pop("attempts", [attempt]):
            return cls()
        return cls(**given)

    def before_forward(self, step: int, rank: int, micro_batch_size: int) -> None:
        """Called before each forward pass of optimizer step ``step`` (1-based)."""
        if self.oom_above_micro_batch is not None and micro_batch_size > self.oom_above_micro_batch:
            raise torch.OutOfMemoryError(
                f"injected: a micro-batch of {micro_batch_size} does not fit "
                f"(more than {self.oom_above_micro_batch})"
            )
        if step == self.raise_at_step:
            raise RuntimeError(f"injected: step {step} fails")
        if step == self.hang_at_step:
            print(f"injected: step {step} hangs", flush=True)
            while True:  # like a collective whose peer never answers
                time.sleep(3600)
        if rank == self.slow_rank:
            time.sleep(self.slow_s)

    def checkpoint_writer(self, step: int, path: Path) -> Any:
        """DCP's writer for the checkpoint of ``step``, or None for the default one. Asked to stall
        there, it writes every shard and then never writes their index (``.metadata``): the
        attempt can be killed mid-write, with training going on meanwhile."""
        if step != self.stall_checkpoint_at_step:
            return None
        from torch.distributed.checkpoint.filesystem import FileSystemWriter

        class Stalling(FileSystemWriter):
            def finish(self, metadata: Any, results: Any) -> None:
                del metadata, results
                print(f"injected: the checkpoint of step {step} stalls before its index", flush=True)
                while True:
                    time.sleep(3600)

        return Stalling(str(path))
