"""The Slurm executor beside a hand-written ``sbatch`` script, side by side in one run.

1. Submit to first training step of the same 2-process job (one rank on each of two Slurm
   nodes): a hand-written batch script that ``srun``s the runtime, submitted with ``sbatch``,
   against ``shipyard jobs submit`` through the Slurm executor (the agent admits it, writes its
   launch plan and batch script, and submits it with ``sbatch``).
2. Steady tokens/s of that 2-node job, a checkpoint every 20 steps: Shipyard against the same
   runtime under the hand-written script.

    .venv/bin/python benchmarks/slurm_executor.py [--rounds 2] [--json]

Slurm is the tests' own (``tests/support/slurm_cluster.py``: Debian's slurm-wlm, a slurmctld and
two slurmd on this machine, GPUs as GRES over device files that are not GPUs; ranks on the CPU).
Needs root and ``apt-get install slurm-wlm``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the Slurm harness is the tests' (tests/support)
sys.path.insert(0, str(ROOT / "benchmarks"))
from cluster_executor import Home, first_step_s, steady_tokens_per_s  # noqa: E402

from shipyard.schemas.jobspec import validate_job_spec  # noqa: E402
from shipyard.schemas.launch import LaunchPlan  # noqa: E402
from tests.builders import spec_dict  # noqa: E402
from tests.conftest import agents_of  # noqa: E402
from tests.support.slurm_cluster import SlurmCluster, SlurmNode  # noqa: E402

SPREAD = {"accelerator": "h100-sxm", "devices": 1, "nodes": 2, "cpus_per_device": 1}
HAND_WRITTEN = """#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --gres=gpu:h100:1 --mem=1000M
export MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=
srun bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS LOCAL_WORLD_SIZE=1 \\
  exec {python} -m shipyard.training {run_dir}'
"""
"""What a user would write by hand for the same job (the master is the first node's address)."""


def hand_written(slurm: SlurmCluster, base: Path, spec: dict[str, Any]) -> tuple[float, float]:
    """Seconds from ``sbatch`` to the first step, and steady tokens/s, of the hand-written script."""
    run_dir = base / "hand"
    run_dir.mkdir(parents=True, exist_ok=True)
    LaunchPlan(
        job_id=run_dir.name, attempt=1, spec=validate_job_spec(spec), run_dir=str(run_dir),
        cache_dir=str(base.parent / "cache"), accelerator_type="h100-sxm", torch_device="cpu", world_size=2,
        threads_per_process=1, peak_tflops_bf16=989, peak_tflops_fp32=67,
    ).write(run_dir)  # fmt: skip
    script = run_dir / "job.sh"
    script.write_text(HAND_WRITTEN.format(python=sys.executable, run_dir=run_dir))
    started = time.perf_counter()
    job_id = slurm.slurm("sbatch", "--parsable", f"--output={run_dir}/slurm.log", str(script)).stdout.strip()
    first = first_step_s(run_dir / "metrics.jsonl", started)
    while slurm.slurm("squeue", "--noheader", f"--jobs={job_id}", check=False).stdout.strip():
        time.sleep(0.5)
    if not (run_dir / "result.json").exists():
        raise RuntimeError(f"the hand-written job failed: {(run_dir / 'slurm.log').read_text()[-2000:]}")
    return first, steady_tokens_per_s(run_dir / "metrics.jsonl")


def best(rounds: int, measure: Callable[[int], tuple[float, float]]) -> tuple[float, float]:
    """The quickest first step and the highest steady rate over ``rounds``."""
    runs = [measure(i) for i in range(rounds)]
    return min(r[0] for r in runs), max(r[1] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="shipyard-slurm-bench-"))
    slurm = SlurmCluster(base / "slurm", nodes=(SlurmNode("n1", "h100", 2), SlurmNode("n2", "h100", 2)))
    slurm.start()
    try:
        spec = spec_dict(
            training={"eval_interval": 0, "steps": 40}, resources=SPREAD, checkpoint={"interval": 20}
        )
        env = {
            **slurm.env(),
            "SHIPYARD_EXECUTOR": "slurm",
            "SHIPYARD_SLURM_GRES_TYPES": "h100=h100-sxm",
            "SHIPYARD_SLURM_EMULATED_GPUS": "1",
        }
        home = Home(base / "home", env, None)
        warm = spec | {"training": {**spec["training"], "steps": 1}}
        hand_written(slurm, base / "warm", warm)  # tokenizer and shards cached, files in the page cache

        def through_shipyard(i: int) -> tuple[float, float]:
            job_id, started = home.submit(spec, f"first-{i}")
            first = first_step_s(home.metrics(job_id), started)
            home.wait(job_id)
            return first, steady_tokens_per_s(home.metrics(job_id))

        hand = best(args.rounds, lambda i: hand_written(slurm, base / f"hand-{i}", spec))
        ours = best(args.rounds, through_shipyard)
    finally:
        for pid in agents_of(base / "home"):  # before Slurm: an agent whose engine is gone stays
            os.kill(pid, signal.SIGTERM)
        slurm.stop()
    results = {
        "machine": f"{platform.node()} {os.cpu_count()} cores",
        "first_step_s": {"sbatch_by_hand": hand[0], "shipyard": ours[0], "ratio": ours[0] / hand[0]},
        "steady_tokens_per_s": {"srun_by_hand": hand[1], "shipyard": ours[1], "ratio": ours[1] / hand[1]},
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    first, steady = results["first_step_s"], results["steady_tokens_per_s"]
    print(
        f"submit -> first step: sbatch by hand {first['sbatch_by_hand']:.2f} s, "
        f"shipyard {first['shipyard']:.2f} s: {first['ratio']:.2f}x (target <= 1.5x)"
    )
    print(
        f"steady tokens/s, 2 nodes: srun by hand {steady['srun_by_hand']:,.0f}, "
        f"shipyard {steady['shipyard']:,.0f}: {steady['ratio']:.3f} (target >= 0.95)"
    )


if __name__ == "__main__":
    main()
