"""Node health: what cordons a node. The GPU answers come through the vendor seam (this machine
has no NVIDIA GPU): a fake NVML that reports ECC errors on one device."""

from __future__ import annotations

from pathlib import Path

from shipyard.agent.telemetry import node_problems
from shipyard.hardware.discovery import CpuInfo, VendorQueries
from shipyard.hardware.health import disk_problems
from shipyard.services.context import ServiceContext
from shipyard.settings import Settings


def test_too_little_free_disk_is_a_problem_that_says_how_much_and_where(tmp_path: Path) -> None:
    assert disk_problems(tmp_path, min_free_gib=0.001) == []
    [problem] = disk_problems(tmp_path / "runs" / "not-yet", min_free_gib=1e12)
    assert problem.startswith("disk: ") and f"free under {tmp_path}," in problem
    assert "SHIPYARD_MIN_FREE_DISK_GIB" in problem


def test_a_gpu_with_uncorrectable_ecc_errors_cordons_the_node(tmp_path: Path) -> None:
    queries = VendorQueries(
        nvidia=list,
        torch_devices=list,
        cpu=lambda: CpuInfo(model="test", cores=2, mhz=2000.0, flags=frozenset()),
        health=lambda: {1: "3 uncorrectable ECC errors since the driver loaded"},
    )
    settings = Settings(home=tmp_path, db_url=f"sqlite:///{tmp_path / 'db'}", min_free_disk_gib=0.001)
    ctx = ServiceContext(settings=settings, db=None, vendor_queries=queries)  # type: ignore[arg-type]
    assert node_problems(ctx) == ["accelerator 1: 3 uncorrectable ECC errors since the driver loaded"]
