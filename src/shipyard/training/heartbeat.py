"""Each rank's heartbeat: from the process's first second while it starts (importing torch,
tokenizing, building the model, loading a checkpoint), and after every step (and on entering a
pause such as an eval or a checkpoint) once it trains, it replaces ``heartbeats/rank-N.json``,
which the agent reads to tell a hung attempt from a slow one, and a straggling rank from the
others."""

from __future__ import annotations

import collections
import os
import statistics
import threading
import time
from pathlib import Path

from shipyard.schemas.launch import HEARTBEAT_DIR, Heartbeat, Phase

RECENT_STEPS = 32
"""Steps the medians are taken over: long enough to ride out one slow step, short enough to see
a device that became slow."""
STARTING_BEAT_S = 2.0
"""How often a starting rank says it is alive. Its setup is a few long calls (an import of
torch took 40 s on a loaded machine) that report nothing themselves: until its first step, a
thread beats for it. A stopped or frozen process beats no more, and is found hung once its
silence passes ``restarts.startup_grace_s``; a rank waiting on a peer that died while starting
is ended by the collective's own timeout."""


class Pulse:
    """One rank's heartbeat writer."""

    def __init__(self, run_dir: Path, rank: int, step: int) -> None:
        self.path = run_dir / HEARTBEAT_DIR / f"rank-{rank}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank, self.step = rank, step
        self.phase: Phase = "setup"
        self._steps: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)
        self._computes: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)
        self._writing = threading.Lock()
        self._started = threading.Event()

    def keep_alive(self) -> None:
        """Beat every ``STARTING_BEAT_S`` from now until the first step."""
        self.enter("setup")

        def beat() -> None:
            while not self._started.wait(STARTING_BEAT_S):
                self.enter(self.phase)

        threading.Thread(target=beat, name="starting-heartbeat", daemon=True).start()

    def stepped(self, step: int, step_s: float, compute_s: float) -> None:
        self._started.set()  # from here each step is the heartbeat
        self.step = step
        self._steps.append(step_s)
        self._computes.append(compute_s)
        self.enter("step")

    def enter(self, phase: Phase) -> None:
        self.phase = phase
        beat = Heartbeat(
            rank=self.rank,
            step=self.step,
            phase=phase,
            at=time.time(),
            median_step_s=statistics.median(self._steps) if self._steps else None,
            median_compute_s=statistics.median(self._computes) if self._computes else None,
        )
        # Replaced, not fsynced: written after every step, and only a live reader needs it.
        with self._writing:
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_bytes(beat.model_dump_json().encode())
            os.replace(tmp, self.path)
