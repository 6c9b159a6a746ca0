"""``shipyard node start``: this machine joins as a real Ray head advertising what discovery found,
and ``shipyard nodes`` lists it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shipyard.storage import config as storage_config
from tests.conftest import Cli

pytestmark = [pytest.mark.integration, pytest.mark.ray]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_dry_run_prints_the_ray_start_command_with_what_this_machine_has(cli: Cli) -> None:
    done = cli.run("node", "start", "--head", "--rack", "r7", "--label", "zone=a", "--dry-run")
    command = done.stdout.strip()
    assert " start --head --port=6380 " in command
    resources = json.loads(command.split("--resources=")[1].split(" --labels=")[0])
    assert resources["shipyard-node/" + socket.gethostname()] == 1000 and resources["shipyard/cpu"] >= 1
    assert "rack=r7" in command and "zone=a" in command
    both = cli.run("node", "start", "--head", "--address", "x:1", check=False)
    assert both.returncode == 1 and "exactly one of --head and --address" in both.stderr


def test_a_head_started_here_is_listed_with_its_devices(cli: Cli, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    port = free_port()
    storage_config.save(
        cli.home,
        storage_config.StorageConfig(
            backend="s3", s3=storage_config.S3Config(endpoint_url="http://127.0.0.1:9", bucket="b")
        ),
    )
    started = cli.run("node", "start", "--head", "--loopback", "--port", str(port), "--name", "here",
                      "--rack", "r1", timeout=120)  # fmt: skip
    try:
        assert f"node here joined the cluster at 127.0.0.1:{port}" in started.stdout
        cli.env.update({"SHIPYARD_EXECUTOR": "ray", "SHIPYARD_RAY_ADDRESS": f"127.0.0.1:{port}",
                        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})  # fmt: skip
        [node] = cli.json("nodes")
        assert node["id"] == "here" and node["up"] and node["labels"]["rack"] == "r1"
        assert node["capacity"]["cpu"] >= 1
        # The node measured its host as it joined; the cluster's estimates plan that host with it.
        assert node["host_op_us"] > 0 and "its host dispatches an operation in" in started.stdout
    finally:
        subprocess.run([str(Path(sys.executable).with_name("ray")), "stop", "--force"], capture_output=True,
                       check=False)  # fmt: skip
