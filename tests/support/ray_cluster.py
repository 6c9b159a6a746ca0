"""Ray clusters on loopback whose nodes advertise accelerators this machine lacks: ``NodeCluster``,
every node started by `shipyard node start` (the tests), and ``RayCluster``, raylets of
``ray.cluster_utils.Cluster`` in one process (the benchmarks that start 64 of them).

The seam for absent hardware: each node's devices are given here instead of discovered, and the
node is marked emulated, so its attempts run on the CPU while the scheduler and Ray see the
advertised type (``h100-sxm``, say). Everything else is real: raylets, placement groups, actors,
processes, the rendezvous of torch.distributed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shipyard.executors.cluster_nodes import Advertisement
from shipyard.executors.processes import descendants
from shipyard.hardware import Device
from shipyard.hardware.emulation import EMULATE_ENV, emulated_accelerators
from shipyard.services.cluster.cluster import _naming, ray_temp_dir, register
from tests.conftest import SHIPYARD
from tests.support.ports import quiet_port

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""What ``ray.cluster_utils.Cluster`` needs to keep several raylets on 127.0.0.1 in one process."""


def emulated_devices(accelerator_type: str, count: int, cores: int = 2) -> tuple[Device, ...]:
    """``count`` devices of a catalog type (as the vendor would report them) and the host CPU."""
    cpu = Device(
        accelerator_type="cpu",
        index=0,
        name="emulated host CPU",
        vendor="cpu",
        memory_gib=16.0,
        peak_bf16_tflops=0.2,
        peak_fp32_tflops=0.1,
        cores=cores,
    )
    return (*emulated_accelerators(accelerator_type, count), cpu)


@dataclass
class RayCluster:
    scratch: Path
    cluster: Any = None
    raylets: dict[str, Any] = field(default_factory=dict)
    ads: dict[str, Advertisement] = field(default_factory=dict)

    def start(self) -> RayCluster:
        os.environ.update(LOOPBACK_ENV)
        import ray
        from ray.cluster_utils import Cluster

        # The head holds the cluster's state only: no Shipyard resources, so no attempt lands there.
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "include_dashboard": False,
                "object_store_memory": 100 << 20,
                # A lost node is declared dead in about 2 s rather than Ray's 15 (tests only).
                "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4},
            },
        )
        ray.init(address=self.cluster.address, namespace="shipyard-tests", log_to_driver=False)
        return self

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add(
        self, name: str, devices: tuple[Device, ...], *, wait: bool = True, **labels: str
    ) -> Advertisement:
        ad = Advertisement(
            node=name,
            devices=devices,
            labels=labels,
            scratch=str(self.scratch / name),
            emulated=True,
        )
        ad.check()
        self.raylets[name] = self.cluster.add_node(
            num_cpus=4,
            resources=ad.resources(),
            labels=ad.ray_labels(),
            object_store_memory=100 << 20,
            wait=wait,
        )
        register(ad, self.address)
        self.ads[name] = ad
        return ad

    def kill(self, name: str) -> None:
        """The node's raylet dies (and with it its workers): as when a machine is lost."""
        self.cluster.remove_node(self.raylets.pop(name), allow_graceful=False)

    def stop(self) -> None:
        import ray

        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()

    def env(self) -> dict[str, str]:
        """What a Shipyard process needs to use this cluster."""
        return {**LOOPBACK_ENV, "SHIPYARD_EXECUTOR": "ray", "SHIPYARD_RAY_ADDRESS": self.address}


FAST_VERDICT_ENV = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "4"}
"""Ray's settings of a head that declares a lost node dead in about 2 s rather than 15 (tests)."""


@dataclass
class NodeCluster:
    """A Ray cluster on this machine whose every node is started as users start theirs: `shipyard
    node start` on loopback, each node with a home (and so a Ray folder) of its own, as separate
    machines would have. The head is a node with this machine's CPU only; the others advertise
    emulated accelerators (``SHIPYARD_EMULATE_ACCELERATORS``, the seam for hardware this machine
    lacks) and run their attempts on the CPU."""

    base: Path
    port: int = 0
    homes: dict[str, Path] = field(default_factory=dict)

    HEAD = "head"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> NodeCluster:
        self.port = quiet_port()
        self._node_start(self.HEAD, ["--head", "--port", str(self.port)], FAST_VERDICT_ENV)
        return self

    def add(self, name: str, accelerator_type: str, count: int, **labels: str) -> None:
        options = ["--address", self.address, "--scratch", str(self.base / "scratch" / name)]
        for key, value in labels.items():
            options += ["--rack", value] if key == "rack" else ["--label", f"{key}={value}"]
        self._node_start(name, options, {EMULATE_ENV: f"{accelerator_type}:{count}"})

    def _node_start(self, name: str, options: list[str], env: dict[str, str]) -> None:
        home = self.homes.setdefault(name, self.base / "homes" / name)
        command = [*SHIPYARD, "node", "start", "--loopback", "--name", name, *options]
        done = subprocess.run(
            command, env={**self._env(home), **env}, capture_output=True, text=True, timeout=240
        )
        if done.returncode != 0:
            raise AssertionError(f"node start {name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")

    def _env(self, home: Path) -> dict[str, str]:
        env = {**os.environ, "SHIPYARD_HOME": str(home)}
        env.pop(EMULATE_ENV, None)
        return env

    def kill(self, name: str) -> None:
        """Every process of the node dies at once (SIGKILL): as when a machine is lost."""
        for pid in descendants(_naming(f"{ray_temp_dir(self.homes[name])}/")):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """`shipyard node stop` on every node, the head last; their Ray folders removed."""
        for home in sorted(self.homes.values(), key=lambda home: home.name == self.HEAD):
            subprocess.run([*SHIPYARD, "node", "stop"], env=self._env(home), capture_output=True, timeout=120)
            shutil.rmtree(ray_temp_dir(home), ignore_errors=True)

    def env(self) -> dict[str, str]:
        """What a Shipyard process needs to use this cluster."""
        return {"SHIPYARD_EXECUTOR": "ray", "SHIPYARD_RAY_ADDRESS": self.address}
