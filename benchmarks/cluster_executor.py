"""The Ray executor beside the local executor and bare torchrun, side by side in one run.

1. Submit to first training step, the same 2-process job: through the Ray executor (a Ray
   cluster of one raylet on loopback), through the local executor (torchrun under the agent),
   and bare ``torchrun --standalone`` on a launch plan written by hand (no platform at all).
2. Steady-state tokens/s of a 2-node gloo job: Shipyard on two raylets vs the same runtime under
   two plain ``torchrun --nnodes 2`` with c10d rendezvous on loopback.
3. One scheduling pass over a 64-node inventory read from Ray (64 raylets).

    .venv/bin/python benchmarks/cluster_executor.py [--rounds 2] [--nodes 64] [--json]

The nodes advertise ``h100-sxm`` and run on the CPU (``tests/support/ray_cluster.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from shipyard.schemas.jobspec import validate_job_spec  # noqa: E402
from shipyard.schemas.launch import LaunchPlan  # noqa: E402
from shipyard.storage import config as storage_config  # noqa: E402
from tests.builders import spec_dict  # noqa: E402
from tests.conftest import agents_of  # noqa: E402
from tests.support.ray_cluster import RayCluster, emulated_devices  # noqa: E402
from tests.support.seaweedfs import SeaweedCluster  # noqa: E402

SHIPYARD = [sys.executable, "-m", "shipyard.cli.main"]
TRAINING = {"eval_interval": 0, "steps": 12}


def first_step_s(metrics: Path, started: float, timeout: float = 300) -> float:
    """Seconds from ``started`` until the run's first training step is in its metrics."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if any(json.loads(line).get("kind") == "train" for line in lines if line.endswith("}")):
            return time.perf_counter() - started
        time.sleep(0.02)
    raise TimeoutError(f"no training step in {metrics} after {timeout}s")


def steady_tokens_per_s(metrics: Path) -> float:
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    rates = [s["tokens_per_s"] for s in steps if s.get("kind") == "train" and s.get("tokens_per_s")]
    return statistics.median(rates[len(rates) // 3 :])  # past warm-up


class Home:
    """A Shipyard home whose agent uses ``env``'s executor."""

    def __init__(self, path: Path, env: dict[str, str], store: SeaweedCluster | None) -> None:
        self.path = path
        # The agent polls as it does by default (a faster poll would take CPU from the ranks).
        self.env = {**os.environ, **env, "SHIPYARD_HOME": str(path), "SHIPYARD_AGENT_IDLE_EXIT_S": "30"}
        self.env.pop("SHIPYARD_DB_URL", None)
        if store is not None:
            s3 = store.s3.model_copy(update={"prefix": f"{path.name}/"})
            storage_config.save(path, storage_config.StorageConfig(backend="s3", s3=s3))

    def submit(self, spec: dict[str, Any], name: str) -> tuple[str, float]:
        path = self.path.parent / f"{name}.json"
        path.write_text(json.dumps({**spec, "name": name}))
        started = time.perf_counter()
        done = subprocess.run([*SHIPYARD, "jobs", "submit", str(path), "--json"], env=self.env,
                              capture_output=True, text=True, check=True)  # fmt: skip
        return json.loads(done.stdout)["id"], started

    def wait(self, job_id: str, timeout: float = 600) -> None:
        """Until the agent has the result (watching a file: polling the CLI would take CPU from
        the ranks of a 2-core machine, which the torchrun baseline does not pay)."""
        result = self.path / "runs" / job_id / "result.json"
        deadline = time.monotonic() + timeout
        while not result.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} did not end within {timeout}s")
            time.sleep(0.5)
        if json.loads(result.read_text())["status"] != "completed":
            raise RuntimeError(f"job {job_id} did not complete: see shipyard jobs logs {job_id}")
        time.sleep(3)  # the agent records the end and releases the nodes

    def metrics(self, job_id: str) -> Path:
        return self.path / "runs" / job_id / "metrics.jsonl"


def bare_torchrun(base: Path, spec: dict[str, Any], nodes: int = 1) -> tuple[float, float]:
    """Seconds to the first step and steady tokens/s of the runtime under plain torchrun."""
    run_dir = base / f"torchrun-{nodes}"
    run_dir.mkdir(parents=True, exist_ok=True)
    LaunchPlan(
        job_id=run_dir.name, attempt=1, spec=validate_job_spec(spec), run_dir=str(run_dir),
        cache_dir=str(base / "cache"), accelerator_type="cpu", torch_device="cpu", world_size=2,
        threads_per_process=1, peak_tflops_bf16=0.1, peak_tflops_fp32=0.05,
    ).write(run_dir)  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nodes == 1:
        where = [["--standalone", "--nproc-per-node=2"]]
    else:
        port = free_port()
        where = [
            ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
             "--rdzv-id=bench"]
            for _ in range(nodes)
        ]  # fmt: skip
    started = time.perf_counter()
    processes = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args, "-m", "shipyard.training",
                          str(run_dir)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for args in where
    ]  # fmt: skip
    first = first_step_s(run_dir / "metrics.jsonl", started)
    for process in processes:
        process.wait(timeout=600)
    return first, steady_tokens_per_s(run_dir / "metrics.jsonl")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def best(rounds: int, measure: Callable[[int], float]) -> float:
    return min(measure(i) for i in range(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=64, help="raylets of the scheduling-pass inventory")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="shipyard-cluster-bench-"))
    results: dict[str, Any] = {}
    store = SeaweedCluster(base / "seaweedfs").start()
    ray_cluster = RayCluster(base / "scratch").start()
    try:
        for name in ("a", "b"):
            ray_cluster.add(name, emulated_devices("h100-sxm", 2), rack=name)
        one_node = spec_dict(
            training=TRAINING, resources={"accelerator": "cpu", "devices": 2, "cpus_per_device": 1}
        )
        warm = one_node | {"training": {**one_node["training"], "steps": 1}}
        bare_torchrun(base / "warm", warm)  # tokenizer and shards cached, files in the page cache
        local = Home(base / "local", {}, None)
        on_ray = Home(base / "ray", ray_cluster.env(), store)
        ray_spec = one_node | {"resources": {"accelerator": "h100-sxm", "devices": 2, "cpus_per_device": 1}}

        def through(home: Home, spec: dict[str, Any]) -> Callable[[int], float]:
            def measure(i: int) -> float:
                job_id, started = home.submit(spec, f"first-{i}")
                seconds = first_step_s(home.metrics(job_id), started)
                home.wait(job_id)
                return seconds

            return measure

        results["first_step_s"] = {
            "bare_torchrun": best(args.rounds, lambda i: bare_torchrun(base / f"bare-{i}", one_node)[0]),
            "local_executor": best(args.rounds, through(local, one_node)),
            "ray_executor": best(args.rounds, through(on_ray, ray_spec)),
        }
        first = results["first_step_s"]
        first["ray_vs_local"] = first["ray_executor"] / first["local_executor"]

        spread = {"accelerator": "h100-sxm", "devices": 1, "nodes": 2, "cpus_per_device": 1}
        # A checkpoint every 20 steps (every few seconds here; minutes on real jobs), written by
        # both, and committed to the store by Shipyard as it is written.
        two_nodes = spec_dict(
            training={**TRAINING, "steps": 40}, resources=spread, checkpoint={"interval": 20}
        )
        cpu_two = two_nodes | {"resources": {"accelerator": "cpu", "devices": 2, "cpus_per_device": 1}}

        def shipyard_rate(i: int) -> float:
            job_id, _ = on_ray.submit(two_nodes, f"steady-{i}")
            on_ray.wait(job_id)
            return steady_tokens_per_s(on_ray.metrics(job_id))

        rounds = range(args.rounds)
        rates = {
            "torchrun_nnodes_2": max(
                bare_torchrun(base / f"steady-{i}", cpu_two, nodes=2)[1] for i in rounds
            ),
            "shipyard_ray_2_nodes": max(shipyard_rate(i) for i in rounds),
        }
        rates["ratio"] = rates["shipyard_ray_2_nodes"] / rates["torchrun_nnodes_2"]
        results["steady_tokens_per_s"] = rates
        results["scheduling_pass_64_nodes"] = scheduling_pass(ray_cluster, on_ray, args.nodes)
    finally:
        for home in (base / "local", base / "ray"):  # a cluster's agent does not leave when idle
            for pid in agents_of(home):
                os.kill(pid, signal.SIGTERM)
        ray_cluster.stop()
        store.stop()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    first, rates, scheduled = (
        results["first_step_s"],
        results["steady_tokens_per_s"],
        results["scheduling_pass_64_nodes"],
    )
    print(
        f"submit -> first step: bare torchrun {first['bare_torchrun']:.1f}s, local executor "
        f"{first['local_executor']:.1f}s, Ray executor {first['ray_executor']:.1f}s "
        f"(Ray / local = {first['ray_vs_local']:.2f})"
    )
    print(
        f"2-node gloo, steady tokens/s: torchrun --nnodes 2 {rates['torchrun_nnodes_2']:,.0f}, "
        f"Shipyard on Ray {rates['shipyard_ray_2_nodes']:,.0f} (ratio {rates['ratio']:.2f})"
    )
    print(
        f"one scheduling pass over {scheduled['nodes']} Ray nodes: inventory "
        f"{scheduled['inventory_s'] * 1e3:.0f} ms, cycle {scheduled['cycle_s'] * 1e3:.0f} ms"
    )


def scheduling_pass(ray_cluster: RayCluster, home: Home, count: int) -> dict[str, float]:
    """Grow the cluster to ``count`` nodes, then time reading the inventory from Ray and one
    scheduling cycle over it (with the queue empty: the cycle's own cost over many jobs is
    ``scheduler_scale.py``'s), as the agent's pass does."""
    for i in range(len(ray_cluster.ads), count):
        ray_cluster.add(f"x{i:03d}", emulated_devices("h100-sxm", 8), rack=f"r{i % 8}", wait=False)
    ray_cluster.cluster.wait_for_nodes()
    code = """
import json, sys, time
from datetime import UTC, datetime
from shipyard.services.context import open_context
from shipyard.agent.scheduler import plan_round
ctx = open_context()
ctx.executor.nodes()  # connect
started = time.perf_counter()
nodes = ctx.executor.nodes()
inventory = time.perf_counter() - started
with ctx.db.transaction() as session:
    started = time.perf_counter()
    plan_round(ctx, session, datetime.now(UTC))
    cycle = time.perf_counter() - started
print(json.dumps({"nodes": len(nodes), "inventory_s": inventory, "cycle_s": cycle}))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], env=home.env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
