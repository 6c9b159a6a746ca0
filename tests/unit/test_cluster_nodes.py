"""What a node advertises to Ray when it joins: resources per accelerator type, its own pin
resource, labels, the record of its devices and of its host, and what a job's estimate makes of
them (no Ray needed)."""

from __future__ import annotations

import pytest

from shipyard.errors import InvalidSpec
from shipyard.executors.base import NodeInventory
from shipyard.executors.cluster_nodes import Advertisement, parse_labels
from shipyard.hardware import Device
from shipyard.hardware.catalog import catalog
from shipyard.hardware.probe import HostRates
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.services.estimates.estimates import estimate_job
from tests.builders import spec_dict
from tests.support.ray_cluster import emulated_devices


def host(op_overhead_us: float) -> HostRates:
    return HostRates(
        gemm_gflops_per_thread=50.0, memory_gb_per_s_per_thread=10.0, op_overhead_us=op_overhead_us
    )


def test_a_node_advertises_one_resource_per_type_and_one_of_its_own() -> None:
    ad = Advertisement(node="gpu-7", devices=emulated_devices("h100-sxm", 8, cores=64), scratch="/x",
                       labels={"rack": "r2", "ib_fabric": "ib0"}, env={"NCCL_IB_HCA": "mlx5"})  # fmt: skip
    assert ad.resources() == {"shipyard-node/gpu-7": 1000, "shipyard/h100-sxm": 8, "shipyard/cpu": 64}
    assert ad.ray_labels() == {"shipyard.io/node": "gpu-7", "rack": "r2", "ib_fabric": "ib0"}
    assert Advertisement.from_json(ad.to_json()) == ad
    assert ad.inventory().memory_gib()["h100-sxm"] == 80
    measured = Advertisement(node="gpu-7", devices=ad.devices, scratch="/x", host=host(5.42))
    assert Advertisement.from_json(measured.to_json()) == measured
    assert measured.inventory().host == host(5.42) and ad.inventory().host is None
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


def test_an_estimate_plans_each_type_with_the_host_its_nodes_measured() -> None:
    """Nodes advertising H100s (emulated: this machine has none) whose hosts measured different
    costs per operation. At one sequence of 1,024 tokens a micro-batch a 125M-shaped model is bound
    by the host queuing its kernels, so the planned speed goes as one over that cost."""
    training = {"micro_batch_size": 1, "seq_len": 1024, "global_batch_tokens": 4096, "precision": "bf16"}
    spec = validate_job_spec(
        spec_dict(model={"preset": "llama-125m"}, training=training, resources={"accelerator": "h100-sxm"})
    )

    def planned(*hosts: HostRates | None) -> float:
        nodes = [
            NodeInventory(id=f"gpu-{i}", devices=emulated_devices("h100-sxm", 8), host=rates)
            for i, rates in enumerate(hosts)
        ]
        return float(estimate_job(spec, nodes, catalog()).tokens_per_s)  # type: ignore[union-attr]

    reference = planned(None)  # a node that did not measure its host: the reference Xeon's 5.42 us
    assert planned(host(2.71)) == pytest.approx(2 * reference)
    # The slowest host of the nodes the job may land on: the estimate holds on each of them.
    assert planned(host(2.71), host(10.84), None) == pytest.approx(reference / 2)


def test_the_interface_of_an_address_is_found_for_gloo() -> None:
    """What a node's ranks bind gloo to: the interface holding the address Ray knows the node by."""
    from shipyard.executors.ray_ranks import interface_of

    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("203.0.113.77") is None  # an address no interface of this machine holds
