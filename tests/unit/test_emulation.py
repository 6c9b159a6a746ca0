"""The seam for hardware a machine lacks (``SHIPYARD_EMULATE_ACCELERATORS``) and the head's state
store option of `node start`: what they accept, and the errors that name the fix."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from shipyard.errors import ExecutorError, InvalidSpec
from shipyard.hardware.emulation import parse_emulated
from shipyard.services.cluster import cluster


def test_emulated_accelerators_come_from_the_catalog_with_indices_counting_on() -> None:
    devices = parse_emulated("h100-sxm:2, a100-80gb:1")
    assert [(d.accelerator_type, d.index) for d in devices] == [
        ("h100-sxm", 0),
        ("h100-sxm", 1),
        ("a100-80gb", 2),
    ]
    assert devices[0].memory_gib == 80 and devices[0].vendor == "nvidia"
    assert parse_emulated("") == ()


@pytest.mark.parametrize("text", ["h999:2", "h100-sxm", "h100-sxm:0", "h100-sxm:two"])
def test_an_emulated_entry_that_is_not_a_catalog_type_and_count_is_refused(text: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse_emulated(text)
    assert repr(text.strip()) in refused.value.message and "plan catalog" in (refused.value.hint or "")


def test_a_state_store_must_be_host_and_port_and_answer() -> None:
    with pytest.raises(InvalidSpec, match="is not HOST:PORT"):
        cluster.check_state_store("redis-without-port")
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ExecutorError, match=f"no Redis answers at 127.0.0.1:{port}"):
        cluster.check_state_store(f"127.0.0.1:{port}")


def test_the_head_keeps_its_state_under_its_own_name(tmp_path: Path) -> None:
    """One namespace per home: the same home's head, started again, finds its state."""
    folder = cluster.ray_temp_dir(tmp_path)
    joining = cluster.Joining(address=None, labels={}, env={}, temp_dir=folder, state_store="10.0.0.5:6379")
    assert cluster.ray_start_env(joining) == {
        "RAY_REDIS_ADDRESS": "10.0.0.5:6379",
        "RAY_external_storage_namespace": folder.name,
    }
    assert cluster.ray_start_env(cluster.Joining(address=None, labels={}, env={}, temp_dir=folder)) == {}
