"""Each rank's heartbeat: after every step (and on entering a pause such as an eval or a
checkpoint) it replaces ``heartbeats/rank-N.json``, which the agent reads to tell a hung
attempt from a slow one, and a straggling rank from the others."""

from __future__ import annotations

import collections
import os
import statistics
import time
from pathlib import Path

from shipyard.schemas.launch import HEARTBEAT_DIR, Heartbeat, Phase

RECENT_STEPS = 32
"""Steps the medians are taken over: long enough to ride out one slow step, short enough to see
a device that became slow."""


class Pulse:
    """One rank's heartbeat writer."""

    def __init__(self, run_dir: Path, rank: int, step: int) -> None:
        self.path = run_dir / HEARTBEAT_DIR / f"rank-{rank}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank, self.step = rank, step
        self._steps: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)
        self._computes: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)

    def stepped(self, step: int, step_s: float, compute_s: float) -> None:
        self.step = step
        self._steps.append(step_s)
        self._computes.append(compute_s)
        self.enter("step")

    def enter(self, phase: Phase) -> None:
        beat = Heartbeat(
            rank=self.rank,
            step=self.step,
            phase=phase,
            at=time.time(),
            median_step_s=statistics.median(self._steps) if self._steps else None,
            median_compute_s=statistics.median(self._computes) if self._computes else None,
        )
        # Replaced, not fsynced: written after every step, and only a live reader needs it.
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_bytes(beat.model_dump_json().encode())
        os.replace(tmp, self.path)
