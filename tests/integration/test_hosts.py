"""A cluster of two hosts that are network namespaces this test makes: each with a network stack,
an address and a host name of its own, on a bridge as machines on a switch (``tests/support/
hosts.py``). Each node is started with `shipyard node start` on its host as on its own machine,
by address and without ``--loopback``; the agent runs on this machine, and a 2-node job's ranks
meet across the hosts' addresses."""

from __future__ import annotations

from pathlib import Path

import pytest

from shipyard.errors import DependencyMissing
from shipyard.storage import config as storage_config
from tests.builders import write_spec
from tests.conftest import SHIPYARD, Cli
from tests.support.hosts import Hosts
from tests.support.seaweedfs import SeaweedCluster

pytestmark = [pytest.mark.integration, pytest.mark.ray]


def test_two_hosts_join_by_address_and_a_job_spans_them(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    pytest.importorskip("boto3")
    try:
        hosts = Hosts(("alpha", "beta")).up()
    except DependencyMissing as exc:
        pytest.skip(str(exc))
    nodes = {name: Cli(tmp_path / name) for name in hosts.names}
    store: SeaweedCluster | None = None
    try:
        head = f"{hosts.address('alpha')}:6380"  # each host has its own ports: the default is free
        started = hosts.run("alpha", [*SHIPYARD, "node", "start", "--head"], nodes["alpha"].env)
        assert started.returncode == 0, started.stderr
        # The head names its address as the others reach it, not a host name they may not resolve.
        assert f"node alpha joined the cluster at {head}" in started.stdout, started.stdout
        assert f"other machines: shipyard node start --address {head}" in started.stdout
        joined = hosts.run("beta", [*SHIPYARD, "node", "start", "--address", head], nodes["beta"].env)
        assert joined.returncode == 0 and f"node beta joined the cluster at {head}" in joined.stdout, joined
        store = SeaweedCluster(tmp_path / "seaweedfs", s3_ip=hosts.router).start()
        cli = Cli(tmp_path / "home")  # the server's machine: this one, routing to the hosts
        cli.env.update({"SHIPYARD_EXECUTOR": "ray", "SHIPYARD_RAY_ADDRESS": head})
        storage_config.save(cli.home, storage_config.StorageConfig(backend="s3", s3=store.s3))
        listed = {node["id"]: node for node in cli.json("nodes")}
        assert set(listed) == {"alpha", "beta"} and all(node["up"] for node in listed.values())
        spec = write_spec(
            tmp_path, training={"steps": 6, "eval_interval": 0, "parallelism": "ddp"},
            resources={"accelerator": "cpu", "devices": 1, "nodes": 2, "cpus_per_device": 1},
        )  # fmt: skip
        done = cli.run("jobs", "submit", str(spec), "--wait", "--json", check=False, timeout=600)
        assert done.returncode == 0, (done.stdout, done.stderr, (cli.home / "agent.log").read_text()[-3000:])
        job = cli.json("jobs", "show", done.stdout.split('"id": "')[1].split('"')[0])
        assert job["state"] == "succeeded"
        assert set(job["attempts"][0]["node"].split(",")) == {"alpha", "beta"}
        log = cli.run("jobs", "logs", job["id"]).stdout
        assert "[rank 0] step 6/6" in log and "[rank 1]" in log
        cli.stop_agent()
    finally:
        for node in nodes.values():  # `node stop` finds a node's processes by its Ray folder, any host
            node.run("node", "stop", check=False, timeout=60)
        if store is not None:
            store.stop()
        hosts.down()
