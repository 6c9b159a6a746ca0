"""Run attempts on a Ray cluster: Ray owns node membership, health, process launch and logs;
Shipyard keeps the decisions.

The inventory is the cluster's live nodes as they advertised themselves (``cluster_nodes``). A
lease on nodes N1..Nk becomes a detached placement group of k bundles, each pinned to its node by
that node's own resource, and one ``RankGroup`` actor per bundle starts the node's ranks with
their rank layout; Ray's scheduler never picks other nodes. Attempts are named
``ray:<job>.<attempt>``, their actors ``<name>#<node rank>``, so an agent that restarts finds them
again. What the ranks write on their nodes reaches the agent's run folder through ``sync``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from shipyard.durable import write_atomically, write_json_atomic
from shipyard.errors import DependencyMissing, ExecutorError, LaunchFailed
from shipyard.executors.base import (
    AttemptHandle,
    AttemptStatus,
    Exited,
    NodeInventory,
    NodeLost,
    Placement,
    Request,
    Running,
    StoreAccess,
    Synced,
    Vanished,
    Waiting,
    feasible_on,
    units_on,
)
from shipyard.executors.cluster_nodes import (
    NAMESPACE,
    NODE_LABEL,
    TYPE_RESOURCE,
    Advertisement,
    kv_key,
    pin_resource,
)
from shipyard.executors.local import read_log_file
from shipyard.executors.ray_attempts import bundle_units, devices_held, placement_on, ray_gpus, stored_whole
from shipyard.executors.ray_ranks import RankGroup
from shipyard.executors.stacks import DUMP_S
from shipyard.scheduling.status import Status, unplaceable
from shipyard.schemas.launch import (
    FAULTS_ENV,
    HEARTBEAT_DIR,
    LAUNCH_FILE,
    METRICS_FILE,
    RESULT_FILE,
)

HANDLE_PREFIX = "ray:"
READY_TIMEOUT_S = 60.0
"""How long a placement group may take to be reserved before the launch is given up."""
RELEASE_WAIT_S = 5.0
"""How long a release waits for Ray to count the attempt's devices free again."""
CALL_TIMEOUT_S = 30.0
INVENTORY_TTL_S = 1.0
"""How long one read of the cluster's nodes serves: a pass reads them once, not per attempt."""
NODE_VERDICT_S = 60.0
"""How long an attempt whose actor died waits for Ray to say whether its node died too."""
_SYNC_STATE = ".ray-sync-{attempt}.json"
"""Per attempt, in the agent's run folder: the node offset of metrics pulled so far, and the
checkpoint last fetched (so an agent that restarts goes on where the last one stopped)."""


def ray_handle(job_id: str, attempt: int) -> str:
    return f"{HANDLE_PREFIX}{job_id}.{attempt}"


class RayExecutor:
    """The ``Executor`` of a Ray cluster (``executor: ray`` in the server's settings)."""

    shares_run_folders = False

    def __init__(self, address: str) -> None:
        self.address = address
        self._actors: dict[str, list[Any]] = {}
        self._gone_since: dict[str, float] = {}
        self._ads: dict[tuple[str, str], Advertisement] = {}
        self._read: tuple[float, list[tuple[Advertisement, dict[str, Any]]]] = (-INVENTORY_TTL_S, [])

    # --- connection and inventory ------------------------------------------------------------

    @functools.cached_property
    def ray(self) -> Any:
        try:
            import ray
        except ImportError as exc:
            raise DependencyMissing(
                "the Ray executor needs Ray", hint="pip install 'shipyard[cluster]'"
            ) from exc
        if not ray.is_initialized():
            _refuse_unanswered(self.address)
            ray.init(
                address=self.address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level=logging.WARNING,
                include_dashboard=False,
            )
        return ray

    def _cluster(self) -> list[tuple[Advertisement, dict[str, Any]]]:
        """Each Shipyard node of the cluster with Ray's record of it (newest record per name:
        a node that came back has a new Ray id)."""
        from ray.experimental import internal_kv

        ray = self.ray
        read_at, cluster = self._read
        if time.monotonic() - read_at < INVENTORY_TTL_S:
            return cluster
        found: dict[str, tuple[Advertisement, dict[str, Any]]] = {}
        for record in sorted(ray.nodes(), key=lambda r: r.get("Alive", False)):
            name = (record.get("Labels") or {}).get(NODE_LABEL)
            if not name:
                continue
            # A node advertises itself once, as it joins: read each Ray node's record once.
            key = (name, record["NodeID"])
            if key not in self._ads and (raw := internal_kv._internal_kv_get(kv_key(name))) is not None:
                self._ads[key] = Advertisement.from_json(raw)
            if key in self._ads:
                found[name] = (self._ads[key], record)
        cluster = [found[name] for name in sorted(found)]
        self._read = (time.monotonic(), cluster)
        return cluster

    def known_nodes(self) -> list[NodeInventory]:
        from ray._private.state import available_resources_per_node

        cluster = self._cluster()  # connects first
        available = available_resources_per_node()  # type: ignore[no-untyped-call]
        nodes = []
        for ad, record in cluster:
            free = available.get(record["NodeID"], {})
            capacity = ad.inventory().capacity()
            in_use = {
                kind: count - int(free.get(f"{TYPE_RESOURCE}{kind}", 0))
                for kind, count in capacity.items()
                if record.get("Alive")
            }
            nodes.append(dataclasses.replace(ad.inventory(up=bool(record.get("Alive"))), in_use=in_use))
        return nodes

    def nodes(self) -> list[NodeInventory]:
        return [node for node in self.known_nodes() if node.up]

    def _live(self) -> dict[str, tuple[Advertisement, dict[str, Any]]]:
        return {ad.node: (ad, record) for ad, record in self._cluster() if record.get("Alive")}

    # --- placement ---------------------------------------------------------------------------

    def check_feasible(self, request: Request) -> Status | None:
        """Could the request ever run here, with every node idle and every node the cluster knows
        up (a job that needs a node that is down waits for it)? If not, say which nodes fall
        short and by how much."""
        known = [ad.inventory() for ad, _ in self._cluster()]
        return feasible_on(known, request, f"the Ray cluster at {self.address} has no Shipyard node")

    def place(self, request: Request, on: Collection[str] | None = None) -> Placement | Status:
        """Exactly the nodes the scheduler chose (``on``), in name order for ranks, where Ray's own
        accounting has the devices free; Ray picks them (a bundle's visibility)."""
        live = self._live()
        from ray._private.state import available_resources_per_node

        available = available_resources_per_node()  # type: ignore[no-untyped-call]
        reasons: list[str] = []
        for accelerator_type in request.accelerator_types:
            candidates = sorted(on) if on is not None else sorted(live)
            fits = []
            for name in candidates:
                if name not in live:
                    reasons.append(f"node {name} is not up")
                    continue
                ad, record = live[name]
                units, have = units_on(ad.inventory(), accelerator_type, request)
                free = available.get(record["NodeID"], {})
                if have < units:
                    reasons.append(f"{name}: {accelerator_type} has {have}, needs {units}")
                elif free.get(f"{TYPE_RESOURCE}{accelerator_type}", 0) < units or not free.get(
                    pin_resource(name), 0
                ):
                    reasons.append(f"{name}: {accelerator_type} busy, needs {units} free")
                else:
                    fits.append(name)
            if len(fits) >= request.nodes and (on is None or len(fits) == len(candidates)):
                return placement_on([live[n][0] for n in fits[: request.nodes]], accelerator_type, request)
        return unplaceable("; ".join(reasons) or "no live nodes", transient=True)

    # --- attempts ------------------------------------------------------------------------------

    def expected_handle(self, placement: Placement, run_dir: Path) -> AttemptHandle:
        """Its placement group and actors are named after the job and attempt."""
        plan = json.loads((run_dir / LAUNCH_FILE).read_text())
        return AttemptHandle(nodes=placement.nodes, handle=ray_handle(plan["job_id"], plan["attempt"]))

    def launch(
        self, placement: Placement, run_dir: Path, log_path: Path, store: StoreAccess | None = None
    ) -> AttemptHandle:
        if store is None:
            raise LaunchFailed(
                "a cluster attempt needs the artifact store's access for its nodes", transient=False
            )
        ray = self.ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        plan = json.loads((run_dir / LAUNCH_FILE).read_text())
        name = self.expected_handle(placement, run_dir).handle
        live = self._live()
        if gone := [n for n in placement.nodes if n not in live]:
            raise LaunchFailed(f"node {', '.join(gone)} left the cluster before the launch", transient=True)
        ads = [live[n][0] for n in placement.nodes]
        per_node = placement.world_size // len(ads)
        units = bundle_units(placement, per_node)
        bundles = [{**units, pin_resource(ad.node): 1.0, **ray_gpus(ad, per_node)} for ad in ads]
        group = placement_group(
            bundles,
            strategy="STRICT_SPREAD" if len(bundles) > 1 else "STRICT_PACK",
            name=name,
            lifetime="detached",
        )
        try:
            ray.get(group.ready(), timeout=READY_TIMEOUT_S)
        except Exception as exc:
            remove_placement_group(group)
            raise LaunchFailed(
                f"Ray did not reserve nodes {', '.join(placement.nodes)} within {READY_TIMEOUT_S:g}s "
                f"({type(exc).__name__}): another consumer of the cluster may hold them",
                transient=True,
            ) from exc
        actor_class = ray.remote(RankGroup)
        actors = [
            actor_class.options(
                name=f"{name}#{rank}",
                lifetime="detached",
                max_restarts=0,
                num_cpus=0,
                resources=units,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=rank
                ),
                **({"num_gpus": per_node} if ray_gpus(ad, per_node) else {}),
            ).remote(ad.node, ad.scratch, run_dir.name, dict(ad.env))
            for rank, ad in enumerate(ads)
        ]
        self._actors[name] = actors
        try:
            master_addr, master_port = ray.get(actors[0].address.remote(), timeout=CALL_TIMEOUT_S)
            cpu_only = placement.torch_device == "cpu"
            ray.get(
                [
                    actor.start.remote(
                        plan,
                        store,
                        {
                            "node_rank": rank,
                            "per_node": per_node,
                            "world_size": placement.world_size,
                            "master_addr": master_addr,
                            "master_port": master_port,
                            "threads": placement.threads_per_process,
                            "cpu_only": cpu_only,
                            # Faults injected on purpose reach a cluster's ranks as a local one's.
                            "faults": os.environ.get(FAULTS_ENV),
                        },
                    )
                    for rank, actor in enumerate(actors)
                ],
                timeout=CALL_TIMEOUT_S,
            )
        except Exception as exc:
            self.release(AttemptHandle(nodes=placement.nodes, handle=name))
            # A node lost meanwhile or a call that timed out may pass; the next try says again.
            raise LaunchFailed(
                f"the ranks did not start on {', '.join(placement.nodes)}: {exc}", transient=True
            ) from exc
        log_path.parent.mkdir(parents=True, exist_ok=True)
        return AttemptHandle(nodes=placement.nodes, handle=name)

    def runs(self, handle: AttemptHandle) -> bool:
        return handle.handle.startswith(HANDLE_PREFIX)

    def _group(self, handle: AttemptHandle) -> list[Any] | None:
        """The attempt's actors, found by name when this process did not start them; None when
        one of them is gone."""
        if handle.handle not in self._actors:
            try:
                self._actors[handle.handle] = [
                    self.ray.get_actor(f"{handle.handle}#{rank}") for rank in range(len(handle.nodes))
                ]
            except ValueError:
                return None
        return self._actors[handle.handle]

    def status(self, handle: AttemptHandle) -> AttemptStatus:
        ray = self.ray
        if lost := self._lost_nodes(handle):
            return NodeLost(lost)
        actors = self._group(handle)
        if actors is None:
            return Vanished()
        try:
            polled = ray.get([a.poll.remote() for a in actors], timeout=CALL_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            return Running()  # a node too busy to answer: asked again at the next look
        except ray.exceptions.RayActorError:
            # A killed raylet takes its workers down before Ray declares the node dead: wait for
            # the verdict a while before calling the attempt merely vanished.
            gone = self._gone_since.setdefault(handle.handle, time.monotonic())
            if lost := self._lost_nodes(handle):
                return NodeLost(lost)
            return Vanished() if time.monotonic() - gone > NODE_VERDICT_S else Running()
        codes = [code for node in polled for code in node["codes"]]
        if any(code is None for code in codes):
            if any(code for code in codes if code is not None):
                self.stop(handle)  # a rank failed: its peers would wait on it in a collective
            return Running()
        if storing := sorted({node["storing"] for node in polled if node["storing"]}):
            return Waiting(f"its nodes are writing checkpoint {storing[-1]} into the artifact store")
        failed = next((code for code in codes if code), 0)
        return Exited.of(failed)

    def _lost_nodes(self, handle: AttemptHandle) -> tuple[str, ...]:
        live = self._live()
        return tuple(node for node in handle.nodes if node not in live)

    def stop(self, handle: AttemptHandle, *, force: bool = False) -> None:
        actors = self._group(handle) or []
        sig = signal.SIGKILL if force else signal.SIGTERM
        for actor in actors:
            actor.signal.remote(int(sig))

    def dump_stacks(self, handle: AttemptHandle) -> str | None:
        actors = self._group(handle) or []
        try:
            dumps = self.ray.get([actor.stacks.remote() for actor in actors], timeout=2 * DUMP_S)
        except Exception:  # a node gone meanwhile: its ranks are found lost at the next look
            return None
        return "\n".join(d for d in dumps if d) or None

    def sync(self, handle: AttemptHandle, run_dir: Path) -> Synced:
        ray = self.ray
        actors = self._group(handle)
        if actors is None:
            return Synced()
        attempt = handle.handle.rpartition(".")[2]
        state_path = run_dir / _SYNC_STATE.format(attempt=attempt)
        state: dict[str, Any] = {"metrics": 0, "checkpoint": None}
        if state_path.exists():
            state = json.loads(state_path.read_text())
        try:  # one round trip: every node's report at once
            reports = ray.get(
                [a.report.remote(state["metrics"] if rank == 0 else None) for rank, a in enumerate(actors)],
                timeout=CALL_TIMEOUT_S,
            )
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return Synced()  # a lost node: the agent's poll says so
        log_path = run_dir / "logs" / f"attempt-{attempt}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            for report in reports:
                log.write(report["log"])
        heartbeats = run_dir / HEARTBEAT_DIR
        heartbeats.mkdir(exist_ok=True)
        for name, beat in (item for report in reports for item in report["heartbeats"].items()):
            write_atomically(heartbeats / name, beat)
        stored = stored_whole(reports, state["checkpoint"])
        if stored is not None:
            state["checkpoint"] = stored.name
        first = reports[0]
        if first["metrics"]:
            with open(run_dir / METRICS_FILE, "ab") as metrics:
                metrics.write(first["metrics"])
            state["metrics"] += len(first["metrics"])
        result = first["result"]
        if result is not None:
            for key in ("checkpoint", "export_dir"):
                if result.get(key):
                    result[key] = str(run_dir / result[key])
            write_json_atomic(run_dir / RESULT_FILE, result)
        write_json_atomic(state_path, state)
        export = first["export"]
        return Synced(stored, tuple(export) if export is not None else None)

    def release(self, handle: AttemptHandle) -> None:
        ray = self.ray
        for actor in self._actors.pop(handle.handle, None) or self._group(handle) or []:
            ray.kill(actor)
        self._actors.pop(handle.handle, None)
        self._remove_group(handle.handle)

    def _remove_group(self, name: str) -> None:
        """Remove the placement group and wait, a few seconds at most, until Ray counts its
        devices free: the agent schedules on Ray's accounting right after, where devices still
        counted busy went to nobody (a gang waiting for them lost them to a smaller job)."""
        from ray._private.state import available_resources_per_node as free_now
        from ray.util.placement_group import get_placement_group as get
        from ray.util.placement_group import placement_group_table as table
        from ray.util.placement_group import remove_placement_group as remove

        try:
            group = get(name)
        except ValueError:  # removed already
            return
        held = devices_held(table(group))
        before = free_now()  # type: ignore[no-untyped-call]
        start = {(n, k): before.get(n, {}).get(k, 0) for n, k in held}
        remove(group)
        deadline = time.monotonic() + RELEASE_WAIT_S
        while held and time.monotonic() < deadline:
            free = free_now()  # type: ignore[no-untyped-call]
            if all(free.get(n, {}).get(k, 0) >= was + held[n, k] for (n, k), was in start.items()):
                return
            time.sleep(0.05)

    def read_log(self, node: str | None, log_path: Path, offset: int, limit: int | None = None) -> bytes:
        del node  # the agent keeps every node's lines in the run folder as it syncs
        return read_log_file(log_path, offset, limit)


def _refuse_unanswered(address: str) -> None:
    """A clear error, at once, for an address where no Ray head listens (``ray.init`` would
    retry for a long time before failing)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=3):
            return
    except (OSError, ValueError) as exc:
        raise ExecutorError(
            f"no Ray cluster answers at {address} ({exc})",
            hint="start its head with `shipyard node start --head` on that machine, "
            "or set SHIPYARD_RAY_ADDRESS to the address it printed (HOST:PORT)",
        ) from exc
