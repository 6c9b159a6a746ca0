"""Control-plane load: concurrent clients submit jobs over HTTP, then read each one back.

Starts a real ``shipyard server`` (uvicorn) on SQLite and on PostgreSQL, with authentication,
spec validation, the planner's submit-time estimate and the audit log all on, and a queue without
quota so the jobs stay queued (as Slurm's ``sbatch --hold``: the control plane alone is measured).
Reports submissions/s and p50/p99 latency for 1 and 8 parallel clients, reads/s, and checks that
every submission is stored exactly once and that the audit chain holds.

    .venv/bin/python benchmarks/api_load.py [--jobs 5000] [--clients 1,8] [--workers 2] [--json]

The competitor runs in the same invocation: ``sbatch --hold`` from the same numbers of parallel
clients against a fresh local slurmctld (``benchmarks/local_slurm.py``; needs ``slurm-wlm`` and
root), and every line ends with Shipyard's rate as a multiple of Slurm's. Without Slurm the
figures recorded when the target was set are used (535/s from 8 clients, 289/s from one) and the
output says so: this machine's speed swings severalfold from one day to the next.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, func, select, text

from shipyard import audit
from shipyard.daemon import supervisor
from shipyard.db import Job
from shipyard.services.context import open_context
from shipyard.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import local_slurm  # noqa: E402
from tests.builders import STDLIB, spec_dict  # noqa: E402

PASSWORD = "benchmark passphrase"
HOLD = "clusterQueues: [{name: hold, nominal: {cpu: 0}}]\nlocalQueues: {default: hold}\n"
POSTGRES = os.environ.get("SHIPYARD_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
SLURM_REFERENCE = {1: (289, 4.6), 8: (535, 27.0)}
"""clients -> (submissions/s, p99 ms) of ``sbatch --hold`` recorded when the target was set; used
only where Slurm cannot run (the same machine swings severalfold from day to day)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(home: Path, db_url: str, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    home.mkdir(parents=True, exist_ok=True)
    (home / "queues.yaml").write_text(HOLD)
    (home / "server.yaml").write_text(f'data_roots: {{"*": ["{STDLIB}"]}}\n')  # where the spec's corpus is
    port = free_port()
    env = {**os.environ, "SHIPYARD_HOME": str(home), "SHIPYARD_DB_URL": db_url,
           "SHIPYARD_INIT_ADMIN": f"admin:{PASSWORD}", "SHIPYARD_AUDIT_KEY": "benchmark-key"}  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "shipyard.cli.main", "server", "--port", str(port), "--workers", str(workers)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit("the server did not start")


def stop_agent(home: Path) -> None:
    """The server started the home's agent; it must not outlive the run (nor train the jobs)."""
    lock = home / supervisor.AGENT_LOCK
    if lock.exists() and lock.read_text().strip():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(lock.read_text().split()[0]), signal.SIGTERM)


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def platform_processes(server: subprocess.Popen[bytes], home: Path, db_url: str) -> dict[str, list[int]]:
    """The server (its worker processes, or itself with one worker), the home's agent and, on
    PostgreSQL, the database's processes (all of them: nothing else uses it meanwhile)."""
    children = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True).stdout.split()
    lock, log = home / supervisor.AGENT_LOCK, home / supervisor.AGENT_LOG
    # The warm-up started the agent. It writes its pid, then finds the devices (importing torch
    # takes a core for seconds here) and says it is serving: a running platform's agent is long
    # past that, so the measurement waits for it.
    deadline = time.monotonic() + 60
    while not (log.exists() and "serving" in log.read_text()):
        if time.monotonic() > deadline:
            raise SystemExit(f"the agent did not start serving within a minute: see {log}")
        time.sleep(0.1)
    agent_pid = [int(p) for p in lock.read_text().split()[:1]] if lock.exists() else []
    # With one worker, the server process itself starts the agent: count it as the agent only.
    workers = [int(p) for p in children if int(p) not in agent_pid]
    found = {"server": [server.pid, *workers], "agent": agent_pid}
    if db_url.startswith("postgresql"):
        postgres = subprocess.run(["pgrep", "-x", "postgres"], capture_output=True, text=True).stdout.split()
        found["database"] = [int(p) for p in postgres]
    return found


def cpu_use(processes: dict[str, list[int]]) -> dict[str, float]:
    used = {}
    for role, pids in processes.items():
        total = 0.0
        for pid in pids:
            with contextlib.suppress(OSError):
                total += cpu_seconds(pid)
        used[role] = total
    return used


def shares(jobs: int, clients: int) -> list[int]:
    """``jobs`` split as evenly as can be among ``clients``."""
    return [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]


def in_parallel(target: Callable[[Any], None], arguments: list[Any]) -> float:
    """One thread per argument; the seconds until all are done."""
    started = time.perf_counter()
    threads = [threading.Thread(target=target, args=(a,)) for a in arguments]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


class KeptAlive:
    """One kept-alive HTTP/1.1 connection (the standard library's): the load generator shares the
    two cores with the server, so it should spend as little of them as it can."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.connection = http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=60)
        self.headers = {**headers, "Content-Type": "application/json"}

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        self.connection.request(method, path, body=body, headers=self.headers)
        response = self.connection.getresponse()
        return response.status, response.read()

    def __enter__(self) -> KeptAlive:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.connection.close()


def run(url: str, jobs: int, clients: int, processes: Callable[[], dict[str, list[int]]]) -> dict[str, Any]:
    token = httpx.post(f"{url}/api/v1/auth/token", json={"username": "admin", "password": PASSWORD}).json()[
        "token"
    ]
    headers = {"Authorization": f"Bearer {token}"}
    body = {"spec": spec_dict(name="load")}
    submit_ms: list[float] = []
    read_ms: list[float] = []
    ids: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()

    payload = json.dumps(body).encode()

    def client(count: int) -> None:
        with KeptAlive(url, headers) as connection:
            mine = []
            for _ in range(count):
                start = time.perf_counter()
                status, answer = connection.request("POST", "/api/v1/jobs", payload)
                elapsed = (time.perf_counter() - start) * 1000
                with lock:
                    if status == 201:
                        submit_ms.append(elapsed)
                        mine.append(json.loads(answer)["id"])
                    else:
                        failures.append(f"{status} {answer[:200]!r}")
            with lock:
                ids.extend(mine)

    def reader(chunk: list[str]) -> None:
        with KeptAlive(url, headers) as connection:
            for job_id in chunk:
                start = time.perf_counter()
                status, _ = connection.request("GET", f"/api/v1/jobs/{job_id}")
                elapsed = (time.perf_counter() - start) * 1000
                with lock:
                    read_ms.append(elapsed)
                    if status != 200:
                        failures.append(f"read {status}")

    with httpx.Client(base_url=url, headers=headers, timeout=60) as warm_up:  # warm-up, not counted
        for _ in range(5):
            warm_up.post("/api/v1/jobs", json=body).raise_for_status()
    # Listed again after: the database starts a process per new connection meanwhile.
    before, client_before = cpu_use(processes()), time.process_time()
    submit_s = in_parallel(client, shares(jobs, clients))
    after, client_after = cpu_use(processes()), time.process_time()
    # Where two cores go: CPU milliseconds each part spends per submission.
    cpu_ms = {role: (after[role] - before[role]) / jobs * 1000 for role in before}
    cpu_ms["client"] = (client_after - client_before) / jobs * 1000
    read_s = in_parallel(reader, [ids[i::clients] for i in range(clients)])
    return {
        "clients": clients,
        "jobs": jobs,
        "submitted": len(submit_ms),
        "unique_ids": len(set(ids)),
        "failures": failures[:5],
        "submissions_per_s": len(submit_ms) / submit_s,
        "submit_p50_ms": statistics.median(submit_ms),
        "submit_p99_ms": statistics.quantiles(submit_ms, n=100)[98],
        "reads_per_s": len(read_ms) / read_s,
        "read_p99_ms": statistics.quantiles(read_ms, n=100)[98],
        "cpu_ms_per_submission": cpu_ms,
    }


def run_slurm(jobs: int, clients: int) -> dict[str, Any]:
    """``sbatch --hold`` from ``clients`` parallel loops against a fresh local slurmctld (held
    jobs are stored and queued, never run): the competitor, timed like ``run``."""
    with local_slurm.controller() as env:
        latencies: list[float] = []
        lock = threading.Lock()
        command = ["sbatch", "--hold", "--parsable", "--output", "/dev/null", "--wrap", "true"]

        def client(count: int) -> None:
            for _ in range(count):
                start = time.perf_counter()
                subprocess.run(command, env=env, check=True, capture_output=True)
                with lock:
                    latencies.append((time.perf_counter() - start) * 1000)

        seconds = in_parallel(client, shares(jobs, clients))
    return {
        "slurm_per_s": len(latencies) / seconds,
        "slurm_p50_ms": statistics.median(latencies),
        "slurm_p99_ms": statistics.quantiles(latencies, n=100)[98],
    }


def stored(db_url: str, home: Path) -> tuple[int, bool]:
    settings = Settings(home=home, db_url=db_url, audit_key="benchmark-key")
    ctx = open_context(settings)
    try:
        with ctx.db.transaction() as session:
            count = session.scalar(select(func.count()).select_from(Job)) or 0
        return count, audit.verify_log(ctx.db, ctx.audit_key).ok
    finally:
        ctx.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    slurm: dict[int, dict[str, Any]] = {}
    why_not = local_slurm.missing()
    for clients in (int(c) for c in args.clients.split(",")):
        if why_not is None:
            slurm[clients] = run_slurm(args.jobs, clients)
            measured = slurm[clients]
            print(
                f"   slurm {clients} client(s): {measured['slurm_per_s']:.0f} submissions/s "
                f"(p50 {measured['slurm_p50_ms']:.1f} ms, p99 {measured['slurm_p99_ms']:.1f} ms)",
                file=sys.stderr,
            )
        else:
            rate, p99 = SLURM_REFERENCE.get(clients, (None, None))
            slurm[clients] = {"slurm_per_s": rate, "slurm_p99_ms": p99, "slurm_recorded": True}
            print(f"Slurm not measured ({why_not}): comparing with recorded figures", file=sys.stderr)
    for database in args.databases.split(","):
        for clients in (int(c) for c in args.clients.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                home = Path(tmp) / "home"
                name = f"shipyard_load_{secrets.token_hex(4)}"
                admin = create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
                if database == "postgres":
                    with admin.connect() as connection:
                        connection.execute(text(f'CREATE DATABASE "{name}"'))
                    db_url = POSTGRES.rsplit("/", 1)[0] + f"/{name}"
                else:
                    db_url = f"sqlite:///{home / 'shipyard.db'}"
                process, url = start_server(home, db_url, args.workers)
                try:
                    result = run(
                        url, args.jobs, clients, functools.partial(platform_processes, process, home, db_url)
                    )
                finally:
                    process.terminate()
                    process.wait(timeout=30)
                    stop_agent(home)
                result["stored"], result["audit_intact"] = stored(db_url, home)
                if database == "postgres":
                    with admin.connect() as connection:
                        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                admin.dispose()
                result.update(database=database, **slurm[clients])
                reference_rate = result["slurm_per_s"]
                results.append(result)
                print(
                    f"{database:>8} {clients} client(s): {result['submissions_per_s']:.0f} submissions/s "
                    f"(p50 {result['submit_p50_ms']:.1f} ms, p99 {result['submit_p99_ms']:.1f} ms), "
                    f"{result['reads_per_s']:.0f} reads/s; stored {result['stored']} "
                    f"of {args.jobs} + 5 warm-up, "
                    f"audit intact {result['audit_intact']}; CPU ms per submission: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in result["cpu_ms_per_submission"].items())
                    + (
                        f"; vs sbatch {result['submissions_per_s'] / reference_rate:.2f}x"
                        if reference_rate
                        else ""
                    ),
                    file=sys.stderr,
                )
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
