"""``shipyard node start``: this machine joins as a real Ray head advertising what discovery found,
and ``shipyard nodes`` lists it."""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from shipyard.errors import DependencyMissing
from shipyard.executors.processes import descendants, has_ended
from shipyard.services.cluster import cluster
from shipyard.storage import config as storage_config
from tests.builders import write_spec
from tests.conftest import Cli, Server
from tests.support.ports import quiet_port
from tests.support.redis_server import RedisServer
from tests.support.seaweedfs import SeaweedCluster

pytestmark = [pytest.mark.integration, pytest.mark.ray]


def _served_nodes(served: Server, headers: dict[str, str]) -> dict[str, dict[str, Any]]:
    answer = httpx.get(f"{served.url}/api/v1/nodes/status", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text  # whether the cluster's head is up or not
    return {node["id"]: node for node in answer.json()}


def _wait_served(
    served: Server, headers: dict[str, str], until: Callable[[dict[str, Any]], bool]
) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + 180
    while not ((nodes := _served_nodes(served, headers)) and all(until(n) for n in nodes.values())):
        assert time.monotonic() < deadline, (nodes, (served.home / "agent.log").read_text()[-3000:])
        time.sleep(1)
    assert set(nodes) == {"here", "edge"}
    return nodes


def serve_the_cluster(cli: Cli, port: int) -> tuple[Server, dict[str, str]]:
    """A server of the cluster: it lists the nodes as its agent recorded them, and never joins
    Ray itself (a process that joins dies a minute after the head; the server must not): Ray's
    core library is not even loaded in its process. Its watchdog keeps the agent that keeps the
    record running, with no job submitted."""
    ray_env = {
        "SHIPYARD_EXECUTOR": "ray",
        "SHIPYARD_RAY_ADDRESS": f"127.0.0.1:{port}",
        "SHIPYARD_FAULTS": json.dumps({"slow_rank": 0, "slow_s": 0.05}),  # a job outlasts a head restart
    }
    served = Server(
        cli.home / "served", f"sqlite:///{cli.home / 'served.sqlite'}", "horse battery", env=ray_env
    )
    storage_config.save(served.home, storage_config.load(cli.home))
    issued = httpx.post(
        f"{served.url}/api/v1/auth/token", json={"username": "admin", "password": served.admin_password}
    )
    headers = {"Authorization": f"Bearer {issued.json()['token']}"}
    _wait_served(served, headers, lambda node: node["up"])
    assert "_raylet" not in Path(f"/proc/{served.process.pid}/maps").read_text()
    return served, headers


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


def test_a_second_node_joins_as_the_readme_says_and_each_node_stops_alone(cli: Cli, tmp_path: Path) -> None:
    """The README's cluster on one machine: a head keeping the cluster's state in a Redis
    (``--state-store``), then a second node joining it with `node start --address` (two homes, as
    two machines would have), both listed by `shipyard nodes` and by a server of the cluster. A job
    runs on the second node through that server. The head stops under it: the server answers on,
    its nodes of unknown state; the head started again, the job runs on, found again by the agent
    rather than started over. `node stop` on the second node ends its Ray processes and leaves the
    head's running, as `ray stop` (every Ray of the machine) would not."""
    pytest.importorskip("ray")
    pytest.importorskip("boto3")
    port = quiet_port()
    second = Cli(tmp_path / "second")
    with contextlib.ExitStack() as stack:
        try:
            redis = RedisServer(tmp_path / "redis").start()
            stack.callback(redis.stop)
            store = SeaweedCluster(tmp_path / "seaweedfs").start()
            stack.callback(store.stop)
        except DependencyMissing as exc:
            pytest.skip(str(exc))
        storage_config.save(cli.home, storage_config.StorageConfig(backend="s3", s3=store.s3))
        for home in (cli, second):  # last out: the nodes, then the store they write to
            stack.callback(shutil.rmtree, cluster.ray_temp_dir(home.home), ignore_errors=True)  # Ray's logs
            stack.callback(home.run, "node", "stop", check=False, timeout=60)
        head_start = ("node", "start", "--head", "--loopback", "--port", str(port), "--name", "here",
                      "--state-store", redis.address)  # fmt: skip
        started = cli.run(*head_start, "--rack", "r1", timeout=180)
        assert f"node here joined the cluster at 127.0.0.1:{port}" in started.stdout
        assert "to leave: shipyard node stop" in started.stdout
        joined = second.run("node", "start", "--address", f"127.0.0.1:{port}", "--loopback", "--name", "edge",
                            "--rack", "r2", timeout=180)  # fmt: skip
        assert f"node edge joined the cluster at 127.0.0.1:{port}" in joined.stdout
        assert "Connected to Ray cluster" not in joined.stdout + joined.stderr  # Ray's chatter is not ours
        cli.env.update({"SHIPYARD_EXECUTOR": "ray", "SHIPYARD_RAY_ADDRESS": f"127.0.0.1:{port}"})
        nodes = {node["id"]: node for node in cli.json("nodes")}
        assert set(nodes) == {"here", "edge"} and all(node["up"] for node in nodes.values())
        assert (nodes["here"]["labels"]["rack"], nodes["edge"]["labels"]["rack"]) == ("r1", "r2")
        assert nodes["here"]["capacity"]["cpu"] >= 1
        # Each node measured its host as it joined; the cluster's estimates plan that host with it.
        assert nodes["edge"]["host_op_us"] > 0 and "its host dispatches an operation in" in joined.stdout
        served, headers = serve_the_cluster(cli, port)
        stack.callback(served.stop)
        laptop = Cli(tmp_path / "laptop")
        laptop.env.update({"SHIPYARD_URL": served.url, "SHIPYARD_TOKEN": headers["Authorization"][7:]})
        # Best fit among equal nodes takes the first by name: the job lands on "edge", not the head.
        # Longer than any wait below: it is cancelled once seen running on after the restart.
        spec = write_spec(tmp_path, training={"steps": 5000, "eval_interval": 0}, checkpoint={"interval": 50})
        job = laptop.json("jobs", "submit", str(spec))
        laptop.wait_for(job["id"], lambda j: j["state"] == "running" and j["step"] >= 2)
        heads = cluster._naming(str(cluster.ray_temp_dir(cli.home)))  # its GCS, its raylet, …
        assert heads and ray_processes(second.home)
        # The head goes away: the server answers on, and says its record is all it knows.
        cli.run("node", "stop", timeout=60)
        away = _wait_served(served, headers, lambda node: node["unknown"] is not None)
        assert "this is its last record" in away["here"]["unknown"]
        # The head comes back with the state it kept: the job on "edge" was never stopped.
        cli.run(*head_start, timeout=180)
        _wait_served(served, headers, lambda node: node["up"] and node["unknown"] is None)
        back = laptop.json("jobs", "show", job["id"])["step"]
        # Its metrics reach the agent again: the same attempt, re-adopted, not rerun.
        on = laptop.wait_for(job["id"], lambda j: j["state"] != "running" or j["step"] > back + 5)
        assert on["state"] == "running"
        assert [(a["number"], a["node"]) for a in on["attempts"]] == [(1, "edge")]
        laptop.run("jobs", "cancel", job["id"])  # and its ranks hear the agent's signal
        done = laptop.wait_for(job["id"], lambda j: j["state"] not in ("queued", "running"))
        ended = [(a["number"], a["exit_reason"], a["exit_code"]) for a in done["attempts"]]
        assert done["state"] == "cancelled" and ended == [(1, "cancelled", 0)], done
        assert served.process.poll() is None  # the same server all along
        # Each node stops alone.
        heads = cluster._naming(str(cluster.ray_temp_dir(cli.home)))
        stopped = second.run("node", "stop", timeout=60)
        assert "node edge stopped" in stopped.stdout
        assert ray_processes(second.home) == []
        assert not any(has_ended(pid) for pid in heads)  # the head runs on
        again = second.run("node", "stop", check=False)
        assert again.returncode == 1 and "nothing to stop" in again.stderr
