"""A real Slurm cluster of the test's own (Debian's ``slurm-wlm``): a munged with its own key and
socket, a ``slurmctld`` and one ``slurmd`` per node, all on this machine, each ``slurmd`` under its
node's name and port (the build runs several on one host). Nothing of the machine's own Slurm or
munge is used or touched.

The nodes' GPUs are GRES entries over character devices that are ``/dev/null`` (made with
``mknod``): the seam for hardware this machine lacks. Slurm counts, allocates and hides them as
GPUs (``CUDA_VISIBLE_DEVICES``); the ranks run on the CPU (``SHIPYARD_SLURM_EMULATED_GPUS``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from shipyard.errors import DependencyMissing
from tests.support.ports import SLURM, quiet_ports

DAEMONS = ("munged", "slurmctld", "slurmd")


@dataclass(frozen=True)
class SlurmNode:
    name: str
    gres_type: str
    gpus: int
    cpus: int = 2
    memory_mb: int = 4000
    features: tuple[str, ...] = ()


@dataclass
class SlurmCluster:
    folder: Path
    nodes: tuple[SlurmNode, ...]
    partition: str = "gpu"
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    def env(self) -> dict[str, str]:
        """What a process that drives the cluster needs: its ``slurm.conf`` (which names the
        munge socket)."""
        return {"SLURM_CONF": str(self.conf)}

    def start(self, timeout_s: float = 30) -> SlurmCluster:
        missing = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
        if missing:
            raise DependencyMissing(
                f"Slurm is not installed ({', '.join(missing)} missing)", hint="apt-get install slurm-wlm"
            )
        if os.geteuid() != 0:
            raise DependencyMissing("the test Slurm runs its daemons as root", hint="run the tests as root")
        for sub in ("state", "log", "dev", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._start_munge()
            self._write_conf()
            self._daemon("slurmctld", ["slurmctld", "-i"], self.folder / "slurmctld.pid")
            for node in self.nodes:
                pid_file = self.folder / f"slurmd-{node.name}.pid"
                self._daemon(f"slurmd:{node.name}", ["slurmd", "-N", node.name], pid_file)
            self.wait_idle(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._daemon(
            "munged",
            ["munged", "--force", f"--socket={self.folder / 'munge.sock'}", f"--key-file={key}",
             f"--log-file={self.folder / 'log' / 'munged.log'}", f"--pid-file={self.folder / 'munged.pid'}",
             f"--seed-file={self.folder / 'munged.seed'}"],
            self.folder / "munged.pid",
        )  # fmt: skip

    def _write_conf(self) -> None:
        f = self.folder
        host = socket.gethostname()
        ports = quiet_ports(SLURM, 1 + len(self.nodes))
        lines = [
            f"ClusterName=sy{os.getpid() % 100000}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ports[0]}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={f / 'munge.sock'}",
            f"StateSaveLocation={f / 'state'}",
            f"SlurmdSpoolDir={f / 'spool'}/%n",
            f"SlurmctldPidFile={f / 'slurmctld.pid'}",
            f"SlurmdPidFile={f}/slurmd-%n.pid",
            f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={f / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "ReturnToService=1",  # a node an operator set down stays down until resumed
            "MpiDefault=none",
            "GresTypes=gpu",
            "MinJobAge=600",
            "KillWait=10",
        ]
        gres = ["AutoDetect=off"]
        first = 0
        for node, port in zip(self.nodes, ports[1:], strict=True):
            features = f" Features={','.join(node.features)}" if node.features else ""
            lines.append(
                f"NodeName={node.name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                f"CPUs={node.cpus} RealMemory={node.memory_mb} Gres=gpu:{node.gres_type}:{node.gpus}"
                f"{features} State=UNKNOWN"
            )
            devices = []
            for index in range(first, first + node.gpus):
                device = f / "dev" / f"nvidia{index}"
                if not device.exists():
                    os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a /dev/null, as a GPU
                devices.append(device)
            first += node.gpus
            gres.append(
                f"NodeName={node.name} Name=gpu Type={node.gres_type} "
                f"File={f / 'dev'}/nvidia[{first - node.gpus}-{first - 1}]"
            )
        names = ",".join(node.name for node in self.nodes)
        lines.append(f"PartitionName={self.partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (f / "gres.conf").write_text("\n".join(gres) + "\n")

    def _daemon(self, name: str, command: list[str], pid_file: Path) -> None:
        pid_file.unlink(missing_ok=True)
        done = subprocess.run(
            command, env={**os.environ, **self.env()}, capture_output=True, text=True, timeout=60
        )
        deadline = time.monotonic() + 15
        while not pid_file.exists() or not pid_file.read_text().strip():
            if done.returncode != 0 or time.monotonic() > deadline:
                raise AssertionError(f"{name} did not start ({done.returncode}): {done.stderr}{self.logs()}")
            time.sleep(0.05)
        self.pids[name] = int(pid_file.read_text().split()[0])

    def slurm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster (as its administrator)."""
        return subprocess.run(
            list(args),
            env={**os.environ, **self.env()},
            capture_output=True,
            text=True,
            timeout=30,
            check=check,
        )

    def wait_idle(self, timeout_s: float = 30) -> None:
        """Until every node is idle (no jobs left, each one's slurmd registered)."""
        deadline = time.monotonic() + timeout_s
        while True:
            done = self.slurm("sinfo", "--noheader", "--Node", "--format=%N %T", check=False)
            states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
            if len(states) == len(self.nodes) and set(states.values()) == {"idle"}:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"Slurm nodes never became idle: {states}{self.logs()}")
            time.sleep(0.2)

    def set_state(self, node: str, state: str, reason: str = "test") -> None:
        extra = [f"reason={reason}"] if state in ("down", "drain") else []
        # A node back already (ReturnToService) refuses `resume`: that is what was asked.
        self.slurm(
            "scontrol", "update", f"nodename={node}", f"state={state}", *extra, check=state != "resume"
        )

    def logs(self) -> str:
        parts = []
        for log in sorted((self.folder / "log").glob("*.log")):
            parts.append(
                f"\n--- {log.name} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            )
        return "".join(parts)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.slurm("scancel", "--full", "--signal=KILL", f"--partition={self.partition}", check=False)
            time.sleep(1)
        for name in sorted(self.pids, key=lambda n: DAEMONS.index(n.split(":")[0]), reverse=True):
            _end(self.pids.pop(name))


def _end(pid: int, timeout_s: float = 10) -> None:
    """SIGTERM, then SIGKILL (a slurmd whose controller went first ignores SIGTERM)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
