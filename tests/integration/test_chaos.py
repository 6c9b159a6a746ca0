"""The chaos benchmark's short version: a fault of every kind, overlapping (training processes
killed and frozen, the agent and the server killed, PostgreSQL crashed and its connections cut,
a root deleted, one rotting, one full), on a live workload over the run's own PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

CHAOS = Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py"

if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
    pytest.skip("PostgreSQL's binaries are not installed: the run starts its own", allow_module_level=True)


@pytest.mark.timeout(1500)  # the benchmark's own limit: on a loaded machine it runs past the default
def test_faults_of_every_kind_at_once_lose_duplicate_and_corrupt_nothing() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(CHAOS),
            "--faults",
            "9",
            "--jobs",
            "6",
            "--live",
            "2",
            "--steps",
            "60",  # a job steps long enough, beside its start, for the training faults to find it
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    bill = json.loads(done.stdout)
    # A full disk needs a tmpfs mount, which only root may make: elsewhere that kind is skipped.
    assert bill["faults_total"] == 9 and {"train", "hang", "agent", "server", "postgres"} <= set(
        bill["faults"]
    )
    assert bill["jobs_lost"] == bill["jobs_duplicated"] == bill["acknowledged_lost"] == 0, bill
    assert bill["jobs"] == bill["jobs_submitted"]
    assert bill["corrupt_checkpoints"] == [] and bill["blobs_lost"] == 0
    assert bill["not_recovered"] == {}, bill  # every fault healed: training again, the store whole
    assert (bill["steps_redone_max"] or 0) <= bill["checkpoint_interval"]
    equal, total = map(int, bill["final_models_equal_uninterrupted"].split("/"))
    assert equal == total > 0
