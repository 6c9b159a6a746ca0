"""Chaos, the way Jepsen runs it: a workload of training jobs through a real ``shipyard server``
and its agent on PostgreSQL, while a nemesis injects faults at random moments without waiting
for the last to heal, then the bill, checked against the history of what was acknowledged.

The faults, each kind in turn, when and where at random, overlapping:

- ``train``: SIGKILL a running attempt's training process (the kernel's OOM killer, an operator);
- ``hang``: SIGSTOP a running attempt's training process (the agent must find it silent, read its
  stacks from outside, kill it and retry);
- ``agent``: SIGKILL the agent (the server starts another, which adopts what runs);
- ``server``: SIGKILL the server, a submission perhaps in flight, and start it again (the client
  sends the submission again with its idempotency key);
- ``postgres``: PostgreSQL crashes and restarts (``pg_ctl restart -m immediate``);
- ``connections``: every connection to the database is terminated (``pg_terminate_backend``);
- ``root-deleted``: one of the store's three roots (three replicas of everything) loses every file;
- ``root-corrupted``: a fifth of a root's blobs rot in place (same size, bytes changed);
- ``disk-full``: a root fills up for 15 s (a 4 MiB tmpfs mounted over it, full), then is freed.

The workload keeps ``--live`` jobs queued or running until ``--jobs`` were submitted, cancels every
sixth one early on, promotes the models of finished ones, and records when each operation was
acknowledged. The bill: faults injected; acknowledged operations lost (a submitted job missing, a
cancelled job that trained on to success, a promotion undone); jobs lost (submitted, neither
succeeded nor cancelled) and duplicated (more jobs than submissions); corrupt checkpoints; steps
redone per training fault (the step reached minus the step resumed at, against the checkpoint
interval); time to recover per fault kind (training again, a new agent, the server answering, the
database answering, the store whole, every copy read); how long a hung attempt was silent when
the agent stopped it; blobs lost at the end by a full verifying scrub, and artifacts holding one;
and whether every finished model equals an uninterrupted run's, bit for bit. Each fault's time
and target go to standard error as it strikes; ``--keep`` keeps the folder (logs, runs, database).

Clock jumps are not injected: the machine's wall clock is shared, and libfaketime (0.9.10) breaks
Python's timed waits (``time.sleep`` fails with EINVAL, ``Event.wait`` never returns). What a jump
would break is kept out by construction instead: hangs are timed on the agent's own monotonic
clock (``recovery.Silence``, tested with heartbeats whose times jump an hour each way).

    .venv/bin/python benchmarks/chaos.py [--faults 50] [--jobs 24] [--live 3] [--steps 120]
                                         [--seed 0] [--kinds train,hang,...] [--json] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import torch
from safetensors.torch import load_file
from sqlalchemy import select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.own_postgres import Postgres  # noqa: E402
from shipyard.client import Client  # noqa: E402
from shipyard.db import StoredBlob  # noqa: E402
from shipyard.errors import ShipyardError  # noqa: E402
from shipyard.schemas.launch import STACKS_DIR, Heartbeat  # noqa: E402
from shipyard.services.context import open_context  # noqa: E402
from shipyard.services.storage import health as store_health  # noqa: E402
from shipyard.services.storage import manifests  # noqa: E402
from shipyard.services.storage.catalog import blob_of  # noqa: E402
from shipyard.settings import Settings  # noqa: E402
from shipyard.storage import config as storage_config  # noqa: E402
from shipyard.storage.config import RootConfig, ScrubConfig, StorageConfig  # noqa: E402
from shipyard.storage.opening import open_store  # noqa: E402
from shipyard.training.checkpoint import read_whole  # noqa: E402
from tests.builders import STDLIB, spec_dict  # noqa: E402

T = TypeVar("T")
SHIPYARD = [sys.executable, "-m", "shipyard.cli.main"]
PASSWORD = "chaos monkey passphrase"
KINDS = (
    "train",
    "hang",
    "agent",
    "server",
    "postgres",
    "connections",
    "root-deleted",
    "root-corrupted",
    "disk-full",
)
FINAL = ("succeeded", "failed", "cancelled")
TRAINING_KINDS = ("train", "hang")
EXTRA_JOBS = 4
"""Faults that need a training process to strike: the workload runs on until each was struck."""
INTERVAL = 5
"""Steps between checkpoints."""
ROOTS = 3
RECOVERY_DEADLINE_S = 300.0


def job_spec(steps: int) -> dict[str, Any]:
    return spec_dict(
        "chaos",
        training={"steps": steps, "eval_interval": 0},
        checkpoint={"interval": INTERVAL, "keep": 2},
        # A hang is a rank silent this long: far above a tiny step, and startup on a busy core.
        restarts={"max": 50, "backoff_s": 0.5, "startup_grace_s": 10.0, "hang_factor": 10.0},
    )


# --- the server, its agent and its store -----------------------------------------------------------


class Site:
    """A server on loopback over its own home and the run's PostgreSQL, started again after each
    kill; calls through it are retried while it (or the database) is down."""

    def __init__(self, home: Path, db_url: str) -> None:
        home.mkdir(parents=True)
        (home / "server.yaml").write_text(f'data_roots: {{"*": ["{STDLIB}"]}}\n')
        self.home, self.db_url = home, db_url
        self.roots = [home.parent / f"root{i}" for i in range(ROOTS)]
        for root in self.roots:
            root.mkdir()
        storage_config.save(
            home,
            StorageConfig(
                # Three copies over three roots: the nemesis strikes a root every few seconds, and
                # two copies do not survive a second root fault before the first is healed (a
                # run with two lost 17 blobs of pruned checkpoints: a root deleted while the
                # other copy lay corrupt and a full disk hid the third root).
                replicas=3,
                roots=[RootConfig(path=root, rack=f"r{i}") for i, root in enumerate(self.roots)],
                # Bit rot is found by a read or by the deep pass, as in Ceph and HDFS: here the
                # deep pass comes round every 72 s, so a corrupted root heals within the run.
                scrub=ScrubConfig(interval_h=0.02, light_interval_s=2.0, rate_mb_s=1000.0),
            ),
        )
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "SHIPYARD_HOME": str(home),
            "SHIPYARD_DB_URL": db_url,
            "SHIPYARD_INIT_ADMIN": f"admin:{PASSWORD}",
            "SHIPYARD_AGENT_POLL_S": "0.2",
            "SHIPYARD_AGENT_IDLE_EXIT_S": "600",
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.starts: list[float] = []
        self.lock = threading.Lock()
        self.start()
        self.client = self.call(lambda _: Client.login(self.url, "admin", PASSWORD)[0])

    def start(self) -> float:
        """Start the server; returns how long it took to answer."""
        started = time.monotonic()
        log = open(self.home / "server.log", "ab")  # noqa: SIM115 - the server's, for its life
        self.process = subprocess.Popen(
            [*SHIPYARD, "server", "--port", str(self.port)], env=self.env, stdout=log, stderr=log
        )
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    took = time.monotonic() - started
                    self.starts.append(took)
                    return took
            except httpx.HTTPError:
                time.sleep(0.1)

    def kill_server(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def call(self, request: Callable[[Client], T], deadline_s: float = RECOVERY_DEADLINE_S) -> T:
        """``request`` until answered: through a server killed or a database restarting, a call
        fails for a moment (unreachable, or a 5xx); a refusal (4xx) is an answer."""
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                return request(getattr(self, "client", None))  # type: ignore[arg-type]
            except ShipyardError as exc:
                if 400 <= exc.http_status < 500 or time.monotonic() > deadline:
                    raise
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.3)

    def agent_pid(self) -> int | None:
        lock = self.home / "agent.lock"
        text = lock.read_text().strip() if lock.exists() else ""
        return int(text.split()[0]) if text else None

    def store_short(self) -> int:
        """Blob copies missing or damaged (every copy read and checked) and manifest copies
        missing, and 1 while a repair is owed (damage seen and not repaired); repairs nothing."""
        ctx = open_context(Settings(home=self.home, db_url=self.db_url))
        try:
            store = open_store(self.home)
            with ctx.db.read() as session:
                rows = [(blob_of(row), row.replicas) for row in session.scalars(select(StoredBlob))]
                short = manifests.heal(store, session, repair=False).missing
            for blob, replicas in rows:
                short += store.blobs.scrub(blob, replicas, repair=False, verify=True).missing
            return short + (store_health.owed(self.home) is not None)
        finally:
            ctx.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)
        if pid := self.agent_pid():
            signalled(os.kill, pid, signal.SIGTERM)


def signalled(call: Callable[..., None], *args: Any) -> bool:
    """Signal a process that may have ended meanwhile; whether it was there."""
    try:
        call(*args)
        return True
    except (ProcessLookupError, PermissionError):
        return False


# --- the history of what was acknowledged ------------------------------------------------------------


@dataclass
class History:
    submitted: dict[str, str] = field(default_factory=dict)
    """Idempotency key -> the job the server acknowledged creating."""
    cancelled: set[str] = field(default_factory=set)
    promoted: dict[tuple[str, int], str] = field(default_factory=dict)
    """(model, version) -> the stage acknowledged."""
    lock: threading.Lock = field(default_factory=threading.Lock)


def submit(site: Site, history: History, steps: int) -> str:
    """Submit until acknowledged: one job per key, however often the answer is lost."""
    key = uuid.uuid4().hex
    job = site.call(lambda c: c.submit_job(job_spec(steps), idempotency_key=key)).id
    with history.lock:
        history.submitted[key] = job
    return job


def unfinished_jobs(client: Client) -> list[Any]:
    return [j for j in client.list_jobs(limit=1000) if j.state in ("queued", "running")]


def workload(
    site: Site,
    history: History,
    jobs: int,
    live: int,
    steps: int,
    done: threading.Event,
    training_owed: threading.Event,
) -> None:
    """Keep ``live`` jobs queued or running until ``jobs`` were submitted, and on while the nemesis
    still owes a fault of a training kind (a run that ended first would skip it; at most
    ``EXTRA_JOBS`` more); cancel every sixth early on; promote the models of finished jobs."""
    count = 0
    while count < jobs or (training_owed.is_set() and count < jobs + EXTRA_JOBS):
        active = site.call(unfinished_jobs)
        for _ in range(live - len(active)):
            if count >= jobs:
                break
            job = submit(site, history, steps)
            count += 1
            if count % 6 == 0:  # early, with most of its steps ahead: it must end cancelled
                try:
                    site.call(lambda c, job=job: c.cancel_job(job))
                except ShipyardError:  # refused (it ended already): nothing was acknowledged
                    continue
                with history.lock:
                    history.cancelled.add(job)
        for version in site.call(lambda c: c.list_models("chaos")):
            if version.stage == "none" and (version.name, version.version) not in history.promoted:
                site.call(
                    lambda c, v=version: c.promote_model(v.name, v.version, "staging", project=v.project)
                )
                with history.lock:
                    history.promoted[(version.name, version.version)] = "staging"
        time.sleep(1.0)
    done.set()


# --- the nemesis -------------------------------------------------------------------------------


@dataclass
class Bill:
    faults: dict[str, int] = field(default_factory=dict)
    recovery_s: dict[str, list[float]] = field(default_factory=dict)
    not_recovered: dict[str, int] = field(default_factory=dict)
    steps_redone: list[int] = field(default_factory=list)
    hang_detected: list[tuple[float, float, float]] = field(default_factory=list)
    """For each hang: the silence the agent stopped it after (on its own clock, which starts at
    its first look: a hang the nemesis follows with an agent kill is timed by the new agent),
    the wall seconds from its last heartbeat to its stacks being taken, and its limit."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def struck(self, kind: str) -> None:
        with self.lock:
            self.faults[kind] = self.faults.get(kind, 0) + 1

    def recovered(self, kind: str, seconds: float | None) -> None:
        with self.lock:
            if seconds is None:
                self.not_recovered[kind] = self.not_recovered.get(kind, 0) + 1
            else:
                self.recovery_s.setdefault(kind, []).append(seconds)


def until(condition: Callable[[], bool], deadline_s: float = RECOVERY_DEADLINE_S) -> float | None:
    """Seconds until ``condition`` holds, or None past the deadline."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        with contextlib.suppress(Exception):  # a look that failed while things heal
            if condition():
                return time.monotonic() - started
        time.sleep(0.2)
    return None


def newest_beat(run_dir: Path) -> Heartbeat | None:
    beats = Heartbeat.read_all(run_dir)
    return max(beats, key=lambda b: b.at) if beats else None


def resumed_at(run_dir: Path, attempts: int) -> int:
    """The step the job's newest attempt resumed at (0: a fresh start)."""
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    resumes = [json.loads(line)["step"] for line in lines if '"kind": "resume"' in line]
    return resumes[-1] if resumes and attempts > 1 else 0


def training_process(parent: int) -> int | None:
    """The training process of a one-process attempt: its parent's only child."""
    try:
        children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


class Nemesis:
    def __init__(self, site: Site, db: Postgres, bill: Bill, rng: random.Random) -> None:
        self.site, self.db, self.bill, self.rng = site, db, bill, rng
        self.watchers: list[threading.Thread] = []
        self.target = ""
        """What the last fault struck (a job, a root, a process), for the run's log."""

    def strike(self, kind: str) -> bool:
        """Inject one fault (False: nothing to strike now); recovery is watched in the background."""
        if kind in TRAINING_KINDS:
            return self._training(kind)
        if kind == "agent":
            pid = self.site.agent_pid()
            if pid is None or not signalled(os.kill, pid, signal.SIGKILL):
                return False
            self.target = f"pid {pid}"
            return self._watch(kind, lambda: self.site.agent_pid() not in (None, pid))
        if kind == "server":
            with self.site.lock:
                self.site.kill_server()
                self.bill.struck(kind)
                self.bill.recovered(kind, self.site.start())
            return True
        if kind == "postgres":
            self.db.crash()
            return self._watch(kind, lambda: bool(self.site.client.list_jobs(limit=1) is not None))
        if kind == "connections":
            self.db.drop_connections()
            return self._watch(kind, lambda: bool(self.site.client.list_jobs(limit=1) is not None))
        if kind.startswith("root") or kind == "disk-full":
            return self._root(kind)
        raise ValueError(kind)

    def _watch(self, kind: str, healed: Callable[[], bool]) -> bool:
        self.bill.struck(kind)
        watcher = threading.Thread(target=lambda: self.bill.recovered(kind, until(healed)), daemon=True)
        watcher.start()
        self.watchers.append(watcher)
        return True

    def _training(self, kind: str) -> bool:
        candidates = []
        for job in self.site.call(lambda c: c.list_jobs(state="running", limit=100)):
            detail = self.site.call(lambda c, j=job: c.get_job(j.id))
            attempt = next((a for a in detail.attempts if a.state == "running" and a.pid), None)
            beat = newest_beat(Path(detail.run_dir))
            if attempt and beat and beat.phase == "step":
                candidates.append((detail, attempt, beat))
        if not candidates:
            return False
        detail, attempt, before = self.rng.choice(candidates)
        rank = training_process(attempt.pid or 0)
        if rank is None or not signalled(
            os.kill, rank, signal.SIGKILL if kind == "train" else signal.SIGSTOP
        ):
            return False
        struck, run_dir = time.time(), Path(detail.run_dir)
        self.target = f"{detail.id} attempt {attempt.number} at step {before.step}"
        if kind == "hang":
            time.sleep(0.5)  # a heartbeat being written as it stopped is whole now
        last = newest_beat(run_dir) or before

        def trains_again() -> bool:
            now = self.site.client.get_job(detail.id)
            if now.state in FINAL:
                return True
            beat = newest_beat(run_dir)
            return bool(
                beat and beat.at > struck and beat.phase == "step" and len(now.attempts) > attempt.number
            )

        def watch() -> None:
            took = until(trains_again)
            self.bill.recovered(kind, took)
            now = self.site.call(lambda c: c.get_job(detail.id))
            if took is not None and now.state not in FINAL:
                with self.bill.lock:
                    self.bill.steps_redone.append(last.step - resumed_at(run_dir, len(now.attempts)))
            stacks = run_dir / STACKS_DIR / f"attempt-{attempt.number}.txt"
            hung = next((a for a in now.attempts if a.number == attempt.number), None)
            health = (hung.health or {}) if hung else {}
            if kind == "hang" and stacks.exists() and "silent_s" in health:
                wall = stacks.stat().st_mtime - last.at  # declared hung when its stacks were taken
                with self.bill.lock:
                    self.bill.hang_detected.append((health["silent_s"], wall, health["limit_s"]))

        self.bill.struck(kind)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        self.watchers.append(watcher)
        return True

    def _root(self, kind: str) -> bool:
        free = [root for root in self.site.roots if not root.is_mount()]  # not one that is full now
        if not free:
            return False
        root = self.rng.choice(free)
        self.target = root.name
        if kind == "root-deleted":  # at once, as a disk dies: the contents move aside, then go
            gone = root.with_name(f"{root.name}.lost-{uuid.uuid4().hex[:6]}")
            root.rename(gone)
            root.mkdir()
            shutil.rmtree(gone, ignore_errors=True)
        elif kind == "root-corrupted":
            blobs = sorted(p for p in root.rglob("*") if p.is_file() and "blobs" in p.parts)
            if not blobs:
                return False  # nothing on it yet to rot
            for blob in self.rng.sample(blobs, max(1, len(blobs) // 5)):
                data = blob.read_bytes()
                blob.write_bytes(bytes(b ^ 0xFF for b in data[:64]) + data[64:])
        else:
            if not self._fill(root):
                return False
        return self._watch(kind, lambda: self.site.store_short() == 0)

    def _fill(self, root: Path) -> bool:
        """A full disk over ``root`` for 15 s (a 4 MiB tmpfs mounted on it, filled), then gone."""
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root)], capture_output=True
        )
        if done.returncode != 0:
            return False
        with contextlib.suppress(OSError), open(root / "filler", "wb") as filler:
            filler.write(b"\0" * (8 << 20))

        def free() -> None:
            time.sleep(15)
            while subprocess.run(["umount", str(root)], capture_output=True).returncode != 0:
                time.sleep(0.5)  # a file open on it: the next try

        threading.Thread(target=free, daemon=True).start()
        return True


# --- the run -------------------------------------------------------------------------------------


def wait_all_done(site: Site, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        jobs = [j.model_dump(mode="json") for j in site.call(lambda c: c.list_jobs(limit=1000))]
        if all(j["state"] in FINAL for j in jobs) or time.monotonic() > deadline:
            return jobs
        time.sleep(1.0)


def checkpoints_that_do_not_load(home: Path) -> list[str]:
    """Complete checkpoints (their description written) whose shards or trainer state do not read."""
    bad = []
    for marker in sorted(home.glob("runs/*/checkpoints/step_*/checkpoint.json")):
        try:
            read_whole(marker.parent, "model")
            read_whole(marker.parent, "optimizer")
            torch.load(marker.parent / "trainer.pt", map_location="cpu", weights_only=False)
        except Exception as exc:  # any failure to read is a corrupt checkpoint
            bad.append(f"{marker.parent}: {exc}")
    return bad


def blobs_lost(site: Site) -> tuple[int, int]:
    """A full verifying scrub of the store (no repair): blobs with no good replica, and
    artifacts (the stored checkpoints and exports that jobs and models use) holding one."""
    done = subprocess.run(
        [*SHIPYARD, "storage", "scrub", "--json"],
        env={**os.environ, "SHIPYARD_HOME": str(site.home), "SHIPYARD_DB_URL": site.db_url},
        capture_output=True,
        text=True,
        check=False,
    )
    found = json.loads(done.stdout)
    return int(found["lost"]), len(found["lost_artifacts"])


def same_weights(export: Path, reference: dict[str, torch.Tensor]) -> bool:
    weights = load_file(export / "model.safetensors")
    return weights.keys() == reference.keys() and all(
        torch.equal(weights[k], reference[k]) for k in reference
    )


def stat(values: list[float], how: str) -> float | None:
    if not values:
        return None
    if how == "median":
        return round(statistics.median(values), 1)
    ordered = sorted(values)
    return round(
        ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))] if how == "p95" else max(values), 1
    )


def run(
    scratch: Path, faults: int, jobs: int, live: int, steps: int, seed: int, kinds: tuple[str, ...]
) -> dict[str, Any]:
    rng = random.Random(seed)
    db = Postgres(scratch)
    site = Site(scratch / "home", db.url)
    bill, history = Bill(), History()
    started = time.monotonic()
    try:
        # The uninterrupted run every finished model is compared with.
        reference_id = submit(site, history, steps)
        [reference_job] = [j for j in wait_all_done(site, 900) if j["id"] == reference_id]
        reference = load_file(Path(reference_job["run_dir"]) / "export" / "model.safetensors")
        finished, training_owed = threading.Event(), threading.Event()
        owed = {k for k in kinds if k in TRAINING_KINDS}
        if owed:
            training_owed.set()
        worker = threading.Thread(
            target=workload, args=(site, history, jobs, live, steps, finished, training_owed), daemon=True
        )
        worker.start()
        nemesis = Nemesis(site, db, bill, rng)
        injected = attempts = 0
        while injected < faults:
            time.sleep(rng.uniform(1.0, 5.0))
            kind = kinds[attempts % len(kinds)]  # each kind in turn; when and where is random
            if nemesis.strike(kind):
                injected += 1
                attempts += 1
                owed.discard(kind)
                if not owed:
                    training_owed.clear()
                at = time.strftime("%H:%M:%S")
                print(f"{at} fault {injected}/{faults}: {kind} {nemesis.target}", file=sys.stderr, flush=True)
                nemesis.target = ""
            elif kind not in TRAINING_KINDS and rng.random() < 0.2:
                attempts += 1  # nothing to strike of this kind for now: the next kind
            elif kind in TRAINING_KINDS and finished.is_set() and not site.call(unfinished_jobs):
                # A training process is waited for while any job may still train (between steps
                # or jobs there may be none a moment): only an idle site moves on without one.
                attempts += 1
        worker.join()
        final = wait_all_done(site, 1800)
        for watcher in nemesis.watchers:
            watcher.join(timeout=RECOVERY_DEADLINE_S)
        lost_blobs, lost_artifacts = blobs_lost(site)
        stages = {(v.name, v.version): v.stage for v in site.call(lambda c: c.list_models("chaos"))}
    finally:
        site.stop()
        db.stop()
    by_id = {j["id"]: j for j in final}
    acked = set(history.submitted.values())
    missing = sorted(acked - set(by_id))
    trained_on = sorted(j for j in history.cancelled if by_id.get(j, {}).get("state") == "succeeded")
    undone = sorted(ref for ref, stage in history.promoted.items() if stages.get(ref) != stage)
    lost = [j for j in acked if by_id.get(j, {}).get("state") not in ("succeeded", "cancelled")]
    succeeded = [j for j in final if j["state"] == "succeeded"]
    equal = [same_weights(Path(j["run_dir"]) / "export", reference) for j in succeeded]
    recovery = {
        f"{kind}_recovery_s": {how: stat(seconds, how) for how in ("median", "p95", "max")}
        for kind, seconds in sorted(bill.recovery_s.items())
    }
    return {
        "machine": f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()})",
        "database": "postgresql (its own instance, crashed by the nemesis)",
        "faults": bill.faults,
        "faults_total": sum(bill.faults.values()),
        "jobs_submitted": len(history.submitted),
        "jobs": len(final),
        "jobs_lost": len(lost),
        "jobs_duplicated": max(0, len(final) - len(history.submitted)),
        "acknowledged_lost": len(missing) + len(trained_on) + len(undone),
        "acknowledged_ops": len(history.submitted) + len(history.cancelled) + len(history.promoted),
        "corrupt_checkpoints": checkpoints_that_do_not_load(site.home),
        "blobs_lost": lost_blobs,
        "artifacts_lost": lost_artifacts,
        "not_recovered": bill.not_recovered,
        "checkpoint_interval": INTERVAL,
        "steps_redone_max": max(bill.steps_redone, default=None),
        "steps_redone_median": statistics.median(bill.steps_redone) if bill.steps_redone else None,
        "hang_silent_s_when_stopped": sorted(silent for silent, _, _ in bill.hang_detected),
        "hang_limit_s": sorted({limit for _, _, limit in bill.hang_detected}),
        "hang_last_beat_to_stacks_s": sorted(round(wall, 1) for _, wall, _ in bill.hang_detected),
        **recovery,
        "server_start_s": {how: stat(site.starts, how) for how in ("median", "max")},
        "final_models_equal_uninterrupted": f"{sum(equal)}/{len(equal)}",
        "wall_s": round(time.monotonic() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=24, help="jobs submitted by the workload")
    parser.add_argument("--live", type=int, default=3, help="jobs kept queued or running at once")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"of {', '.join(KINDS)}")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the folder: logs, runs, database")
    args = parser.parse_args()
    kinds = tuple(k for k in args.kinds.split(",") if k)
    scratch = Path(tempfile.mkdtemp(prefix="chaos-"))
    try:
        result = run(scratch, args.faults, args.jobs, args.live, args.steps, args.seed, kinds)
    finally:
        if args.keep:
            print(f"kept: {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key:34} {value}")


if __name__ == "__main__":
    main()
