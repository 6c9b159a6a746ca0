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
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from shipyard.durable import write_json_atomic
from shipyard.executors.base import FolderMover, StoreAccess
from shipyard.executors.rendezvous import free_port
from shipyard.executors.stacks import python_stacks
from shipyard.schemas.launch import (
    CHECKPOINT_DIR,
    CHECKPOINT_MARKER,
    FAULTS_ENV,
    HEARTBEAT_DIR,
    LAUNCH_FILE,
    METRICS_FILE,
    RESULT_FILE,
)

RESUME_DIR = "resume"
"""Where the checkpoint an attempt resumes from is read in the node's run folder."""
STORE_CACHE = "store"
"""The node's cache of stored datasets and base models, under its cache folder."""
_PR_SET_PDEATHSIG = 1


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
        self.mover: FolderMover | None = None
        self.stored: dict[str, dict[str, Any]] = {}
        """The newest checkpoints this node stored: name -> its part's file records and, on the
        node that holds it, ``checkpoint.json``'s text."""
        self.failed: set[str] = set()
        self.export: list[dict[str, Any]] | None = None
        """The export's file records, once this node (rank 0's) stored it."""
        self.export_failed = False

    def address(self) -> tuple[str, int]:
        """This node's address and a free port on it: the rendezvous of rank 0."""
        import ray

        return ray.util.get_node_ip_address(), free_port()  # type: ignore[no-untyped-call]

    def start(self, plan: dict[str, Any], store: StoreAccess, layout: dict[str, Any]) -> None:
        """Write the node's launch plan (its own folders; the checkpoint it resumes from and the
        stored datasets and base model it reads, fetched from the store by this node), start the
        node's ranks with their place in the world, and from then on store each checkpoint they
        complete."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in (METRICS_FILE, RESULT_FILE):  # the agent already has an earlier attempt's
            (self.run_dir / stale).unlink(missing_ok=True)
        plan = {**plan, "run_dir": str(self.run_dir), "cache_dir": str(self.cache_dir)}
        self.mover = store.mover
        if store.resume is not None:
            name, files = store.resume
            plan["resume_from"] = str(self.mover.read(files, self.run_dir / RESUME_DIR / name))
        spec = plan["spec"]
        paths = list(spec["data"]["paths"])
        holder = f"{self.run_dir.name}-{os.getpid()}"
        for key, stored in store.inputs.items():
            local = str(self.mover.cached(stored.files, self.cache_dir / STORE_CACHE, holder) / stored.within)
            if key == "model":
                spec = {**spec, "model": {"path": local}}
            else:
                paths[int(key.removeprefix("data:"))] = local
        plan["spec"] = {**spec, "data": {**spec["data"], "paths": paths}}
        if plan.get("data_roots") is not None:
            plan["data_roots"] = [*plan["data_roots"], str(self.cache_dir.resolve())]
        write_json_atomic(self.run_dir / LAUNCH_FILE, plan)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        per_node, node_rank = layout["per_node"], layout["node_rank"]
        node_env = dict(self.env)
        if "GLOO_SOCKET_IFNAME" not in {**os.environ, **node_env}:
            # Gloo finds its interface through the host name, which another host may not resolve
            # (it then falls back to loopback, and the ranks never meet): name the interface that
            # holds the address Ray knows this node by.
            import ray

            if interface := interface_of(ray.util.get_node_ip_address()):  # type: ignore[no-untyped-call]
                node_env["GLOO_SOCKET_IFNAME"] = interface
        for local_rank in range(per_node):
            rank = node_rank * per_node + local_rank
            env = {
                **os.environ,
                **node_env,
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
        threading.Thread(target=self._store_checkpoints, daemon=True).start()

    def _copy_log(self, rank: int, stream: IO[bytes]) -> None:
        """Each line of a rank's output, prefixed with its rank, into the node's log."""
        prefix = f"[rank {rank}] ".encode()
        for line in stream:
            with self._log_lock, open(self.log_path, "ab") as log:
                log.write(prefix + line)

    def poll(self) -> dict[str, Any]:
        """Each rank's exit code (None while it runs), and the checkpoint this node is still
        storing, if any: the attempt is not over before its last checkpoint is stored."""
        codes = [p.poll() for p in self.processes]
        pending = self._unstored() or (self._unstored_export() if None not in codes else None)
        return {"codes": codes, "storing": pending.name if pending is not None else None}

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

    def report(self, metrics_offset: int | None) -> dict[str, Any]:
        """Everything the agent takes at a look, in one call: the node's new log lines, its
        ranks' heartbeats and the checkpoints it stored; from the first node (``metrics_offset``
        given) also the metric lines from that offset, the result and the export."""
        report: dict[str, Any] = {
            "log": self._drain_log(),
            "heartbeats": {
                p.name: p.read_bytes() for p in (self.run_dir / HEARTBEAT_DIR).glob("rank-*.json")
            },
            "stored": dict(self.stored),
        }
        if metrics_offset is not None:
            report.update(self._rank0_outputs(metrics_offset))
        return report

    def _drain_log(self) -> bytes:
        """The node's log lines written since the last call."""
        if not self.log_path.exists():
            return b""
        with self._log_lock, open(self.log_path, "rb") as log:
            log.seek(self.log_cursor)
            chunk = log.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.log_cursor += len(complete)
        return complete

    def _rank0_outputs(self, metrics_offset: int) -> dict[str, Any]:
        """Complete metric lines from ``metrics_offset``, the result (its paths relative to the
        run folder) and, once this node stored it, the export's file records."""
        outputs: dict[str, Any] = {"metrics": b"", "result": None, "export": None}
        metrics = self.run_dir / METRICS_FILE
        if metrics.exists():
            with open(metrics, "rb") as f:
                f.seek(metrics_offset)
                chunk = f.read()
            outputs["metrics"] = chunk[: chunk.rfind(b"\n") + 1]
        result_path = self.run_dir / RESULT_FILE
        if result_path.exists():
            result = json.loads(result_path.read_text())
            for key in ("checkpoint", "export_dir"):
                if result.get(key):
                    result[key] = os.path.relpath(result[key], self.run_dir)
            outputs["result"] = result
            outputs["export"] = self.export
        return outputs

    # --- checkpoints: each node stores its own part ----------------------------------------

    def _unstored(self) -> Path | None:
        """The newest checkpoint folder this node completed and has not stored (nor failed to)."""
        complete = sorted(
            p for p in (self.run_dir / CHECKPOINT_DIR).glob("step_*") if ".tmp" not in p.name and p.is_dir()
        )
        newest = complete[-1] if complete else None
        if newest is None or newest.name in self.stored or newest.name in self.failed:
            return None
        return newest

    def _store_checkpoints(self) -> None:
        """Store each checkpoint the node's ranks complete, newest first (one that a newer
        replaced before its turn is skipped), while any rank runs and until the last is stored."""
        while True:
            running = any(p.poll() is None for p in self.processes)
            folder = self._unstored()
            if folder is None:
                if not running:
                    if (export := self._unstored_export()) is not None:
                        self._store_export(export)
                    return
                time.sleep(STORE_POLL_S)
                continue
            self._store(folder)

    def _unstored_export(self) -> Path | None:
        """The export the result names, on this node, not yet stored (nor failed to be)."""
        result_path = self.run_dir / RESULT_FILE
        if self.export is not None or self.export_failed or not result_path.exists():
            return None
        export = json.loads(result_path.read_text()).get("export_dir")
        return Path(export) if export and Path(export).is_dir() else None

    def _store_export(self, folder: Path) -> None:
        assert self.mover is not None
        try:
            self.export = self.mover.write(folder)
        except Exception as exc:  # the store unreachable or full: said in the log
            self.export_failed = True
            self._note(f"could not store the export {folder.name}: {exc}")

    def _store(self, folder: Path) -> None:
        assert self.mover is not None
        try:
            files = self.mover.write(folder)
        except FileNotFoundError:  # pruned by the run meanwhile: a newer one is there
            self.failed.add(folder.name)
            return
        except Exception as exc:  # the store unreachable or full: said in the log, the run goes on
            self.failed.add(folder.name)
            self._note(f"could not store checkpoint {folder.name}: {exc}")
            return
        marker = folder / CHECKPOINT_MARKER
        entry = {"files": files, "description": marker.read_text() if marker.is_file() else None}
        self.stored = dict(list({**self.stored, folder.name: entry}.items())[-STORED_KEPT:])

    def _note(self, line: str) -> None:
        with self._log_lock, open(self.log_path, "ab") as log:
            log.write(f"[node {self.node}] {line}\n".encode())


STORE_POLL_S = 1.0
"""How often a node looks for a checkpoint its ranks completed."""
STORED_KEPT = 3
"""Checkpoints whose records a node keeps for the agent to take."""


def interface_of(ip: str) -> str | None:
    """The network interface whose IPv4 address is ``ip`` (Linux); None where none is, or the
    platform cannot say."""
    try:
        import fcntl
    except ImportError:
        return None
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:  # SIOCGIFADDR: the interface's address
                answer = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        if socket.inet_ntoa(answer[20:24]) == ip:
            return name
    return None


def _die_with_parent() -> None:  # runs in the child before exec
    """End the rank when the actor that started it ends (Linux; elsewhere a best effort)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
