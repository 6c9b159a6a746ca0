"""A Ray cluster of several raylets on loopback (``ray.cluster_utils.Cluster``), whose nodes
advertise accelerators this machine lacks.

The seam for absent hardware: each node's devices are given here instead of discovered, and the
node is marked emulated, so its attempts run on the CPU while the scheduler and Ray see the
advertised type (``h100-sxm``, say). Everything else is real: raylets, placement groups, actors,
processes, the rendezvous of torch.distributed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shipyard.executors.cluster_nodes import Advertisement
from shipyard.hardware import Device
from shipyard.hardware.catalog import lookup
from shipyard.services.cluster import register

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""What ``ray.cluster_utils.Cluster`` needs to keep several raylets on 127.0.0.1 in one process."""


def emulated_devices(accelerator_type: str, count: int, cores: int = 2) -> tuple[Device, ...]:
    """``count`` devices of a catalog type (as the vendor would report them) and the host CPU."""
    spec = lookup(accelerator_type)
    accelerators = tuple(
        Device(
            accelerator_type=accelerator_type,
            index=i,
            name=spec.name,
            vendor=spec.vendor,
            memory_gib=spec.memory_gib,
            peak_bf16_tflops=spec.tflops.bf16 or 0.0,
            peak_fp32_tflops=spec.tflops.fp32 or 0.0,
        )
        for i in range(count)
    )
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
    return (*accelerators, cpu)


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
