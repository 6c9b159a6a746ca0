"""One scheduling loop at a time on a shared PostgreSQL: the leader holds an advisory lock; kill
it and a standby takes over, adopting what runs, without losing or duplicating a job."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from shipyard.daemon.leader import Leadership
from shipyard.db import Attempt, open_database
from shipyard.hardware.discovery import usable_cores
from tests.builders import write_spec
from tests.conftest import Cli

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


def test_one_leader_at_a_time_and_the_lead_passes_on(postgres_url: str, tmp_path: Path) -> None:
    first, second = (open_database(postgres_url, tmp_path) for _ in range(2))
    a, b = Leadership(first), Leadership(second)
    try:
        assert a.is_leader() and not b.is_leader()
        assert a.is_leader() and not b.is_leader()  # asking again changes nothing
        a.close()
        assert b.is_leader() and not a.is_leader()
    finally:
        for held in (a, b):
            held.close()
        for db in (first, second):
            db.close()


class Agent:
    def __init__(self, home: Path, env: dict[str, str]) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.log = home / "agent.out"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "shipyard.daemon"],
                env={**env, "SHIPYARD_HOME": str(home)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log.read_text():
            assert self.process.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


def test_killing_the_leader_hands_the_queue_to_the_standby(postgres_url: str, tmp_path: Path) -> None:
    # The CLI in processes of its own, as before the tests ran it in theirs: which agent process
    # starts which attempt is what this test checks, and its timing is the old one.
    cli = Cli(tmp_path / "a", processes=True)
    # The jobs sleep through their steps (an injected fault): they only need to be running when
    # the leader dies, not to take the cores from the other tests meanwhile.
    env = {**cli.env, "SHIPYARD_DB_URL": postgres_url, "SHIPYARD_AGENT_IDLE_EXIT_S": "600",
           "SHIPYARD_AGENT_MAX_POLL_S": "0.5",
           "SHIPYARD_FAULTS": json.dumps({"slow_rank": 0, "slow_s": 0.1})}  # fmt: skip
    cli.env = env
    leader = Agent(tmp_path / "a", env)
    leader.wait_for("schedules")
    standby = Agent(tmp_path / "b", env)
    try:
        standby.wait_for("stands by")
        # The first runs long enough to be adopted by the standby; the second waits for the cores
        # the first holds (each takes all of them).
        whole = {"accelerator": "cpu", "devices": 1, "cpus_per_device": usable_cores()}
        jobs = [
            cli.json("jobs", "submit", str(write_spec(tmp_path, f"j{i}", resources=whole,
                                                      training={"steps": steps, "eval_interval": 0},
                                                      checkpoint={"interval": 50})))
            for i, steps in enumerate((40, 10))
        ]  # fmt: skip
        cli.wait_for(jobs[0]["id"], lambda j: j["state"] == "running")
        leader.process.kill()  # no goodbye: the database ends its session and frees the lock
        standby.wait_for("schedules")
        for job in jobs:
            done = cli.wait_for(job["id"], lambda j: j["state"] in ("succeeded", "failed"))
            assert done["state"] == "succeeded"
            assert len(done["attempts"]) == 1  # adopted or started once, never twice
        db = open_database(postgres_url, tmp_path)
        with db.read() as session:
            started_by = session.scalars(
                select(Attempt.agent_id).where(Attempt.job_id == jobs[1]["id"])
            ).one()
        db.close()
        assert started_by is not None and started_by.endswith(f":{standby.process.pid}")
    finally:
        leader.stop()
        standby.stop()
