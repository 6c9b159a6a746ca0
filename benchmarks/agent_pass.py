"""How long one agent pass takes on a large cluster, and where its time goes.

A PostgreSQL of the run's own holds 10,000 queued and 2,000 running jobs (gangs of 1-8 devices,
each allowed on several accelerator types), and an executor at the interface's seam advertises
1,000 nodes of 8 devices of six types: the engine answers at once (every attempt runs), so what is
timed is the agent's own work around it. Each pass is the agent's real ``tick``: read a snapshot,
watch every running attempt, run the scheduling cycle, launch what it leases, record the reasons.
Reported per pass: its time, and the shares spent in the database (time inside SQL statements),
the scheduling cycle and the executor, with the engine calls per running attempt. The first pass
also reads each job's unchanging fields once (the agent keeps them); the steady passes follow.

    .venv/bin/python benchmarks/agent_pass.py [--nodes 1000] [--queued 10000] [--running 2000]
                                              [--passes 4] [--json] [--profile]
"""

# ruff: noqa: ARG002 - the seam answers at once, without looking at what it is asked

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import functools
import json
import platform
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlalchemy import Table, event, insert, select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.own_postgres import Postgres  # noqa: E402
from shipyard import agent  # noqa: E402
from shipyard.db import Attempt, Job  # noqa: E402
from shipyard.executors.base import (  # noqa: E402
    AttemptHandle,
    AttemptStatus,
    Busy,
    NodeInventory,
    Placement,
    Request,
    Running,
    StoreAccess,
    Synced,
)
from shipyard.scheduling import cycle as scheduling_cycle  # noqa: E402
from shipyard.scheduling.status import Status, unplaceable  # noqa: E402
from shipyard.schemas.jobspec import validate_job_spec  # noqa: E402
from shipyard.services.context import ServiceContext, open_context  # noqa: E402
from shipyard.services.jobs import jobs  # noqa: E402
from shipyard.settings import Settings  # noqa: E402
from tests.builders import spec_dict  # noqa: E402
from tests.support.ray_cluster import emulated_devices  # noqa: E402

TYPES = ("h100-sxm", "a100-80gb", "h200", "mi300x", "gaudi3", "l40s")
PER_NODE = 8
GANGS = (1, 1, 1, 1, 2, 2, 4, 8)
RUNNING_GANG = 4
HANDLE = "seam:"

F = TypeVar("F", bound=Callable[..., Any])


class AdvertisedNodes:
    """An executor at the interface's seam: its nodes are advertised, its engine accepts every
    launch at once and reports every attempt running. It counts the agent's calls and the time
    spent in them."""

    shares_run_folders = False

    def __init__(self, nodes: list[NodeInventory]) -> None:
        self.inventory = nodes
        self.by_id = {node.id: node for node in nodes}
        self.calls: Counter[str] = Counter()
        self.seconds = 0.0

    @staticmethod
    def _counted(method: F) -> F:
        @functools.wraps(method)
        def counted(self: AdvertisedNodes, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                self.calls[method.__name__] += 1
                self.seconds += time.perf_counter() - started

        return cast(F, counted)

    @_counted
    def known_nodes(self) -> list[NodeInventory]:
        return self.inventory

    @_counted
    def nodes(self) -> list[NodeInventory]:
        return self.inventory

    @_counted
    def check_feasible(self, request: Request) -> Status | None:
        return None

    @_counted
    def place(self, request: Request, on: Collection[str] | None = None) -> Placement | Status:
        """The first of the nodes ``on`` names with the type: its devices are picked by ``pick``."""
        for name in sorted(on or self.by_id):
            device = next(
                (d for d in self.by_id[name].accelerators if d.accelerator_type in request.accelerator_types),
                None,
            )
            if device is not None:
                return Placement(
                    node=name, accelerator_type=device.accelerator_type, torch_device="cuda",
                    device_ids=(), core_ids=(), threads_per_process=1,
                    world_size=request.devices * request.nodes, peak_tflops_bf16=device.peak_bf16_tflops,
                    peak_tflops_fp32=device.peak_fp32_tflops,
                )  # fmt: skip
        return unplaceable("no node of the type", transient=False)

    @_counted
    def pick(self, placement: Placement, request: Request, held: Mapping[str, Busy]) -> Placement | Status:
        """The devices ``held`` leaves free on the placement's node, as this machine's executor
        picks them."""
        name, kind = placement.node, placement.accelerator_type
        taken = held[name].devices.get(kind, set()) if name in held else set()
        free = [d.index for d in self.by_id[name].accelerators if d.index not in taken]
        if len(free) >= request.devices:
            return dataclasses.replace(placement, device_ids=tuple(free[: request.devices]))
        return unplaceable("its devices are held by attempts that still run", transient=True)

    @_counted
    def expected_handle(self, placement: Placement, run_dir: Path) -> AttemptHandle:
        return AttemptHandle(nodes=placement.nodes, handle=f"{HANDLE}{run_dir.name}")

    @_counted
    def launch(
        self, placement: Placement, run_dir: Path, log_path: Path, store: StoreAccess | None = None
    ) -> AttemptHandle:
        return AttemptHandle(nodes=placement.nodes, handle=f"{HANDLE}{run_dir.name}")

    def runs(self, handle: AttemptHandle) -> bool:
        self.calls["runs"] += 1
        return handle.handle.startswith(HANDLE)

    @_counted
    def status(self, handle: AttemptHandle) -> AttemptStatus:
        return Running()

    @_counted
    def dump_stacks(self, handle: AttemptHandle) -> str | None:
        return None

    @_counted
    def sync(self, handle: AttemptHandle, run_dir: Path) -> Synced:
        return Synced()

    @_counted
    def release(self, handle: AttemptHandle) -> None:
        return None

    @_counted
    def stop(self, handle: AttemptHandle, *, force: bool = False) -> None:
        return None

    @_counted
    def read_log(self, node: str | None, log_path: Path, offset: int, limit: int | None = None) -> bytes:
        return b""


def cluster(nodes: int) -> list[NodeInventory]:
    return [
        NodeInventory(
            id=f"node-{i:04d}",
            devices=emulated_devices(TYPES[i % len(TYPES)], PER_NODE, cores=64),
            labels={"rack": f"r{i // 32}"},
        )
        for i in range(nodes)
    ]


def seed(ctx: ServiceContext, nodes: list[NodeInventory], queued: int, running: int) -> None:
    """One job of each gang size through the real submit (its spec, estimate and reason as a
    user's), copied row by row; ``running`` of them placed on the nodes with a running attempt."""
    rng = random.Random(0)
    templates = {}
    if running * RUNNING_GANG > len(nodes) * PER_NODE:
        raise SystemExit(f"{running} jobs of {RUNNING_GANG} devices do not fit {len(nodes)} nodes")
    for gang in sorted(set(GANGS)):
        spec = spec_dict(
            f"gang{gang}",
            resources={"accelerator": list(TYPES), "devices": gang},
            training={"global_batch_tokens": 256 * 8 * 8, "steps": 10_000},
        )
        view = jobs.submit(ctx, validate_job_spec(spec))
        with ctx.db.read() as session:
            row = session.get_one(Job, view.id)
            templates[gang] = {c.key: getattr(row, c.key) for c in Job.__table__.columns}
    job_rows, attempt_rows = [], []
    now = datetime.now(UTC)
    kind = {node.id: node.accelerators[0].accelerator_type for node in nodes}
    for i in range(queued + running):
        # The running jobs fill the cluster (two gangs of four on each node), as on a busy day:
        # the scheduler weighs the queue against them and launches only where it preempts.
        gang = RUNNING_GANG if i < running else rng.choice(GANGS)
        job_id = f"job-{i:05d}"
        row = {
            **templates[gang],
            "id": job_id,
            "name": f"job-{i:05d}",
            "run_dir": str(ctx.settings.runs_dir / job_id),
            "submitted_at": now - timedelta(seconds=queued + running - i),
            "pending_reason": None,
            "pending_code": None,
        }
        if i < running:
            node, first = nodes[i * RUNNING_GANG // PER_NODE].id, i * RUNNING_GANG % PER_NODE
            row.update(state="running", started_at=now - timedelta(hours=1))
            attempt_rows.append(
                {
                    "job_id": job_id, "number": 1, "state": "running", "accelerator_type": kind[node],
                    "device_ids": list(range(first, first + gang)), "threads_per_process": 1,
                    "node": node, "handle": f"{HANDLE}{job_id}", "agent_id": "bench",
                    "log_path": str(ctx.settings.runs_dir / job_id / "logs" / "attempt-1.log"),
                    "metrics_offset": 0, "started_at": now - timedelta(hours=1),
                }
            )  # fmt: skip
        job_rows.append(row)
    with ctx.db.begin() as connection:
        for start in range(0, len(job_rows), 2000):
            connection.execute(insert(cast(Table, Job.__table__)), job_rows[start : start + 2000])
        connection.execute(insert(cast(Table, Attempt.__table__)), attempt_rows)
        for template in templates.values():  # the submitted ones leave: only the copies stay
            connection.execute(cast(Table, Job.__table__).delete().where(Job.id == template["id"]))


class Timed:
    """Seconds inside SQL statements and inside the scheduling cycle, summed."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.database = 0.0
        self.statements = 0
        self.cycle = 0.0
        engine = ctx.db.engine

        @event.listens_for(engine, "before_cursor_execute")
        def before(*args: Any) -> None:  # (connection, cursor, statement, parameters, context, many)
            args[4]._bench_started = time.perf_counter()

        @event.listens_for(engine, "after_cursor_execute")
        def after(*args: Any) -> None:
            self.database += time.perf_counter() - args[4]._bench_started
            self.statements += 1

        run = scheduling_cycle.Cycle.run

        def timed_run(cycle: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return run(cycle, *args, **kwargs)
            finally:
                self.cycle += time.perf_counter() - started

        scheduling_cycle.Cycle.run = timed_run  # type: ignore[method-assign]


def one_pass(ctx: ServiceContext, executor: AdvertisedNodes, timed: Timed) -> dict[str, Any]:
    before = (timed.database, timed.statements, timed.cycle, executor.seconds, executor.calls.copy())
    started = time.perf_counter()
    agent.tick(ctx, "bench")
    pass_s = time.perf_counter() - started
    with ctx.db.read() as session:
        running = len(session.scalars(select(Attempt.id).where(Attempt.state == "running")).all())
    calls = executor.calls - before[4]
    engine = sum(n for name, n in calls.items() if name not in ("known_nodes", "nodes", "runs", "pick"))
    return {
        "pass_s": round(pass_s, 3),
        "database_s": round(timed.database - before[0], 3),
        "statements": timed.statements - before[1],
        "cycle_s": round(timed.cycle - before[2], 3),
        "executor_s": round(executor.seconds - before[3], 4),
        "other_s": round(pass_s - (timed.database - before[0]) - (timed.cycle - before[2]), 3),
        "running_after": running,
        "engine_calls": dict(sorted(calls.items())),
        "engine_calls_per_attempt": round(engine / max(1, running), 2),
        "inventory_reads": calls["known_nodes"] + calls["nodes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--running", type=int, default=2_000)
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", action="store_true", help="where the steady passes spend time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agent-pass-") as scratch:
        database = Postgres(Path(scratch))
        try:
            settings = Settings(home=Path(scratch) / "home", db_url=database.url)
            ctx = open_context(settings)
            executor = AdvertisedNodes(cluster(args.nodes))
            ctx.__dict__["executor"] = executor  # the seam: the engine is the benchmark's
            seeded = time.perf_counter()
            seed(ctx, executor.inventory, args.queued, args.running)
            seeded_s = time.perf_counter() - seeded
            timed = Timed(ctx)
            passes = [one_pass(ctx, executor, timed)]
            profile = cProfile.Profile() if args.profile else None
            with profile or contextlib.nullcontext():
                passes += [one_pass(ctx, executor, timed) for _ in range(args.passes - 1)]
            ctx.close()
        finally:
            database.stop()
    steady = passes[1:] or passes
    report = {
        "nodes": args.nodes,
        "devices": args.nodes * PER_NODE,
        "queued": args.queued,
        "running": args.running,
        "seed_s": round(seeded_s, 1),
        "first_pass": passes[0],
        "steady_passes": steady,
        "steady_pass_s_median": statistics.median(p["pass_s"] for p in steady),
        "target_pass_s": 1.0,
        "machine": f"{platform.machine()}, {platform.python_version()}",
    }
    if profile is not None:
        stats = pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime")
        stats.print_stats(25)
        stats.sort_stats("cumtime").print_stats("shipyard", 30)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{args.nodes} nodes ({args.nodes * PER_NODE} devices), {args.queued} queued and "
        f"{args.running} running jobs, PostgreSQL"
    )
    print(f"{'pass':>6} {'total s':>8} {'db s':>7} {'stmts':>6} {'cycle s':>8} {'exec s':>7} "
          f"{'other s':>8} {'calls/attempt':>13} {'inventory reads':>15}")  # fmt: skip
    for number, p in enumerate(passes, start=1):
        print(
            f"{number:>6} {p['pass_s']:>8.3f} {p['database_s']:>7.3f} {p['statements']:>6} "
            f"{p['cycle_s']:>8.3f} {p['executor_s']:>7.4f} {p['other_s']:>8.3f} "
            f"{p['engine_calls_per_attempt']:>13} {p['inventory_reads']:>15}"
        )
    print(f"steady pass: {report['steady_pass_s_median']:.3f} s (target <= 1 s)")


if __name__ == "__main__":
    main()
