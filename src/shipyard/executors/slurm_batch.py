"""What an allocation runs and where it goes: the batch script ``sbatch`` is handed (the rendezvous,
one ``srun`` step of ranks, Slurm's signals forwarded) and the mapping of Shipyard's queues onto
Slurm's partitions, accounts and QoS."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

from shipyard.errors import ExecutorError
from shipyard.executors.base import Placement

LIMIT_SIGNAL = "USR2"
"""What Slurm sends the batch script before the time limit; it tells the ranks to checkpoint."""
ENDED_MARK = ".slurm-ended-{attempt}"
"""Written into the run folder by the batch script when Slurm's warning of the limit came."""


@dataclasses.dataclass(frozen=True, slots=True)
class SlurmQueue:
    """Where one Shipyard queue's allocations go in Slurm."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None


def parse_queues(text: str) -> dict[str, SlurmQueue]:
    """``QUEUE=PARTITION[:ACCOUNT[:QOS]],...`` (``*``: every queue not named)."""
    queues = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        queue, sep, where = item.partition("=")
        parts = where.split(":")
        if not sep or not queue or len(parts) > 3:
            raise ExecutorError(
                f"SHIPYARD_SLURM_QUEUES entry {item!r} is not QUEUE=PARTITION[:ACCOUNT[:QOS]]",
                hint="e.g. SHIPYARD_SLURM_QUEUES='default=gpu,research=gpu:lab-a:high'",
            )
        partition, account, qos = (*parts, None, None)[:3]
        queues[queue.strip()] = SlurmQueue(partition or None, account or None, qos or None)
    return queues


def batch_script(placement: Placement, run_dir: Path, attempt: int) -> str:
    """The allocation's script: the rendezvous on the first node, one ``srun`` step whose tasks
    are the ranks, and the forwarding of Slurm's signals (its warning before the time limit
    becomes the ranks' SIGTERM, on which they checkpoint and exit)."""
    per_node = placement.world_size // len(placement.nodes)
    mark = shlex.quote(str(run_dir / ENDED_MARK.format(attempt=attempt)))
    # Each rank's visibility is Slurm's (from its GRES), but a CPU attempt must grab no GPU.
    cpu_only = placement.torch_device == "cpu"
    rank = (
        "export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS "
        f"LOCAL_WORLD_SIZE={per_node}{' CUDA_VISIBLE_DEVICES=' * cpu_only}; "
        'exec "$0" -m shipyard.training "$1"'
    )
    lines = [
        "#!/bin/bash",
        f"# Shipyard attempt {attempt}: written by the Slurm executor, submitted with `sbatch`.",
        "set -u",
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'addr=$(scontrol show node "$first" --oneliner | tr " " "\\n" | sed -n "s/^NodeAddr=//p")',
        'export MASTER_ADDR="${addr:-$first}"',
        f"export MASTER_PORT=$({shlex.quote(sys.executable)} -m shipyard.executors.rendezvous)",
        f"export OMP_NUM_THREADS={placement.threads_per_process} PYTHONUNBUFFERED=1",
        'case "$MASTER_ADDR" in 127.*) export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo};; esac',
        f"trap 'echo time_limit > {mark}; scancel --signal=TERM \"$SLURM_JOB_ID\"' {LIMIT_SIGNAL}",
        "trap 'true' TERM  # an operator's scancel signals the ranks too: wait for their checkpoint",
        f"srun --label --kill-on-bad-exit=1 --ntasks-per-node={per_node} "
        f"--cpus-per-task={placement.threads_per_process} "
        f"bash -c {shlex.quote(rank)} {shlex.quote(sys.executable)} {shlex.quote(str(run_dir))} &",
        "step=$!",
        'while kill -0 "$step" 2>/dev/null; do wait "$step"; done',
        'wait "$step"',
        "exit $?",
    ]
    return "\n".join(lines) + "\n"
