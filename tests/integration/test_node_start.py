"""``shipyard node start``: this machine joins as a real Ray head advertising what discovery found,
and ``shipyard nodes`` lists it."""

from __future__ import annotations

import json
import shlex
import shutil
import socket
from pathlib import Path

import pytest

from shipyard.executors.processes import descendants, has_ended
from shipyard.services import cluster
from shipyard.storage import config as storage_config
from tests.conftest import Cli

pytestmark = [pytest.mark.integration, pytest.mark.ray]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_dry_run_prints_the_ray_start_command_with_what_this_machine_has(cli: Cli) -> None:
    done = cli.run("node", "start", "--head", "--rack", "r7", "--label", "zone=a", "--dry-run")
    command = shlex.split(done.stdout.strip())  # as a shell reads it: it can be pasted
    assert command[1:4] == ["start", "--head", "--port=6380"]
    options = dict(arg.split("=", 1) for arg in command[4:] if "=" in arg)
    resources = json.loads(options["--resources"])
    assert resources["shipyard-node/" + socket.gethostname()] == 1000 and resources["shipyard/cpu"] >= 1
    assert "rack=r7" in options["--labels"] and "zone=a" in options["--labels"]
    assert options["--temp-dir"] == str(cluster.ray_temp_dir(cli.home))  # its own: what `node stop` ends
    both = cli.run("node", "start", "--head", "--address", "x:1", check=False)
    assert both.returncode == 1 and "exactly one of --head and --address" in both.stderr


def ray_processes(home: Path) -> list[int]:
    """The processes of the node ``home`` started: those naming its Ray folder, and their children."""
    return descendants(cluster._naming(str(cluster.ray_temp_dir(home))))


def test_a_head_started_here_is_listed_with_its_devices_and_stops_alone(cli: Cli, tmp_path: Path) -> None:
    """Two nodes of two homes on this machine (two one-machine clusters); `node stop` ends the
    first one's Ray processes and leaves the other's running, as `ray stop` would not."""
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
    other = Cli(tmp_path / "other")
    try:
        assert f"node here joined the cluster at 127.0.0.1:{port}" in started.stdout
        cli.env.update({"SHIPYARD_EXECUTOR": "ray", "SHIPYARD_RAY_ADDRESS": f"127.0.0.1:{port}",
                        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})  # fmt: skip
        [node] = cli.json("nodes")
        assert node["id"] == "here" and node["up"] and node["labels"]["rack"] == "r1"
        assert node["capacity"]["cpu"] >= 1
        # The node measured its host as it joined; the cluster's estimates plan that host with it.
        assert node["host_op_us"] > 0 and "its host dispatches an operation in" in started.stdout
        assert "to leave: shipyard node stop" in started.stdout
        other.run("node", "start", "--head", "--loopback", "--port", str(free_port()), "--name", "other",
                  timeout=120)  # fmt: skip
        others = cluster._naming(str(cluster.ray_temp_dir(other.home)))  # its raylet, its GCS, …
        assert ray_processes(cli.home) and others
        stopped = cli.run("node", "stop", timeout=60)
        assert "node here stopped" in stopped.stdout
        assert ray_processes(cli.home) == []
        assert not any(has_ended(pid) for pid in others)  # the other node runs on
        again = cli.run("node", "stop", check=False)
        assert again.returncode == 1 and "nothing to stop" in again.stderr
    finally:
        for home in (cli, other):
            home.run("node", "stop", check=False, timeout=60)
            shutil.rmtree(cluster.ray_temp_dir(home.home), ignore_errors=True)  # the nodes' Ray logs
