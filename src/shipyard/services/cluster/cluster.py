"""Nodes joining the cluster (``shipyard node start``) and the cluster as users see it
(``shipyard nodes``): each node's accelerators, what is used, its labels, health and jobs."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select

from shipyard.db import AgentStatus, Attempt, Job
from shipyard.domain import JobState
from shipyard.durable import write_json_atomic
from shipyard.errors import DependencyMissing, ExecutorError, InvalidSpec, NotFound
from shipyard.executors.cluster_nodes import NAMESPACE, Advertisement, kv_key
from shipyard.executors.processes import descendants, has_ended
from shipyard.hardware import discover
from shipyard.hardware.emulation import EMULATE_ENV, parse_emulated
from shipyard.hardware.probe import measure_host
from shipyard.schemas.views import NodeView
from shipyard.services.accounts import rbac
from shipyard.services.caches.submitted_jobs import aware
from shipyard.services.context import ServiceContext

DEFAULT_PORT = 6380
"""The head's port (Ray's own default, 6379, is often Redis's)."""
NODE_FILE = "node.json"
"""In the home: the node ``shipyard node start`` started, for ``shipyard node stop``."""
JOIN_TIMEOUT_S = 120.0
"""How long `ray start` may take to start or join a node before it is given up."""
STOP_GRACE_S = 15.0
"""Between asking a node's processes to end (SIGTERM) and killing those left."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Joining:
    """How a node joins: as the head (``address`` None) or as a worker of the head at ``address``."""

    address: str | None
    port: int = DEFAULT_PORT
    name: str | None = None
    labels: Mapping[str, str]
    scratch: Path | None = None
    env: Mapping[str, str]
    loopback: bool = False
    num_cpus: int | None = None
    temp_dir: Path | None = None
    """The node's own Ray folder (sessions, sockets, logs): what ``node stop`` finds its
    processes by, so that it ends this node and no other Ray on the machine."""
    state_store: str | None = None
    """A head's Redis (``HOST:PORT``) that keeps the cluster's state (Ray's GCS fault tolerance):
    a head started again with it finds the nodes, placement groups and actors still running."""


def ray_temp_dir(home: Path) -> Path:
    """The Ray folder of the node a home starts: short (Ray's socket paths must fit in 107
    bytes, which a folder under a deep home would not) and one per home."""
    digest = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"shipyard-ray-{digest}"


def advertisement(ctx: ServiceContext, joining: Joining) -> Advertisement:
    """This machine as it will join: its devices (discovered here), labels, scratch folder."""
    name = joining.name or os.environ.get("SHIPYARD_NODE_NAME") or socket.gethostname()
    scratch = joining.scratch or ctx.settings.home / "node"
    devices = tuple(discover(ctx.vendor_queries))
    # The seam for hardware this machine lacks (trying a cluster, its tests): see ``emulation``.
    emulated = parse_emulated(os.environ.get(EMULATE_ENV, ""))
    if emulated:  # advertised instead of this machine's accelerators; its CPU stays
        devices = (*emulated, *(device for device in devices if device.accelerator_type == "cpu"))
    ad = Advertisement(
        node=name,
        devices=devices,
        labels=dict(joining.labels),
        scratch=str(scratch.resolve()),
        env=dict(joining.env),
        host=measure_host(ctx.settings.cache_dir),
        emulated=bool(emulated),
    )
    ad.check()
    return ad


def ray_start_command(ad: Advertisement, joining: Joining) -> list[str]:
    """``ray start`` with what Shipyard needs advertised: nobody writes resource JSON by hand."""
    ray = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    where = [f"--address={joining.address}"] if joining.address else ["--head", f"--port={joining.port}"]
    command = [
        ray,
        "start",
        *where,
        f"--resources={json.dumps(ad.resources(), sort_keys=True)}",
        f"--labels={','.join(f'{k}={v}' for k, v in sorted(ad.ray_labels().items()))}",
        f"--num-gpus={ad.gpus()}",
        "--disable-usage-stats",
    ]
    if joining.num_cpus is not None:
        command.append(f"--num-cpus={joining.num_cpus}")
    if joining.address is None:
        command.append("--include-dashboard=false")
    if joining.loopback:
        command.append("--node-ip-address=127.0.0.1")
    if joining.temp_dir is not None:
        command.append(f"--temp-dir={joining.temp_dir}")
    return command


def ray_start_env(joining: Joining) -> dict[str, str]:
    """What ``ray start`` reads from its environment beyond the command line: where a head keeps
    the cluster's state, under a name of this node's own (one per home, so a restart finds it)."""
    if joining.state_store is None:
        return {}
    namespace = joining.temp_dir.name if joining.temp_dir else "shipyard"
    return {"RAY_REDIS_ADDRESS": joining.state_store, "RAY_external_storage_namespace": namespace}


def check_state_store(address: str) -> None:
    """Refuse a state store that does not answer now: ``ray start`` would wait on it in silence."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidSpec(
            f"--state-store {address!r} is not HOST:PORT", hint="e.g. --state-store 10.0.0.5:6379 (a Redis)"
        )
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as exc:
        raise ExecutorError(
            f"no Redis answers at {address} ({exc.strerror or exc})",
            hint="start one for the cluster's state (redis-server --port PORT) or leave out --state-store",
        ) from exc


def routable_ip() -> str:
    """The address other machines reach this one at, as Ray picks its node's: the source address
    of the default route (a host name may not resolve on the others)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("8.8.8.8", 80))  # a UDP connect sends nothing: it only picks the route
            return str(probe.getsockname()[0])
        except OSError:  # no route at all: the name is the best left
            return socket.gethostbyname(socket.gethostname())


def start_node(ad: Advertisement, joining: Joining, home: Path | None = None) -> str:
    """Start this machine's Ray node and record its devices; returns the head's address. With
    ``home``, the node is recorded there for ``stop_node``."""
    command = ray_start_command(ad, joining)
    if not Path(command[0]).exists():
        raise DependencyMissing("`ray` is not installed here", hint="pip install 'shipyard[cluster]'")
    # Set, this keeps a head on 127.0.0.1 alone and makes Ray refuse any node that joins ("not
    # supported on Windows and OSX"): a Shipyard node is always one a cluster can grow from.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env.update(ray_start_env(joining))
    # Into a file, not a pipe: the daemons `ray start` leaves running would hold a pipe open.
    log_path = Path(ad.scratch) / "ray-start.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        try:
            done = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, check=False, timeout=JOIN_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as exc:
            raise ExecutorError(
                f"`ray start` did not join {joining.address or 'as the head'} within {JOIN_TIMEOUT_S:.0f} s "
                f"(its output: {log_path})",
                hint="check that the head's address (what `node start --head` printed) answers from "
                "here; on one machine give every node --loopback",
            ) from exc
    if done.returncode != 0:
        last = log_path.read_text(errors="replace").strip().splitlines()[-1:]
        raise ExecutorError(
            f"`ray start` failed: {last[0] if last else 'no output'} (all of it: {log_path})",
            hint="`shipyard node stop` ends the node this home started; check that the head's address "
            "answers from here",
        )
    address = joining.address or f"{'127.0.0.1' if joining.loopback else routable_ip()}:{joining.port}"
    if home is not None and joining.temp_dir is not None:
        home.mkdir(parents=True, exist_ok=True)
        record = {"node": ad.node, "address": address, "temp_dir": str(joining.temp_dir)}
        write_json_atomic(home / NODE_FILE, record)
    register(ad, address)
    return address


@dataclass(frozen=True, slots=True)
class StoppedNode:
    node: str
    processes: int
    killed: int
    """Of ``processes``, those that outlived the grace and were killed."""


def stop_node(home: Path, grace_s: float = STOP_GRACE_S) -> StoppedNode:
    """End the Ray node this home started: the processes whose command line names its Ray folder
    and every process they started, SIGTERM first, then SIGKILL after ``grace_s``. Every other
    Ray on the machine is left alone, which ``ray stop`` does not do."""
    try:
        node = str(json.loads((home / NODE_FILE).read_text())["node"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NotFound(
            f"no node was started with this home ({home}): nothing to stop",
            hint="start one with `shipyard node start --head` or `--address HEAD:PORT`",
        ) from exc
    # The folder as this home names it, not as the file says: a damaged record must never widen
    # what is matched (an empty path is in every command line).
    folder = ray_temp_dir(home)
    pids = descendants(_naming(f"{folder}/"))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (left := [pid for pid in pids if not has_ended(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    (home / NODE_FILE).unlink(missing_ok=True)
    # Ray's note of the address this node started at: left, a head started again refuses while
    # another node of this machine still names that address ("already running at").
    (folder / "ray_current_cluster").unlink(missing_ok=True)
    return StoppedNode(node=node, processes=len(pids), killed=len(left))


def _naming(text: str) -> list[int]:
    """Processes (not this one) whose command line holds ``text`` (a raylet's workers rename
    themselves: ``descendants`` finds those)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
    return found


def register(ad: Advertisement, address: str) -> None:
    """Put the node's record (devices, scratch, NCCL settings) into the cluster's key-value store."""
    import ray
    from ray.experimental import internal_kv

    connected = ray.is_initialized()
    if not connected:
        ray.init(
            address=address,
            namespace=NAMESPACE,
            log_to_driver=False,
            include_dashboard=False,
            logging_level=logging.WARNING,  # not Ray's "Connected to Ray cluster" among ours
        )
    try:
        internal_kv._internal_kv_put(kv_key(ad.node), ad.to_json(), overwrite=True)
    finally:
        if not connected:
            ray.shutdown()


def list_nodes(ctx: ServiceContext) -> list[NodeView]:
    """Every node the executor knows, down ones too, with what its running attempts use. The
    devices in use count every job; the jobs named are only those the caller may see."""
    with ctx.db.read() as session:
        visible = rbac.visible_projects(session, ctx.actor)
        running = session.execute(
            select(
                Attempt.job_id,
                Attempt.node,
                Attempt.accelerator_type,
                Attempt.device_ids,
                Attempt.threads_per_process,
                Job.devices,
                Job.project,
                Job.owner,
            )
            .join(Job, Job.id == Attempt.job_id)
            .where(Attempt.state == JobState.RUNNING)
        ).all()
        statuses = session.execute(
            select(AgentStatus.node, AgentStatus.problems, AgentStatus.last_pass_at)
        ).all()
        problems: dict[str, list[str] | None] = {row.node: row.problems for row in statuses}
        passed: dict[str, datetime] = {row.node: aware(row.last_pass_at) for row in statuses}
    views = []
    for node in ctx.inventory.known_nodes():
        unknown = _unknown_since(ctx, passed.get(node.id)) if node.up else None
        used: dict[str, int] = {}
        jobs = []
        for job_id, nodes, accelerator_type, device_ids, threads, per_node, project, owner in running:
            if node.id in (nodes or node.id).split(","):
                if visible is None or project in visible or owner == ctx.actor.name:
                    jobs.append(job_id)
                # A Ray attempt leaves the choice of devices to Ray: count what its bundle holds.
                held = len(device_ids or []) or per_node * (threads if accelerator_type == "cpu" else 1)
                used[accelerator_type] = used.get(accelerator_type, 0) + held
        for kind, taken in node.in_use.items():  # on a shared cluster, others' too
            used[kind] = max(used.get(kind, 0), taken)
        views.append(
            NodeView(
                id=node.id,
                up=node.up and unknown is None,
                unknown=unknown,
                capacity=node.capacity(),
                used=used,
                memory_gib=node.memory_gib(),
                labels=dict(node.labels),
                jobs=sorted(jobs),
                problems=problems.get(node.id) or [],
                host_op_us=node.host.op_overhead_us if node.host else None,
            )
        )
    return views


RECORD_STALE_S = 30.0
"""How long after its agent's last pass a recorded node's state counts as unknown (an agent
passes at least every ``agent_max_poll_s`` while it reaches the cluster)."""


def _unknown_since(ctx: ServiceContext, last_pass: datetime | None) -> str | None:
    """Why a node seen through the agent's record is of unknown state now, or None: its agent has
    not passed for a while (the cluster's head is away, or the agent cannot start)."""
    if not ctx.reads_recorded_inventory:
        return None  # this process asks the engine itself: what it says is now
    if last_pass is not None and (datetime.now(UTC) - last_pass).total_seconds() <= RECORD_STALE_S:
        return None
    since = "never" if last_pass is None else f"not since {last_pass:%Y-%m-%d %H:%M:%S} UTC"
    return (
        f"the agent has reached the {ctx.settings.executor} cluster {since}: this is its last record "
        "(is its head up? `shipyard node start --head` starts it; the server's agent.log says why)"
    )


def allocation_by_hour(ctx: ServiceContext, nodes: list[NodeView], hours: int = 24) -> dict[str, Any]:
    """Per node and hour of the last ``hours``: the share of its devices (cores on a CPU-only node)
    that attempts held, from the attempts' start and end (what the heatmap of the nodes page draws)."""
    now = datetime.now(UTC)
    # Whole clock hours, the last one the current (partial) hour: a column labelled 05:00 holds
    # 05:00-06:00, not an hour that began at this minute yesterday.
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
    with ctx.db.read() as session:
        rows = session.execute(
            select(Attempt.node, Attempt.device_ids, Attempt.started_at, Attempt.finished_at, Job.devices)
            .join(Job, Job.id == Attempt.job_id)
            .where((Attempt.finished_at.is_(None)) | (Attempt.finished_at >= start))
        ).all()
    capacity = {
        node.id: max(1, sum(v for k, v in node.capacity.items() if k != "cpu") or node.capacity.get("cpu", 1))
        for node in nodes
    }
    held = {node.id: [0.0] * hours for node in nodes}
    for node_names, device_ids, started, finished, devices in rows:
        begin, end = aware(started), now if finished is None else aware(finished)
        for node in (node_names or "").split(","):
            if node not in held:
                continue
            count = len(device_ids or []) or devices
            first = max(0, int((begin - start).total_seconds() // 3600))
            for hour in range(first, min(hours, int((end - start).total_seconds() // 3600) + 1)):
                low = start + timedelta(hours=hour)
                overlap = (min(end, low + timedelta(hours=1)) - max(begin, low)).total_seconds()
                if overlap > 0:
                    held[node][hour] += count * overlap / 3600
    return {
        "hours": [(start + timedelta(hours=h)).strftime("%H:00") for h in range(hours)],
        "since": start.strftime("%Y-%m-%d %H:00"),
        "rows": {node: [min(1.0, v / capacity[node]) for v in values] for node, values in held.items()},
    }
