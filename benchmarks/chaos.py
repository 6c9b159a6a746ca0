"""Chaos: a workload of small training jobs through a real ``shipyard server`` while faults are
injected at random, then the bill.

Faults, one at a time at random moments and on a random job, each kind in turn, each waited out
before the next:

- ``train``: SIGKILL a running attempt's processes (a crash, the kernel's OOM killer);
- ``hang``: SIGSTOP a running attempt (a collective that never returns): the agent must see no
  heartbeat, dump its stacks, kill it and retry;
- ``agent``: SIGKILL the agent: the server starts another, which adopts the running attempts;
- ``server``: SIGKILL the server while a submission is in flight, start it again; the client
  sends the submission again with the same idempotency key;
- ``root``: one of the store's three roots (two replicas of everything) loses every file, as a
  dead disk replaced by an empty one: checkpoints keep being committed to the others, resumes
  read the surviving replicas, and the background scrubber refills the new disk, manifests
  included.

Reports jobs lost (submitted and not succeeded) and duplicated (more jobs than submissions),
checkpoints that do not load, steps lost per fault (the step the attempt had reached minus the
step the next one resumed at, against the checkpoint interval), seconds from fault to training
again (median, p95), seconds from a lost root to a store whole again (every blob and manifest at
its replicas), blobs lost at the end by a full verifying scrub, and whether every final model
equals an uninterrupted run's, bit for bit.

    .venv/bin/python benchmarks/chaos.py [--faults 50] [--jobs 2] [--steps 150] [--seed 0] [--json]
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from sqlalchemy import select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from shipyard.client import Client  # noqa: E402
from shipyard.db import StoredBlob  # noqa: E402
from shipyard.errors import ShipyardError  # noqa: E402
from shipyard.schemas.launch import Heartbeat  # noqa: E402
from shipyard.services import manifests  # noqa: E402
from shipyard.services.context import open_context  # noqa: E402
from shipyard.services.storage import blob_of  # noqa: E402
from shipyard.settings import Settings  # noqa: E402
from shipyard.storage import config as storage_config  # noqa: E402
from shipyard.storage.config import RootConfig, ScrubConfig, StorageConfig  # noqa: E402
from shipyard.storage.opening import open_store  # noqa: E402
from shipyard.training.checkpoint import read_whole  # noqa: E402
from tests.builders import STDLIB, spec_dict  # noqa: E402

SHIPYARD = [sys.executable, "-m", "shipyard.cli.main"]
PASSWORD = "chaos monkey passphrase"
KINDS = ("train", "hang", "agent", "server", "root")
FINAL = ("succeeded", "failed", "cancelled")
INTERVAL = 5
"""Steps between checkpoints."""
ROOTS = 3
SCRUB_INTERVAL_H = 0.002
"""About 7 s between background scrub passes (a week by default)."""


def job_spec(steps: int) -> dict[str, Any]:
    return spec_dict(
        "chaos",
        training={"steps": steps, "eval_interval": 0},
        checkpoint={"interval": INTERVAL, "keep": 2},
        # A hang is a step that takes this long: far above a tiny step, and startup on a busy core.
        restarts={"max": 50, "backoff_s": 0.5, "startup_grace_s": 10.0},
    )


class Site:
    """A server on loopback over its own home, started again after each kill."""

    def __init__(self, home: Path) -> None:
        home.mkdir(parents=True)
        (home / "server.yaml").write_text(f'data_roots: {{"*": ["{STDLIB}"]}}\n')
        self.home = home
        self.roots = [home.parent / f"root{i}" for i in range(ROOTS)]
        for root in self.roots:
            root.mkdir()
        storage_config.save(
            home,
            StorageConfig(
                replicas=2,
                roots=[RootConfig(path=root, rack=f"r{i}") for i, root in enumerate(self.roots)],
                scrub=ScrubConfig(interval_h=SCRUB_INTERVAL_H, rate_mb_s=1000.0),
            ),
        )
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "SHIPYARD_HOME": str(home),
            "SHIPYARD_INIT_ADMIN": f"admin:{PASSWORD}",
            "SHIPYARD_AGENT_POLL_S": "0.2",
            "SHIPYARD_AGENT_IDLE_EXIT_S": "600",
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.start()
        self.client, _ = Client.login(self.url, "admin", PASSWORD)

    def start(self) -> float:
        """Start the server; returns how long it took to answer."""
        started = time.monotonic()
        log = open(self.home / "server.log", "ab")  # noqa: SIM115 - the server's, for its life
        self.process = subprocess.Popen(
            [*SHIPYARD, "server", "--port", str(self.port)], env=self.env, stdout=log, stderr=log
        )
        import httpx

        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                time.sleep(0.1)

    def kill_server(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def agent_pid(self) -> int | None:
        lock = self.home / "agent.lock"
        text = lock.read_text().strip() if lock.exists() else ""
        return int(text.split()[0]) if text else None

    def copies_short(self) -> int:
        """Blob and manifest copies the store lacks (what a lost root took), without a repair."""
        ctx = open_context(Settings(home=self.home, db_url=f"sqlite:///{self.home / 'shipyard.db'}"))
        try:
            store = open_store(self.home)
            with ctx.db.read() as session:
                rows = [(blob_of(row), row.replicas) for row in session.scalars(select(StoredBlob))]
                short = manifests.heal(store, session, repair=False).missing
            for blob, replicas in rows:
                short += store.blobs.scrub(blob, replicas, repair=False, verify=False).missing
            return short
        finally:
            ctx.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)
        if pid := self.agent_pid():
            with_suppressed(os.kill, pid, signal.SIGTERM)


def with_suppressed(call: Any, *args: Any) -> None:
    """Signal a process that may have ended meanwhile."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        call(*args)


@dataclass
class Bill:
    faults: dict[str, int] = field(default_factory=dict)
    recovery_s: dict[str, list[float]] = field(default_factory=dict)
    """Fault (of a training process) to the job's next step, by kind of fault."""
    steps_lost: list[int] = field(default_factory=list)
    server_back_s: list[float] = field(default_factory=list)
    store_whole_s: list[float] = field(default_factory=list)
    """A root's files lost to every blob and manifest at its replicas again."""
    roots_not_refilled: int = 0
    """Roots still short of copies 300 s after they were emptied."""
    agent_back_s: list[float] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    """Every submission's idempotency key."""


def submit(site: Site, bill: Bill, steps: int) -> str:
    """Submit until answered (the server may be down for a moment): one job per key."""
    key = uuid.uuid4().hex
    bill.keys.append(key)
    while True:
        try:
            return site.client.submit_job(job_spec(steps), idempotency_key=key).id
        except ShipyardError:
            time.sleep(0.5)


def running_attempts(site: Site) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(job, running attempt) of every job past its first steps since it (re)started."""
    found = []
    for job in site.client.list_jobs(state="running"):
        detail = site.client.get_job(job.id).model_dump(mode="json")
        attempt = next((a for a in detail["attempts"] if a["state"] == "running"), None)
        beat = newest_beat(Path(detail["run_dir"]))
        if attempt and beat and beat.phase == "step" and beat.step >= resumed_at(detail) + 2:
            found.append((detail, attempt))
    return found


def newest_beat(run_dir: Path) -> Heartbeat | None:
    beats = Heartbeat.read_all(run_dir)
    return max(beats, key=lambda b: b.at) if beats else None


def resumed_at(detail: dict[str, Any]) -> int:
    """The step the job's newest attempt resumed at (0: a fresh start)."""
    metrics = Path(detail["run_dir"]) / "metrics.jsonl"
    resumes = (
        [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"kind": "resume"' in line]
        if metrics.exists()
        else []
    )
    return resumes[-1] if resumes and len(detail["attempts"]) > 1 else 0


def strike_training(site: Site, bill: Bill, kind: str, rng: random.Random) -> bool:
    """Kill or freeze one running attempt; wait until its job trains again and measure."""
    candidates = running_attempts(site)
    if not candidates:
        return False
    detail, attempt = rng.choice(candidates)
    run_dir = Path(detail["run_dir"])
    before = newest_beat(run_dir)
    assert before is not None
    struck = time.time()
    if kind == "train":
        with_suppressed(os.killpg, attempt["pid"], signal.SIGKILL)
    else:
        with_suppressed(os.kill, attempt["pid"], signal.SIGSTOP)
    bill.faults[kind] = bill.faults.get(kind, 0) + 1
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        beat = newest_beat(run_dir)
        again = site.client.get_job(detail["id"]).model_dump(mode="json")
        if again["state"] in ("failed", "cancelled"):
            return True  # counted as lost at the end
        if beat and beat.at > struck and beat.phase == "step" and len(again["attempts"]) > attempt["number"]:
            bill.recovery_s.setdefault(kind, []).append(beat.at - struck)
            bill.steps_lost.append(before.step - resumed_at(again))
            return True
        time.sleep(0.1)
    return True


def strike_agent(site: Site, bill: Bill) -> bool:
    """Kill the agent while jobs run; the server's watchdog starts another, which adopts them."""
    pid = site.agent_pid()
    if pid is None or not site.client.list_jobs(state="running"):
        return False
    struck = time.monotonic()
    with_suppressed(os.kill, pid, signal.SIGKILL)
    bill.faults["agent"] = bill.faults.get("agent", 0) + 1
    while site.agent_pid() in (None, pid):
        time.sleep(0.1)
    bill.agent_back_s.append(time.monotonic() - struck)
    return True


def strike_server(site: Site, bill: Bill, rng: random.Random, steps: int) -> bool:
    """Kill the server while a submission is in flight, then start it again."""
    submitting = threading.Thread(target=submit, args=(site, bill, steps))
    submitting.start()
    time.sleep(rng.uniform(0.0, 0.05))
    site.kill_server()
    bill.faults["server"] = bill.faults.get("server", 0) + 1
    bill.server_back_s.append(site.start())
    submitting.join()
    return True


def strike_root(site: Site, bill: Bill, rng: random.Random) -> bool:
    """Empty one root (a disk replaced) while jobs train; wait for the scrubber to refill it."""
    if not site.client.list_jobs(state="running"):
        return False
    root = rng.choice(site.roots)
    struck = time.monotonic()
    # At once, as a disk dies (writers may be mid-file in it): the old contents move aside.
    gone = root.with_name(f"{root.name}.lost-{uuid.uuid4().hex[:6]}")
    root.rename(gone)
    root.mkdir()
    shutil.rmtree(gone, ignore_errors=True)
    bill.faults["root"] = bill.faults.get("root", 0) + 1
    deadline = struck + 300
    while site.copies_short():
        if time.monotonic() > deadline:
            bill.roots_not_refilled += 1
            return True
        time.sleep(0.5)
    bill.store_whole_s.append(time.monotonic() - struck)
    return True


def blobs_lost(home: Path) -> int:
    """A full verifying scrub of the store (no repair): blobs with no good replica."""
    done = subprocess.run(
        [*SHIPYARD, "storage", "scrub", "--json"],
        env={**os.environ, "SHIPYARD_HOME": str(home)},
        capture_output=True,
        text=True,
        check=False,
    )
    return int(json.loads(done.stdout)["lost"])


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


def same_weights(export: Path, reference: dict[str, torch.Tensor]) -> bool:
    weights = load_file(export / "model.safetensors")
    return weights.keys() == reference.keys() and all(
        torch.equal(weights[k], reference[k]) for k in reference
    )


def wait_all_done(site: Site, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        jobs = [j.model_dump(mode="json") for j in site.client.list_jobs(limit=1000)]
        if all(j["state"] in FINAL for j in jobs) or time.monotonic() > deadline:
            return jobs
        time.sleep(0.5)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(faults: int, jobs: int, steps: int, seed: int, kinds: tuple[str, ...]) -> dict[str, Any]:
    rng = random.Random(seed)
    scratch = Path(tempfile.mkdtemp(prefix="chaos-"))
    site = Site(scratch / "home")
    bill = Bill()
    started = time.monotonic()
    try:
        # The uninterrupted run every final model is compared with.
        reference_id = submit(site, bill, steps)
        [done] = [j for j in wait_all_done(site, 600) if j["id"] == reference_id]
        reference = load_file(Path(done["run_dir"]) / "export" / "model.safetensors")
        injected = 0
        while injected < faults:
            live = [j for j in site.client.list_jobs() if j.state in ("queued", "running")]
            for _ in range(jobs - len(live)):
                submit(site, bill, steps)
            time.sleep(rng.uniform(0.5, 2.0))
            kind = kinds[injected % len(kinds)]  # each kind in turn; when and whom is random
            if kind in ("train", "hang"):
                struck = strike_training(site, bill, kind, rng)
            elif kind == "agent":
                struck = strike_agent(site, bill)
            elif kind == "root":
                struck = strike_root(site, bill, rng)
            else:
                struck = strike_server(site, bill, rng, steps)
            injected += struck
            if struck:
                print(f"fault {injected}/{faults}: {kind}", file=sys.stderr, flush=True)
        final = wait_all_done(site, 900)
        lost_blobs = blobs_lost(site.home)
    finally:
        site.stop()
    succeeded = [j for j in final if j["state"] == "succeeded"]
    equal = [same_weights(Path(j["run_dir"]) / "export", reference) for j in succeeded]
    return {
        "machine": platform_name(),
        "faults": bill.faults,
        "faults_total": sum(bill.faults.values()),
        "submissions": len(bill.keys),
        "jobs": len(final),
        "jobs_lost": len(bill.keys) - len(succeeded),
        "jobs_duplicated": max(0, len(final) - len(bill.keys)),
        "corrupt_checkpoints": checkpoints_that_do_not_load(scratch / "home"),
        "blobs_lost": lost_blobs,
        "roots_not_refilled": bill.roots_not_refilled,
        "checkpoint_interval": INTERVAL,
        "steps_lost_max": max(bill.steps_lost, default=None),
        "steps_lost_median": statistics.median(bill.steps_lost) if bill.steps_lost else None,
        **{
            f"{kind}_recovery_s_{stat}": value
            for kind, seconds in sorted(bill.recovery_s.items())
            for stat, value in (("median", statistics.median(seconds)), ("p95", percentile(seconds, 0.95)))
        },
        "agent_back_s_median": statistics.median(bill.agent_back_s) if bill.agent_back_s else None,
        "server_back_s_median": statistics.median(bill.server_back_s) if bill.server_back_s else None,
        "store_whole_s_median": statistics.median(bill.store_whole_s) if bill.store_whole_s else None,
        "store_whole_s_max": max(bill.store_whole_s, default=None),
        "final_models_equal_uninterrupted": f"{sum(equal)}/{len(equal)}",
        "wall_s": round(time.monotonic() - started, 1),
    }


def platform_name() -> str:
    return f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=2, help="jobs kept live at once")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"of {', '.join(KINDS)}")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    kinds = tuple(k for k in args.kinds.split(",") if k)
    result = run(args.faults, args.jobs, args.steps, args.seed, kinds)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key:34} {value}")


if __name__ == "__main__":
    main()
