"""Every dashboard page under a real history while a job trains and 20 browsers watch it.

Seeds a home's database directly — 10,000 jobs over 20 projects in every state and on several
accelerator types over 30 days (one attempt each), 80 logged steps per job and one long run of
200,000 more (the step records the fixed charts read), a million points of the series store,
30 days of telemetry of 64 devices (8 nodes of 8 GPUs: the last day every 5 s, older days as the
agent compacts them, one average a minute), 500 model versions, 2,000 stored artifacts and 10,000
audit records — on the benchmark's own PostgreSQL (``--db sqlite`` for the embedded database).
Then starts a real ``shipyard server`` with its agent, submits a real job that trains on this
machine's CPU while the measurement runs, and has 20 clients poll that job's live page and its
newest curve points every 2 s. Meanwhile one signed-in client requests every page over and over.
Reports each page's time as a client on the same machine sees it (server time plus loopback),
median and p95, against the targets: every page p95 < 200 ms, live points p95 < 50 ms, the usage
page over 30 days < 300 ms.

    .venv/bin/python benchmarks/dashboard_pages.py [--jobs 10000] [--long-steps 200000] [--rounds 30]
        [--db postgres|sqlite] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert, select, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.api_load import stop_agent  # noqa: E402
from benchmarks.own_postgres import Postgres  # noqa: E402
from shipyard import audit  # noqa: E402
from shipyard.client import Client  # noqa: E402
from shipyard.db import (  # noqa: E402
    Artifact,
    Attempt,
    DeviceSample,
    Job,
    Metric,
    MetricPoint,
    ModelVersion,
    StoredArtifact,
    StoredBlob,
    StoredEntry,
)
from shipyard.services.context import open_context  # noqa: E402
from shipyard.settings import Settings  # noqa: E402
from tests.builders import STDLIB, spec_dict  # noqa: E402

PASSWORD = "dashboard bench passphrase"
STATES = ["succeeded"] * 6 + ["failed", "cancelled", "queued", "running"]
TYPES = [("cpu", 2)] * 4 + [("a100-80gb", 4), ("h100-sxm", 8), ("h100-sxm", 1)]
POINTS_PER_JOB = 80
SERIES_PER_JOB = 60
TELEMETRY_NODES, GPUS_PER_NODE = 8, 8
TARGET_MS, LIVE_TARGET_MS, USAGE_TARGET_MS = 200.0, 50.0, 300.0
WATCHERS, WATCH_EVERY_S = 20, 2.0
HOUR = timedelta(hours=1)
HOURS_3 = 3 * HOUR
HOLD = "clusterQueues: [{name: hold, nominal: {cpu: 0}}, {name: live, nominal: {cpu: 64}}]\n"
HOLD += "localQueues: {default: hold, live: live}\n"
"""The seeded queued jobs wait in a queue without quota (the agent plans them but starts none);
the job that trains during the measurement has a queue of its own."""


def seed(db_url: str, home: Path, jobs: int, long_steps: int, telemetry_days: int) -> str:
    """Write the history straight into the database; returns the long run's job id."""
    ctx = open_context(Settings(home=home, db_url=db_url))
    rng = random.Random(0)
    spec = spec_dict("bench", training={"steps": POINTS_PER_JOB * 10})
    now = datetime.now(UTC)
    start = now - timedelta(days=30)
    long_id = "long-run-000000"
    try:
        with ctx.db.transaction() as session:
            job_rows, attempt_rows = [], []
            for n in range(jobs):
                state = "running" if n == 0 else rng.choice(STATES)
                job_id = long_id if n == 0 else f"bench-{n:06d}"
                submitted = start + timedelta(seconds=n * 30 * 86400 / jobs)
                started = None if state == "queued" else submitted + timedelta(seconds=rng.uniform(5, 600))
                kind, devices = rng.choice(TYPES)
                job_rows.append(
                    {"id": job_id, "name": "long-run" if n == 0 else f"bench-{n % 97}",
                     "project": f"project-{n % 20}", "queue": "default", "priority": 0, "state": state,
                     "spec": spec, "devices": devices, "accelerator_types": [kind],
                     "run_dir": str(home / "runs" / job_id), "owner": f"user-{n % 37}",
                     "submitted_at": submitted, "started_at": started,
                     "finished_at": None if state in ("queued", "running") else submitted + HOURS_3,
                     "pending_reason": "0/1 nodes: 1 insufficient free cpu" if state == "queued" else None}
                )  # fmt: skip
                if started is not None:
                    attempt_rows.append(
                        {"job_id": job_id, "number": 1, "state": state, "accelerator_type": kind,
                         "device_ids": list(range(devices)), "threads_per_process": 1,
                         "node": f"gpu-{n % TELEMETRY_NODES}", "log_path": str(home / job_id / "a.log"),
                         "started_at": started,
                         "finished_at": None if state == "running" else started + rng.uniform(0.1, 2) * HOUR}
                    )  # fmt: skip
            session.execute(insert(Job), job_rows)
            session.execute(insert(Attempt), attempt_rows)
        with ctx.db.read() as session:
            attempts: dict[str, int] = dict(session.execute(select(Attempt.job_id, Attempt.id)).all())
        _seed_metrics(ctx, rng, attempts, long_id, long_steps)
        _seed_telemetry(ctx, rng, now, telemetry_days)
        _seed_models_storage_audit(ctx, rng, attempts)
        # A database that grew this much by itself would have been analyzed on the way (autovacuum,
        # or SQLite's optimize): plans from statistics, not from an empty table's.
        with ctx.db.engine.connect() as connection:
            connection.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))
    finally:
        ctx.close()
    return long_id


def _batched(ctx: Any, table: Any, rows: Any, size: int = 20_000) -> int:
    """Insert ``rows`` (an iterable) in transactions of ``size``; returns how many."""
    batch: list[dict[str, Any]] = []
    written = 0
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            with ctx.db.transaction() as session:
                session.execute(insert(table), batch)
            written += len(batch)
            batch = []
    if batch:
        with ctx.db.transaction() as session:
            session.execute(insert(table), batch)
        written += len(batch)
    return written


def _seed_metrics(
    ctx: Any, rng: random.Random, attempts: dict[str, int], long_id: str, long_steps: int
) -> None:
    def loss(step: int) -> float:
        return 6.0 * (1 + step) ** -0.08 + rng.uniform(-0.02, 0.02)

    def records() -> Any:
        for job_id, attempt in attempts.items():
            steps = long_steps if job_id == long_id else POINTS_PER_JOB
            for n in range(1, steps + 1):
                step = n * (1 if job_id == long_id else 10)
                value, rate = loss(step), 12_000.0 + rng.uniform(-500, 500)
                record = {"kind": "train", "step": step, "loss": value, "tokens_per_s": rate, "mem_gib": 0.35}
                yield {"job_id": job_id, "attempt_id": attempt, "kind": "train", "step": step, "loss": value,
                       "tokens_per_s": rate, "mfu": 0.06, "values": record}  # fmt: skip

    def points() -> Any:
        at = time.time() - 86400
        for job_id, attempt in attempts.items():
            if job_id == long_id:
                for step in range(1, long_steps + 1):
                    yield {"job_id": job_id, "attempt_id": attempt, "name": "loss", "step": step,
                           "value": loss(step), "at": at + step}  # fmt: skip
                    yield {"job_id": job_id, "attempt_id": attempt, "name": "lr", "step": step,
                           "value": 3e-4 * min(1.0, step / 2000), "at": at + step}  # fmt: skip
            else:
                for n in range(1, SERIES_PER_JOB + 1):
                    yield {"job_id": job_id, "attempt_id": attempt, "name": "loss", "step": n * 10,
                           "value": loss(n * 10), "at": at + n}  # fmt: skip

    _batched(ctx, Metric, records())
    _batched(ctx, MetricPoint, points())


def _seed_telemetry(ctx: Any, rng: random.Random, now: datetime, days: int) -> None:
    """``days`` of 64 GPUs: the last day every 5 s, the days before as one average a minute."""
    end = now.timestamp()

    def samples() -> Any:
        for node in range(TELEMETRY_NODES):
            for device in range(GPUS_PER_NODE):
                moments = [end - days * 86400 + 60 * i for i in range((days - 1) * 1440)]
                moments += [end - 86400 + 5 * i for i in range(86400 // 5)]
                for at in moments:
                    busy = rng.uniform(0.6, 1.0)
                    yield {"node": f"gpu-{node}", "device": str(device), "at": at, "utilization": busy,
                           "memory_gib": 60.0, "power_w": 300 + 400 * busy, "temperature_c": 50 + 30 * busy,
                           "clock_mhz": 1980.0, "io_mib_s": None, "throttle": None}  # fmt: skip

    _batched(ctx, DeviceSample, samples(), size=50_000)


def _seed_models_storage_audit(ctx: Any, rng: random.Random, attempts: dict[str, int]) -> None:
    succeeded = [job_id for job_id in attempts if job_id != "long-run-000000"][:500]
    with ctx.db.transaction() as session:
        artifacts = [
            Artifact(job_id=j, kind="export", path=f"/exports/{j}", step=800, size_bytes=2**30)
            for j in succeeded
        ]
        session.add_all(artifacts)
        session.flush()
        versions: dict[tuple[str, str], int] = {}
        for n, artifact in enumerate(artifacts):
            key = (f"project-{n % 20}", f"model-{n % 50}")
            versions[key] = versions.get(key, 0) + 1
            session.add(
                ModelVersion(name=key[1], version=versions[key], project=key[0], job_id=artifact.job_id,
                             artifact_id=artifact.id, step=800, metrics={"eval_loss": 2 + rng.random()},
                             stage=rng.choice(["none", "staging", "production"]))
            )  # fmt: skip
        for n in range(2000):
            blob = StoredBlob(
                name=f"blobs/{n:04x}/{n:060x}",
                digest=f"{n:064x}",
                size_bytes=2**20 * (1 + n % 500),
                replicas=2,
            )
            session.add(blob)
            stored = StoredArtifact(
                project=f"project-{n % 20}", name=f"data/shard-{n:05d}.jsonl", kind="file",
                size_bytes=blob.size_bytes, replicas=2, encrypted=False, created_by="admin",
            )  # fmt: skip
            stored.entries = [StoredEntry(path=f"shard-{n:05d}.jsonl", blob_name=blob.name)]
            session.add(stored)
    actor = audit.Actor(name="admin", source="bench", is_admin=True)
    for chunk in range(10):
        with ctx.db.transaction() as session:
            entries = [
                audit.Entry(actor, "job.submit", f"job/bench-{chunk * 1000 + n:06d}") for n in range(1000)
            ]
            audit.append_all(session, ctx.audit_key, entries)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def signed_in(url: str) -> Iterator[httpx.Client]:
    """A client signed in as a browser is: the login form, then its session cookie."""
    with httpx.Client(base_url=url, timeout=60) as browser:
        for _ in range(60):  # the server checks a few passwords at a time: the others wait a moment
            form = browser.get("/login").text  # the login form carries its CSRF token
            csrf = form.split('name="csrf" value="', 1)[1].split('"', 1)[0]
            data = {"username": "admin", "password": PASSWORD, "next": "/", "csrf": csrf}
            answer = browser.post("/login", data=data)
            if answer.status_code == 303:
                break
            time.sleep(0.5)
        assert answer.status_code == 303, answer.text
        yield browser


def quantiles(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": round(statistics.median(ordered), 1),
        "p95_ms": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 1),
        "max_ms": round(ordered[-1], 1),
        "requests": len(ordered),
    }


def timed_pages(url: str, pages: list[str], rounds: int) -> dict[str, dict[str, float]]:
    with signed_in(url) as browser:
        results = {}
        for page in pages:
            times = []
            for n in range(rounds + 3):
                started = time.perf_counter()
                answer = browser.get(page)
                elapsed = (time.perf_counter() - started) * 1000
                assert answer.status_code == 200, f"{page}: {answer.status_code} {answer.text[:300]}"
                if n >= 3:  # the first ones warm caches (templates, the catalog)
                    times.append(elapsed)
            results[page] = quantiles(times)
            print(f"{page:70s} {results[page]}", file=sys.stderr, flush=True)
        return results


class Watchers:
    """``WATCHERS`` signed-in clients, each polling the live job's page fragment and its newest
    curve points every ``WATCH_EVERY_S``, as a job page open in a browser does. They run in a
    process of their own, so that their work never delays the client that times the pages."""

    def __init__(self, url: str, job_id: str) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.stop, self.out = spawn.Event(), spawn.Queue()
        self.process = spawn.Process(target=_watch_all, args=(url, job_id, self.stop, self.out), daemon=True)
        self.process.start()

    def results(self) -> dict[str, dict[str, float]]:
        self.stop.set()
        times: dict[str, list[float]] = self.out.get(timeout=120)
        self.process.join(timeout=30)
        return {what: quantiles(values) for what, values in times.items() if values}


def _watch_all(url: str, job_id: str, stop: Any, out: Any) -> None:
    times: dict[str, list[float]] = {"live fragment": [], "live points": []}
    lock = threading.Lock()

    def watch(n: int) -> None:
        time.sleep(n * WATCH_EVERY_S / WATCHERS)  # spread over the interval, as real viewers are
        with signed_in(url) as browser:
            after = {"loss": -1, "train": -1}
            while not stop.is_set():
                began = time.perf_counter()
                for what, path in (
                    ("live fragment", f"/jobs/{job_id}/live"),
                    ("live points", f"/api/v1/series?job={job_id}&name=loss&after_step={after['loss']}"),
                    ("live points", f"/api/v1/jobs/{job_id}/metrics?after_step={after['train']}"),
                ):
                    started = time.perf_counter()
                    answer = browser.get(path)
                    elapsed = (time.perf_counter() - started) * 1000
                    if answer.status_code != 200:
                        continue
                    if "series" in path and answer.json() and answer.json()[0]["last_step"] is not None:
                        after["loss"] = answer.json()[0]["last_step"]
                    elif "metrics" in path and answer.json()["last_step"] is not None:
                        after["train"] = answer.json()["last_step"]
                    with lock:
                        times[what].append(elapsed)
                stop.wait(max(0.0, WATCH_EVERY_S - (time.perf_counter() - began)))

    threads = [threading.Thread(target=watch, args=(n,), daemon=True) for n in range(WATCHERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--long-steps", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--telemetry-days", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="dashboard-bench-"))
    home = scratch / "home"
    home.mkdir()
    (home / "queues.yaml").write_text(HOLD)
    (home / "server.yaml").write_text(f'data_roots: {{"*": ["{STDLIB}"]}}\n')
    postgres = Postgres(scratch) if args.db == "postgres" else None
    db_url = postgres.url if postgres else f"sqlite:///{home / 'shipyard.db'}"
    env = {**os.environ, "SHIPYARD_HOME": str(home), "SHIPYARD_DB_URL": db_url,
           "SHIPYARD_INIT_ADMIN": f"admin:{PASSWORD}"}  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "shipyard.cli.main", "users", "list"],
        env=env,
        capture_output=True,
        check=False,
    )
    seeded = time.perf_counter()
    long_id = seed(db_url, home, args.jobs, args.long_steps, args.telemetry_days)
    points = (args.jobs - 1) * POINTS_PER_JOB + args.long_steps
    series_points = (args.jobs - 1) * SERIES_PER_JOB + 2 * args.long_steps
    samples = TELEMETRY_NODES * GPUS_PER_NODE * ((args.telemetry_days - 1) * 1440 + 86400 // 5)
    print(f"seeded {args.jobs} jobs, {points:,} step records, {series_points:,} series points and "
          f"{samples:,} device samples in {time.perf_counter() - seeded:.0f} s", file=sys.stderr)  # fmt: skip
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "shipyard.cli.main", "server", "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        root, _ = Client.login(url, "admin", PASSWORD)
        with root:
            live = spec_dict("watched", training={"steps": 200_000, "log_interval": 1, "eval_interval": 200})
            live["queue"] = "live"
            live_id = root.submit_job(live).id
            deadline = time.monotonic() + 300
            while root.get_job(live_id).step == 0 and time.monotonic() < deadline:
                time.sleep(1)  # once the agent has launched it and it has logged a step, it trains
            print(f"{live_id} is {root.get_job(live_id).state}", file=sys.stderr)
        watchers = Watchers(url, live_id)
        pages = [
            "/", "/jobs", "/jobs?state=succeeded&page=100", "/jobs?project=project-7&accelerator_type=cpu",
            f"/jobs/{long_id}", f"/jobs/{live_id}", f"/jobs/{live_id}/live", "/jobs/bench-000042",
            f"/api/v1/jobs/{long_id}/metrics?max_points=2000",
            f"/api/v1/series?job={long_id}&name=loss&name=lr",
            f"/api/v1/series?job={long_id}&name=loss&after_step={args.long_steps - 50}",
            "/api/v1/series/names?job=bench-000042",
            f"/compare?job={long_id}&job=bench-000042&job=bench-000043",
            "/api/v1/nodes/gpu-3/telemetry?hours=720", "/api/v1/nodes/gpu-3/telemetry?hours=1",
            "/api/v1/jobs/bench-000042/telemetry", "/usage?days=30", "/usage?days=30&by=type",
            "/api/v1/usage", "/queues", "/nodes", "/models", "/models/model-7?project=project-7",
            "/storage", "/audit", "/planner",
        ]  # fmt: skip
        results = timed_pages(url, pages, args.rounds)
        live_results = watchers.results()
    finally:
        _end_training(url)
        stop_agent(home)  # the server started it; it must not outlive the run
        server.terminate()
        server.wait(timeout=60)
        if postgres:
            postgres.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    worst = max(r["p95_ms"] for page, r in results.items() if not page.startswith("/usage"))
    usage_worst = max(r["p95_ms"] for page, r in results.items() if page.startswith("/usage"))
    live_p95 = live_results["live points"]["p95_ms"]
    summary = {
        "machine": f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()})",
        "database": args.db, "jobs": args.jobs, "step_records": points, "series_points": series_points,
        "device_samples": samples, "watchers": WATCHERS, "pages": results, "watched": live_results,
        "worst_page_p95_ms": worst, "usage_p95_ms": usage_worst, "live_points_p95_ms": live_p95,
        "met": worst < TARGET_MS and usage_worst < USAGE_TARGET_MS and live_p95 < LIVE_TARGET_MS,
    }  # fmt: skip
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{'page':70s} {'median ms':>10s} {'p95 ms':>8s}")
    for page, row in {
        **results,
        **{f"[{WATCHERS} watchers] {k}": v for k, v in live_results.items()},
    }.items():
        print(f"{page:70s} {row['median_ms']:10.1f} {row['p95_ms']:8.1f}")
    print(f"worst page p95 {worst:.1f} ms (target < {TARGET_MS:.0f}), usage 30 days p95 {usage_worst:.1f} ms "
          f"(< {USAGE_TARGET_MS:.0f}), live points p95 {live_p95:.1f} ms (< {LIVE_TARGET_MS:.0f}): "
          f"{'met' if summary['met'] else 'NOT met'}")  # fmt: skip


def _end_training(url: str) -> None:
    """Cancel the job that trained during the run and wait for it to end (at most 90 s)."""
    with contextlib.suppress(Exception), Client.login(url, "admin", PASSWORD)[0] as root:
        running = [job.id for job in root.list_jobs("running", limit=10) if job.name == "watched"]
        for job_id in running:
            root.cancel_job(job_id)
        deadline = time.monotonic() + 90
        while running and time.monotonic() < deadline:
            running = [j for j in running if root.get_job(j).state == "running"]
            time.sleep(1)


if __name__ == "__main__":
    main()
