"""``shipyard node start`` (a machine joins the cluster through Ray), ``shipyard node stop`` (it
leaves: its own Ray processes end, no other Ray of the machine) and ``shipyard nodes`` (every
node: accelerators, devices free and used, labels, health, the jobs on it)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from shipyard.cli._output import JsonOpt, rows_or_json
from shipyard.cli._remote import either
from shipyard.executors.cluster_nodes import parse_labels
from shipyard.schemas.views import NodeView

node_app = typer.Typer(help="This machine as a node of a Ray cluster.", no_args_is_help=True)


@node_app.command("start")
def start(
    head: Annotated[bool, typer.Option("--head", help="Start the cluster's head node here.")] = False,
    address: Annotated[
        str | None, typer.Option("--address", help="Join the head at HOST:PORT (what `--head` printed).")
    ] = None,
    port: Annotated[int, typer.Option(help="The head's port.")] = 6380,
    name: Annotated[str | None, typer.Option(help="The node's name (default: the host name).")] = None,
    rack: Annotated[str | None, typer.Option(help="Failure domain: the rack.")] = None,
    switch: Annotated[str | None, typer.Option(help="Topology: the network switch.")] = None,
    ib_fabric: Annotated[str | None, typer.Option(help="Topology: the InfiniBand fabric.")] = None,
    label: Annotated[list[str] | None, typer.Option(help="Any other label, KEY=VALUE (repeatable).")] = None,
    scratch: Annotated[
        Path | None, typer.Option(help="Run folders and caches of this node's attempts (its own disk).")
    ] = None,
    nccl_socket_ifname: Annotated[
        str | None, typer.Option(help="NCCL_SOCKET_IFNAME of this node's ranks (e.g. eth0, ib0).")
    ] = None,
    nccl_ib_hca: Annotated[str | None, typer.Option(help="NCCL_IB_HCA of this node's ranks.")] = None,
    loopback: Annotated[
        bool, typer.Option(help="Advertise this node at 127.0.0.1 (every node of a one-machine cluster).")
    ] = False,
    state_store: Annotated[
        str | None,
        typer.Option(
            help="The head's Redis at HOST:PORT, keeping the cluster's state: jobs run on through a "
            "restart of the head (Ray's GCS fault tolerance)."
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the `ray start` command only.")] = False,
) -> None:
    """Discover this machine's devices and start its Ray node advertising them."""
    from shipyard.cli._contexts import command_context
    from shipyard.errors import InvalidSpec
    from shipyard.services.cluster import cluster

    if head == (address is not None):
        raise InvalidSpec(
            "give exactly one of --head and --address",
            hint="the first machine: shipyard node start --head; the others: "
            "shipyard node start --address HEAD:PORT",
        )
    if state_store is not None:
        if not head:
            raise InvalidSpec(
                "--state-store is the head's: the other nodes find the state through it",
                hint=f"shipyard node start --address {address} (without --state-store)",
            )
        cluster.check_state_store(state_store)
    labels = parse_labels(label or [])
    for key, value in (("rack", rack), ("switch", switch), ("ib_fabric", ib_fabric)):
        if value:
            labels[key] = value
    env = {k: v for k, v in (("NCCL_SOCKET_IFNAME", nccl_socket_ifname), ("NCCL_IB_HCA", nccl_ib_hca)) if v}
    ctx = command_context()
    joining = cluster.Joining(
        address=address,
        port=port,
        name=name,
        labels=labels,
        scratch=scratch,
        env=env,
        loopback=loopback,
        temp_dir=cluster.ray_temp_dir(ctx.settings.home),
        state_store=state_store,
    )
    ad = cluster.advertisement(ctx, joining)
    if dry_run:  # quoted for a shell: the resources are JSON
        assignments = [f"{key}={value}" for key, value in cluster.ray_start_env(joining).items()]
        typer.echo(shlex.join([*assignments, *cluster.ray_start_command(ad, joining)]))
        return
    joined = cluster.start_node(ad, joining, ctx.settings.home)
    kinds = ", ".join(f"{k}: {v}" for k, v in ad.inventory().capacity().items())
    measured = f"; its host dispatches an operation in {ad.host.op_overhead_us:.2g} us" if ad.host else ""
    typer.echo(f"node {ad.node} joined the cluster at {joined} ({kinds}{measured})")
    if head:
        typer.echo(f"other machines: shipyard node start --address {joined}")
        typer.echo(f"the server: SHIPYARD_EXECUTOR=ray SHIPYARD_RAY_ADDRESS={joined} shipyard server")
    typer.echo("to leave: shipyard node stop")


@node_app.command("stop")
def stop() -> None:
    """Stop the node `shipyard node start` started with this home: its Ray processes end (SIGTERM,
    then SIGKILL after 15 s); every other Ray on this machine is left running."""
    from shipyard.services.cluster import cluster
    from shipyard.settings import Settings

    stopped = cluster.stop_node(Settings.from_env().home)
    killed = f", {stopped.killed} of them killed after the grace" if stopped.killed else ""
    typer.echo(f"node {stopped.node} stopped ({stopped.processes} processes{killed})")


def _pairs(values: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items())) or "-"


def _health(node: NodeView) -> str:
    if node.unknown:
        return f"UNKNOWN: {node.unknown}"
    if node.problems:
        return "cordoned: " + "; ".join(node.problems)
    return "up" if node.up else "DOWN"


def nodes(json_out: JsonOpt = False) -> None:
    """Every node: accelerator types, devices used of all, labels, health, its jobs."""
    from shipyard.services.cluster.cluster import list_nodes

    found: list[NodeView] = either(lambda c: c.cluster_nodes(), list_nodes)
    rows_or_json(
        found,
        json_out,
        ["node", "health", "devices (used/all)", "host op", "labels", "jobs"],
        lambda n: (
            n.id,
            _health(n),
            ", ".join(f"{k} {n.used.get(k, 0)}/{v}" for k, v in sorted(n.capacity.items())),
            "-" if n.host_op_us is None else f"{n.host_op_us:.2g} us",
            ",".join(f"{k}={v}" for k, v in sorted(n.labels.items()) if k != "hostname") or "-",
            ",".join(n.jobs) or "-",
        ),
    )


def register(app: typer.Typer) -> None:
    app.add_typer(node_app, name="node")
    app.command()(nodes)
