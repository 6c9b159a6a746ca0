"""The node side of a Ray attempt: one ``RankGroup`` actor per node launches the training runtime
for that node's ranks and hands back what they write.

The actor lives in the attempt's placement-group bundle on its node, so the processes it starts
run exactly where the scheduler put them, and signals it sends reach only its own children on its
own host. Each rank is its own process group (a signal reaches everything it started) and dies
with the actor (``PR_SET_PDEATHSIG``): a node that leaves the cluster leaves no ranks behind.
Nothing here imports Ray; the executor wraps the class as an actor.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import IO, Any

from shipyard.executors.stacks import python_stacks
from shipyard.schemas.launch import (
    CHECKPOINT_DIR,
    FAULTS_ENV,
    HEARTBEAT_DIR,
    LAUNCH_FILE,
    METRICS_FILE,
    RESULT_FILE,
    latest_checkpoint,
    write_json_atomic,
)

RESUME_DIR = "resume"
"""Where a shipped checkpoint is unpacked in the node's run folder."""
DATASETS_DIR = "datasets"
"""Where shipped ``store:`` datasets are unpacked in the node's run folder."""
_PR_SET_PDEATHSIG = 1


def pack(directory: Path) -> bytes:
    """A folder as an uncompressed tar (checkpoints compress poorly; speed matters more)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(directory, arcname=directory.name)
    return buffer.getvalue()


def unpack(archive: bytes, into: Path) -> Path:
    """Unpack a ``pack``ed folder under ``into``, atomically: a reader sees all of it or none."""
    into.mkdir(parents=True, exist_ok=True)
    staging = into / f".unpack-{os.getpid()}-{threading.get_ident()}"
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        tar.extractall(staging, filter="data")  # refuses links and paths that leave ``staging``
    (name,) = os.listdir(staging)
    target = into / name
    if target.exists():  # unpacked before (the same checkpoint, shipped again)
        shutil.rmtree(staging)
        return target
    os.replace(staging / name, target)
    staging.rmdir()
    return target


def unpack_merged(archives: list[bytes], into: Path) -> Path:
    """Several ``pack``ed folders of one name (the parts of a checkpoint each node wrote) as one
    folder under ``into``, atomically."""
    into.mkdir(parents=True, exist_ok=True)
    staging = into / f".merge-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(staging, ignore_errors=True)
    names = set()
    for archive in archives:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
            tar.extractall(staging, filter="data")  # refuses links and paths that leave ``staging``
        names.update(os.listdir(staging))
    (name,) = names
    target = into / name
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging / name, target)
    staging.rmdir()
    return target


class RankGroup:
    """The ranks of one attempt on one node."""

    def __init__(self, node: str, scratch: str, job_dir: str, env: dict[str, str]) -> None:
        self.node = node
        self.run_dir = Path(scratch) / "runs" / job_dir
        self.cache_dir = Path(scratch) / "cache"
        self.env = env
        self.processes: list[subprocess.Popen[bytes]] = []
        self.log_path = self.run_dir / "logs" / "node.log"
        self.log_cursor = 0
        self._log_lock = threading.Lock()

    def address(self) -> tuple[str, int]:
        """This node's address and a free port on it: the rendezvous of rank 0."""
        import ray

        host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        with socket.socket() as probe:
            probe.bind((host, 0))
            return host, int(probe.getsockname()[1])

    def start(
        self,
        plan: dict[str, Any],
        resume: bytes | None,
        datasets: dict[int, bytes],
        layout: dict[str, Any],
    ) -> None:
        """Write the node's launch plan (its own folders; the shipped checkpoint and datasets)
        and start the node's ranks with their place in the world."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in (METRICS_FILE, RESULT_FILE):  # the agent already has an earlier attempt's
            (self.run_dir / stale).unlink(missing_ok=True)
        plan = {**plan, "run_dir": str(self.run_dir), "cache_dir": str(self.cache_dir)}
        if resume is not None:
            plan["resume_from"] = str(unpack(resume, self.run_dir / RESUME_DIR))
        paths = list(plan["spec"]["data"]["paths"])
        for index, archive in datasets.items():
            paths[index] = str(unpack(archive, self.run_dir / DATASETS_DIR / str(index)))
        plan["spec"] = {**plan["spec"], "data": {**plan["spec"]["data"], "paths": paths}}
        if plan.get("data_roots") is not None:
            shipped = [str((self.run_dir / DATASETS_DIR).resolve())] if datasets else []
            plan["data_roots"] = [*plan["data_roots"], str(self.cache_dir.resolve()), *shipped]
        write_json_atomic(self.run_dir / LAUNCH_FILE, plan)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        per_node, node_rank = layout["per_node"], layout["node_rank"]
        for local_rank in range(per_node):
            rank = node_rank * per_node + local_rank
            env = {
                **os.environ,
                **self.env,
                "RANK": str(rank),
                "LOCAL_RANK": str(local_rank),
                "WORLD_SIZE": str(layout["world_size"]),
                "LOCAL_WORLD_SIZE": str(per_node),
                "GROUP_RANK": str(node_rank),
                "MASTER_ADDR": layout["master_addr"],
                "MASTER_PORT": str(layout["master_port"]),
                "OMP_NUM_THREADS": str(layout["threads"]),
                "PYTHONUNBUFFERED": "1",
            }
            if layout.get("faults"):
                env[FAULTS_ENV] = layout["faults"]
            if layout["cpu_only"]:
                env["CUDA_VISIBLE_DEVICES"] = ""  # runs on the CPU whatever the node advertises
            process = subprocess.Popen(
                [sys.executable, "-m", "shipyard.training", str(self.run_dir)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.run_dir,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
            assert process.stdout is not None
            threading.Thread(target=self._copy_log, args=(rank, process.stdout), daemon=True).start()
            self.processes.append(process)

    def _copy_log(self, rank: int, stream: IO[bytes]) -> None:
        """Each line of a rank's output, prefixed with its rank, into the node's log."""
        prefix = f"[rank {rank}] ".encode()
        for line in stream:
            with self._log_lock, open(self.log_path, "ab") as log:
                log.write(prefix + line)

    def poll(self) -> list[int | None]:
        """Each rank's exit code, None while it runs."""
        return [p.poll() for p in self.processes]

    def signal(self, signum: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signum)

    def stacks(self) -> str | None:
        """Each live rank's stacks read from outside; a rank that cannot be read so writes its
        own into its log (SIGUSR1)."""
        dumps = []
        for process in self.processes:
            if process.poll() is not None:
                continue
            found = python_stacks(process.pid)
            if found is not None:
                dumps.append(found)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGUSR1)
        return "\n".join(dumps) or None

    def heartbeats(self) -> dict[str, bytes]:
        """The newest heartbeat of each of the node's ranks (``rank-N.json``)."""
        return {path.name: path.read_bytes() for path in (self.run_dir / HEARTBEAT_DIR).glob("rank-*.json")}

    def drain_log(self) -> bytes:
        """The node's log lines written since the last call."""
        if not self.log_path.exists():
            return b""
        with self._log_lock, open(self.log_path, "rb") as log:
            log.seek(self.log_cursor)
            chunk = log.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.log_cursor += len(complete)
        return complete

    def part(self, checkpoint: str) -> bytes | None:
        """This node's part of checkpoint ``checkpoint`` (the shards its ranks wrote), once its
        first rank has renamed it into place; None before."""
        folder = self.run_dir / CHECKPOINT_DIR / checkpoint
        return pack(folder) if folder.is_dir() else None

    def pull(self, metrics_offset: int, have_checkpoint: str | None, with_export: bool) -> dict[str, Any]:
        """What rank 0 wrote since the agent last asked: complete metric lines from
        ``metrics_offset``, the newest complete checkpoint unless the agent ``have``s it, the
        result (its paths relative to the run folder) and, once asked, the export."""
        pulled: dict[str, Any] = {"metrics": b"", "checkpoint": None, "result": None, "export": None}
        metrics = self.run_dir / METRICS_FILE
        if metrics.exists():
            with open(metrics, "rb") as f:
                f.seek(metrics_offset)
                chunk = f.read()
            pulled["metrics"] = chunk[: chunk.rfind(b"\n") + 1]
        newest = latest_checkpoint(self.run_dir / CHECKPOINT_DIR)
        if newest is not None and newest.name != have_checkpoint:
            pulled["checkpoint"] = (newest.name, pack(newest))
        result_path = self.run_dir / RESULT_FILE
        if result_path.exists():
            result = json.loads(result_path.read_text())
            for key in ("checkpoint", "export_dir"):
                if result.get(key):
                    result[key] = os.path.relpath(result[key], self.run_dir)
            pulled["result"] = result
            export = result.get("export_dir")
            if with_export and export and (self.run_dir / export).is_dir():
                pulled["export"] = pack(self.run_dir / export)
        return pulled


def _die_with_parent() -> None:  # runs in the child before exec
    """End the rank when the actor that started it ends (Linux; elsewhere a best effort)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
