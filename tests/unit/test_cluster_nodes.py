"""What a node advertises to Ray when it joins: resources per accelerator type, its own pin
resource, labels, and the record of its devices (no Ray needed)."""

from __future__ import annotations

import pytest

from shipyard.errors import InvalidSpec
from shipyard.executors.cluster_nodes import Advertisement, parse_labels
from shipyard.hardware import Device
from tests.support.ray_cluster import emulated_devices


def test_a_node_advertises_one_resource_per_type_and_one_of_its_own() -> None:
    ad = Advertisement(node="gpu-7", devices=emulated_devices("h100-sxm", 8, cores=64), scratch="/x",
                       labels={"rack": "r2", "ib_fabric": "ib0"}, env={"NCCL_IB_HCA": "mlx5"})  # fmt: skip
    assert ad.resources() == {"shipyard-node/gpu-7": 1000, "shipyard/h100-sxm": 8, "shipyard/cpu": 64}
    assert ad.ray_labels() == {"shipyard.io/node": "gpu-7", "rack": "r2", "ib_fabric": "ib0"}
    assert Advertisement.from_json(ad.to_json()) == ad
    assert ad.inventory().memory_gib()["h100-sxm"] == 80
    real = Advertisement(node="gpu-7", devices=ad.devices, scratch="/x")
    assert real.gpus() == 8 and ad.gpus() == 8  # both advertise NVIDIA GPUs to Ray's own accounting
    emulated = Advertisement(node="gpu-7", devices=ad.devices, scratch="/x", emulated=True)
    assert emulated.gpus() == 0 and emulated.ray_labels()["shipyard.io/emulated"] == "true"


def test_a_device_the_catalog_does_not_know_is_refused_with_the_fix() -> None:
    odd = Device(accelerator_type="unknown", index=0, name="Mystery X1", vendor="nvidia", memory_gib=48,
                 peak_bf16_tflops=1, peak_fp32_tflops=1)  # fmt: skip
    with pytest.raises(InvalidSpec) as refused:
        Advertisement(node="n", devices=(odd,), scratch="/x").check()
    assert "Mystery X1" in refused.value.message and "hardware.yaml" in (refused.value.hint or "")


def test_labels_must_be_key_value() -> None:
    assert parse_labels(["rack=r1", " switch = s4 "]) == {"rack": "r1", "switch": "s4"}
    with pytest.raises(InvalidSpec, match="not KEY=VALUE"):
        parse_labels(["rack"])
