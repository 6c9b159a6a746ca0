"""Device discovery and placement for hardware this machine lacks, through the vendor-query seam
(``VendorQueries``): the fakes stand in for NVML and torch's device APIs only."""

from __future__ import annotations

from pathlib import Path

import pytest

from shipyard.executors.base import AttemptHandle, Busy, Placement, Request, place_now
from shipyard.executors.local import LocalExecutor
from shipyard.hardware import VendorQueries, discover, match_accelerator_type
from shipyard.hardware.discovery import GIB, CpuInfo, RawDevice
from shipyard.scheduling.status import Status

NODE = "node-0"

CPU = CpuInfo(model="Test CPU", cores=16, mhz=2000.0, flags=frozenset({"avx512f", "avx512_bf16", "fma"}))


def fake(
    nvidia: list[RawDevice] | None = None, torch_devices: list[RawDevice] | None = None
) -> VendorQueries:
    return VendorQueries(
        nvidia=lambda: list(nvidia or []),
        torch_devices=lambda: list(torch_devices or []),
        cpu=lambda: CPU,
    )


def dgx_h100() -> list[RawDevice]:
    # Two NVLink islands of four, as a test topology.
    return [
        RawDevice(
            vendor="nvidia",
            index=i,
            name="NVIDIA H100 80GB HBM3",
            memory_bytes=80 * GIB,
            nvlink_peers=tuple(j for j in range(4 * (i // 4), 4 * (i // 4) + 4) if j != i),
        )
        for i in range(8)
    ]


@pytest.mark.parametrize(
    ("name", "memory_gib", "key"),
    [
        ("NVIDIA H100 80GB HBM3", 80, "h100-sxm"),
        ("NVIDIA H100 PCIe", 80, "h100-pcie"),
        ("NVIDIA H800", 80, "h800"),
        ("NVIDIA H200", 141, "h200"),
        ("NVIDIA GH200 480GB", 96, "gh200"),
        ("NVIDIA A100-SXM4-40GB", 40, "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", 80, "a100-80gb"),
        ("NVIDIA A100-PCIE-40GB", 39.4, "a100-40gb"),
        ("NVIDIA A800 80GB PCIe", 80, "a800"),
        ("Tesla V100-SXM2-16GB", 16, "v100-16gb"),
        ("Tesla V100-PCIE-32GB", 32, "v100-32gb"),
        ("Tesla V100S-PCIE", 15.8, "v100-16gb"),
        ("NVIDIA GeForce RTX 4090", 24, "rtx-4090"),
        ("AMD Instinct MI250X", 64, "mi250x"),
        ("AMD Instinct MI250", 64, "mi250"),
        ("AMD Instinct MI300X", 192, "mi300x"),
        ("Apple M2 Ultra", 192, "m2-ultra"),
        ("Intel Gaudi 2", 96, "gaudi2"),
        ("NVIDIA Tesla K80", 12, None),
    ],
)
def test_vendor_names_map_to_catalog_keys(name: str, memory_gib: float, key: str | None) -> None:
    assert match_accelerator_type(name, memory_gib) == key


def test_nvidia_node_through_nvml() -> None:
    devices = discover(fake(nvidia=dgx_h100()))
    gpus = [d for d in devices if d.accelerator_type == "h100-sxm"]
    assert len(gpus) == 8
    assert gpus[0].peak_bf16_tflops == pytest.approx(989.4)
    assert gpus[1].nvlink_peers == (0, 2, 3)
    assert devices[-1].accelerator_type == "cpu"


def test_rocm_and_apple_devices_come_from_torch() -> None:
    amd = [
        RawDevice(vendor="amd", index=i, name="AMD Instinct MI250X", memory_bytes=64 * GIB) for i in range(2)
    ]
    assert [d.accelerator_type for d in discover(fake(torch_devices=amd))] == [
        "mi250x",
        "mi250x",
        "cpu",
    ]
    mac = [RawDevice(vendor="apple", index=0, name="Apple M2 Ultra", memory_bytes=192 * GIB)]
    assert discover(fake(torch_devices=mac))[0].accelerator_type == "m2-ultra"


def test_an_unknown_gpu_gets_no_peak_so_mfu_is_not_made_up() -> None:
    odd = [RawDevice(vendor="nvidia", index=0, name="NVIDIA Tesla K80", memory_bytes=12 * GIB)]
    device = discover(fake(nvidia=odd))[0]
    assert device.accelerator_type == "unknown"
    assert device.peak_bf16_tflops == 0


def test_cpu_peak_follows_cores_clock_and_vector_units() -> None:
    cpu = discover(fake())[-1]
    assert cpu.cores == 16
    assert cpu.peak_fp32_tflops == pytest.approx(16 * 2.0 * 64 / 1000)
    assert cpu.peak_bf16_tflops == pytest.approx(16 * 2.0 * 128 / 1000)


@pytest.mark.parametrize(
    ("model", "extra", "fp32_per_cycle", "bf16_per_cycle"),
    [
        ("Intel(R) Xeon(R) Platinum 8480+", set(), 64, 128),  # full-width AVX-512
        ("AMD EPYC 9654 96-Core Processor", set(), 32, 64),  # Zen 4: 512-bit ops in two halves
        ("AMD EPYC 9755 128-Core Processor", {"avx512_vp2intersect"}, 64, 128),  # server Zen 5
        # No bf16 units: torch widens bf16 in a fallback loop, 1/10 of the fp32 rate (measured).
        ("AMD EPYC 7B13 64-Core Processor", {"-avx512f", "-avx512_bf16"}, 32, 32 / 10),
    ],
)
def test_a_cpu_that_splits_512_bit_ops_gets_the_avx2_peak(
    model: str, extra: set[str], fp32_per_cycle: int, bf16_per_cycle: float
) -> None:
    # A fake vendor query (the seam for hardware this machine may not be): the flags of each part.
    removed = {f for f in extra if f.startswith("-")}
    flags = frozenset({"avx2", "fma", "avx512f", "avx512_bf16", *extra} - removed) - {f[1:] for f in removed}
    [cpu] = discover(VendorQueries(nvidia=list, torch_devices=list, cpu=lambda: CpuInfo(
        model=model, cores=4, mhz=2500.0, flags=flags)))  # fmt: skip
    assert cpu.peak_fp32_tflops == pytest.approx(4 * 2.5 * fp32_per_cycle / 1000)
    assert cpu.peak_bf16_tflops == pytest.approx(4 * 2.5 * bf16_per_cycle / 1000, rel=1e-3)  # 4 digits


def test_placement_prefers_an_nvlink_island_and_hides_other_gpus() -> None:
    executor = LocalExecutor(discover(fake(nvidia=dgx_h100())), node=NODE)
    request = Request(accelerator_types=["h100-sxm"], devices=4)
    placed = place_now(executor, request, {NODE: Busy(devices={"h100-sxm": {0}})})
    assert isinstance(placed, Placement)
    assert placed.device_ids == (4, 5, 6, 7)  # 1-3 are one short of a full island
    env = executor.environment(placed)
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert placed.torch_device == "cuda"
    command = executor.command(placed, __import__("pathlib").Path("/run"))
    assert command[2:5] == ["shipyard.training.parent", "/run", "--"]  # under the attempt's parent
    assert command[7:9] == ["torch.distributed.run", "--standalone"]


def test_the_inventory_is_one_node_with_its_devices_labels_and_nvlink_islands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Fake vendor query (no GPU here): a DGX H100 has two NVLink islands of four.
    monkeypatch.setenv("SHIPYARD_NODE_LABELS", "rack=r7, zone=a")
    executor = LocalExecutor(discover(fake(nvidia=dgx_h100())), node=NODE)
    (node,) = executor.nodes()
    assert node.id == NODE and node.capacity() == {"h100-sxm": 8, "cpu": 16}
    assert node.memory_gib()["h100-sxm"] == pytest.approx(80, abs=1)
    assert node.labels["rack"] == "r7" and node.labels["zone"] == "a"
    assert node.labels["nvlink_islands"] == "0,1,2,3 4,5,6,7"
    elsewhere = executor.place(Request(accelerator_types=["h100-sxm"], devices=1), on={"other"})
    assert isinstance(elsewhere, Status) and not elsewhere.transient
    assert executor.runs(AttemptHandle(nodes=(NODE,), handle="1")) and not executor.runs(
        AttemptHandle(nodes=("other",), handle="1")
    )


def test_any_of_list_falls_through_to_the_first_type_present() -> None:
    executor = LocalExecutor(discover(fake(nvidia=dgx_h100())), node=NODE)
    placed = place_now(executor, Request(accelerator_types=["a800", "h100-sxm", "cpu"], devices=2), {})
    assert isinstance(placed, Placement) and placed.accelerator_type == "h100-sxm"


def test_impossible_requests_say_why_and_are_not_transient() -> None:
    executor = LocalExecutor(discover(fake(nvidia=dgx_h100())), node=NODE)
    placed = place_now(executor, Request(accelerator_types=["a800", "h100-sxm"], devices=16), {})
    assert isinstance(placed, Status) and not placed.transient
    assert (
        placed.message
        == "a800: needs 16 devices, this node has none; h100-sxm: needs 16 devices, this node has 8"
    )
    multi = place_now(executor, Request(accelerator_types=["h100-sxm"], devices=8, nodes=2), {})
    assert isinstance(multi, Status) and "single-node" in multi.message


def test_a_minimum_device_memory_rules_out_smaller_devices() -> None:
    # Fake vendor query (no GPU on the test machine): a DGX H100 reports 80 GiB per device.
    executor = LocalExecutor(discover(fake(nvidia=dgx_h100())), node=NODE)
    fits = place_now(executor, Request(accelerator_types=["h100-sxm"], devices=2, min_memory_gib=64), {})
    assert isinstance(fits, Placement)
    too_big = place_now(executor, Request(accelerator_types=["h100-sxm"], devices=2, min_memory_gib=100), {})
    assert isinstance(too_big, Status) and not too_big.transient
    assert too_big.message == (
        "h100-sxm: needs 2 devices, this node has none with 100 GiB or more (the largest has 80 GiB)"
    )
    host = place_now(executor, Request(accelerator_types=["cpu"], devices=1, min_memory_gib=1e6), {})
    assert isinstance(host, Status) and host.message.startswith("cpu: needs 1e+06 GiB of memory")


def test_busy_devices_make_a_job_wait_with_a_reason() -> None:
    executor = LocalExecutor(discover(fake(nvidia=dgx_h100())), node=NODE)
    placed = place_now(
        executor,
        Request(accelerator_types=["h100-sxm"], devices=4),
        {NODE: Busy(devices={"h100-sxm": {0, 1, 2, 3, 4}})},
    )
    assert isinstance(placed, Status) and placed.transient
    assert placed.message == "h100-sxm: 3 of 8 devices free, needs 4"


def test_cpu_jobs_share_cores_without_oversubscribing() -> None:
    executor = LocalExecutor(discover(fake()), node=NODE)
    whole = place_now(executor, Request(accelerator_types=["cpu"], devices=2), {})
    assert isinstance(whole, Placement) and whole.threads_per_process == 8 and len(whole.core_ids) == 16
    env = executor.environment(whole)
    assert env["OMP_NUM_THREADS"] == "8" and env["CUDA_VISIBLE_DEVICES"] == ""
    half = place_now(
        executor,
        Request(accelerator_types=["cpu"], devices=1, cpus_per_device=8),
        {NODE: Busy(cores=set(range(10)))},
    )
    assert isinstance(half, Status) and half.message == "cpu: 6 of 16 cores free, needs 8"
    too_many = place_now(executor, Request(accelerator_types=["cpu"], devices=32), {})
    assert isinstance(too_many, Status) and not too_many.transient


def test_torch_is_asked_for_devices_only_where_the_os_shows_one(tmp_path: Path) -> None:
    # Importing torch takes seconds: a machine with no device file is answered without it.
    from shipyard.hardware import discovery

    assert not discovery._os_shows_a_device(tmp_path)
    for device_file in ("nvidia0", "dxg", "nvhost-ctrl-gpu", "kfd", "dri/renderD128", "accel/accel0", "hl0"):
        dev = tmp_path / device_file.replace("/", "-")
        (dev / device_file).parent.mkdir(parents=True, exist_ok=True)
        (dev / device_file).touch()
        assert discovery._os_shows_a_device(dev), device_file


def test_the_host_probe_keeps_its_measurement_for_the_next_process_of_this_machine(tmp_path: Path) -> None:
    import json

    from shipyard.hardware.probe import measure_host

    measured = measure_host(tmp_path)
    kept = tmp_path / "host-rates.json"
    record = json.loads(kept.read_text())
    assert record["rates"]["gemm_gflops_per_thread"] == measured.gemm_gflops_per_thread  # type: ignore[union-attr]
    # The next process reads it (a doctored figure shows it was not measured again)...
    record["rates"]["op_overhead_us"] = 123.0
    kept.write_text(json.dumps(record))
    measure_host.cache_clear()
    assert measure_host(tmp_path).op_overhead_us == 123.0  # type: ignore[union-attr]
    # ...unless it was another machine's (or another boot's), or is older than a day.
    for stale in ({"machine": "elsewhere"}, {"measured_at": record["measured_at"] - 25 * 3600}):
        kept.write_text(json.dumps({**record, **stale}))
        measure_host.cache_clear()
        assert measure_host(tmp_path).op_overhead_us != 123.0  # type: ignore[union-attr]
    kept.write_text("{not json")
    measure_host.cache_clear()
    assert measure_host(tmp_path) is not None and json.loads(kept.read_text())["machine"] != "elsewhere"
