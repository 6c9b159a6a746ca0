"""Builders for test fixtures: job specs and fake vendor answers."""

from __future__ import annotations

import sysconfig
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
GAVEL_THROUGHPUTS = SHARED_DATA / "scheduling" / "gavel" / "simulation_throughputs.json"
"""Gavel's measured throughputs (steps/s per job type and GPU), read in place beside the project."""
STDLIB = Path(sysconfig.get_paths()["stdlib"])
SMALL_CORPUS = [str(STDLIB / "json" / "*.py"), str(STDLIB / "email" / "*.py")]
"""About 400 KB of Python source that every machine with Python has."""


def spec_dict(name: str = "tiny", **overrides: Any) -> dict[str, Any]:
    """A tiny, fast CPU job; ``overrides`` replace whole top-level sections or keys."""
    document: dict[str, Any] = {
        "apiVersion": "shipyard/v1",
        "name": name,
        "model": {"preset": "llama-tiny"},
        "data": {"paths": SMALL_CORPUS, "tokenizer": {"vocab_size": 512}},
        "training": {
            "steps": 8,
            "global_batch_tokens": 2048,
            "micro_batch_size": 4,
            "seq_len": 64,
            "eval_interval": 4,
            "eval_batches": 2,
            "precision": "fp32",
            "optimizer": {"lr": 0.003},
            "schedule": {"warmup_steps": 2},
        },
        "resources": {"accelerator": "cpu", "devices": 1, "cpus_per_device": 1},
        "checkpoint": {"interval": 4, "keep": 2},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(document.get(key), dict):
            document[key] = {**document[key], **value}
        else:
            document[key] = value
    return document


def write_spec(directory: Path, name: str = "tiny", **overrides: Any) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec_dict(name, **overrides), sort_keys=False))
    return path


class FakeClock:
    """A clock a test moves instead of sleeping (the services' ``Clock`` seam)."""

    def __init__(self, at: datetime | None = None) -> None:
        self.at = at or datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
        self.seconds = 0.0

    def now(self) -> datetime:
        return self.at

    def monotonic(self) -> float:
        return self.seconds

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)
        self.seconds += seconds
