"""``shipyard quickstart``: a code model trained on the Python standard library's own source.

Every machine with Python has that corpus, so the first run needs no network and no download.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path

from shipyard.schemas.jobspec import JobSpec, validate_job_spec
from shipyard.services.context import ServiceContext

CPU_CORPUS_BYTES = 3 * 2**20
GPU_CORPUS_BYTES = 24 * 2**20


def corpus(home: Path, max_bytes: int) -> Path:
    """Copy standard-library modules (sorted, up to ``max_bytes``) into ``home``, once."""
    target = home / "quickstart" / f"corpus-{max_bytes // 2**20}mb"
    if target.is_dir():
        return target
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    staging = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    total = 0
    sources = sorted(
        p for p in stdlib.rglob("*.py") if "test" not in p.parts and "site-packages" not in p.parts
    )
    for source in sources:
        size = source.stat().st_size
        if total + size > max_bytes:
            continue
        relative = source.relative_to(stdlib)
        destination = staging / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, destination)
        total += size
    os.replace(staging, target)
    return target


def spec(ctx: ServiceContext, *, steps: int | None = None, preset: str | None = None) -> JobSpec:
    """The quickstart job for this node: small on CPUs, bigger and longer when a GPU is found."""
    gpus = [d for d in ctx.devices() if d.accelerator_type != "cpu"]
    if gpus:
        data_dir = corpus(ctx.settings.home, GPU_CORPUS_BYTES)
        model, seq_len, micro, batch, default_steps, lr = "llama-25m", 512, 16, 65536, 600, 2e-3
        accelerator = gpus[0].accelerator_type
    else:
        data_dir = corpus(ctx.settings.home, CPU_CORPUS_BYTES)
        model, seq_len, micro, batch, default_steps, lr = "llama-12m", 128, 16, 2048, 400, 3e-3
        accelerator = "cpu"
    total = steps or default_steps
    document = {
        "apiVersion": "shipyard/v1",
        "name": "quickstart",
        "model": {"preset": preset or model},
        "data": {"paths": [str(data_dir)], "tokenizer": {"vocab_size": 4096}},
        "training": {
            "steps": total,
            "global_batch_tokens": batch,
            "micro_batch_size": micro,
            "seq_len": seq_len,
            "optimizer": {"lr": lr, "weight_decay": 0.1},
            "schedule": {
                "warmup_steps": max(1, total // 12),
                "decay": "cosine",
                "min_lr_ratio": 0.1,
            },
            "eval_interval": max(1, total // 6),
            "eval_batches": 8,
        },
        "resources": {"accelerator": accelerator, "devices": 1},
        "checkpoint": {"interval": max(1, total // 3), "keep": 2},
    }
    return validate_job_spec(document, source="quickstart spec")
