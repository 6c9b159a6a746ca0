"""What the fine-tuning benchmarks share: the base model built offline, a Shipyard job submitted and
waited for, and the step timing and peak memory of the script they run it beside."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.support import tiny_models

WARMUP_STEPS = 2


def steady(step_times: list[float]) -> float:
    """The median step's seconds, after the warm-up steps."""
    return statistics.median(step_times[WARMUP_STEPS:])


def peak_gib(device: torch.device) -> float:
    """The process's peak memory: allocated on a GPU, resident on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def base_model(root: Path, family: str, hidden: int, layers: int) -> Path:
    """A randomly initialised ``family`` model of that size, with its tokenizer, built once."""
    base = root / f"base-{family}-{hidden}x{layers}"
    if not (base / "config.json").is_file():
        shape = {
            "hidden_size": hidden,
            "intermediate_size": hidden * 11 // 4,
            "num_hidden_layers": layers,
            "num_attention_heads": max(4, hidden // 64),
            "num_key_value_heads": max(2, hidden // 128),
        }
        tiny_models.build(base, family, **shape)
    return base


def accelerator_type(device: str) -> str:
    if device != "cuda":
        return "cpu"
    from shipyard.hardware import discover

    return next(d.accelerator_type for d in discover() if d.accelerator_type != "cpu")


def shipyard_job(
    spec: dict[str, Any], read: Callable[[Path, Path], Any] | None = None
) -> tuple[list[dict[str, Any]], Any]:
    """``shipyard jobs submit --wait`` in a home of its own: the local agent places the job, the
    runtime trains it. Returns its metrics records, and what ``read(home, run_dir)`` finds before
    the home is removed."""
    import yaml

    with tempfile.TemporaryDirectory() as home:
        path = Path(home) / "bench.yaml"
        path.write_text(yaml.safe_dump(spec))
        env = {**os.environ, "SHIPYARD_HOME": home, "SHIPYARD_AGENT_IDLE_EXIT_S": "1"}
        command = [sys.executable, "-m", "shipyard.cli.main", "jobs", "submit", str(path), "--wait", "--json"]
        job = json.loads(subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout)
        if job["state"] != "succeeded":
            raise RuntimeError(f"benchmark job {job['state']}: {job['message']}")
        run_dir = Path(job["run_dir"])
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        found = read(Path(home), run_dir) if read else None
        time.sleep(1.5)  # let the agent go idle and exit before the next measurement
    return records, found


def step_timer(device: torch.device, times: list[float]) -> Any:
    """A ``transformers`` callback appending each optimizer step's seconds to ``times``."""
    from transformers import TrainerCallback

    def settle() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *_args: Any, **_kwargs: Any) -> None:
            self.start = settle()

        def on_step_end(self, *_args: Any, **_kwargs: Any) -> None:
            times.append(settle() - self.start)

    return StepTimer()
