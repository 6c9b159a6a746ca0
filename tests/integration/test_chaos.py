"""The chaos benchmark's short version: one fault of each kind (a training process killed, one
frozen, the agent killed, the server killed mid-submission, a store root emptied) on a live
workload."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CHAOS = Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py"


def test_a_fault_of_each_kind_loses_and_duplicates_nothing() -> None:
    done = subprocess.run(
        [sys.executable, str(CHAOS), "--faults", "5", "--steps", "60", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    bill = json.loads(done.stdout)
    assert bill["faults"] == {"train": 1, "hang": 1, "agent": 1, "server": 1, "root": 1}
    assert bill["jobs_lost"] == bill["jobs_duplicated"] == 0 and bill["corrupt_checkpoints"] == []
    assert bill["jobs"] == bill["submissions"]
    # The background scrubber refilled the emptied root (the benchmark waits for it), and a
    # verifying scrub at the end finds every blob whole.
    assert bill["roots_not_refilled"] == bill["blobs_lost"] == 0
    assert bill["steps_lost_max"] <= bill["checkpoint_interval"]
    equal, total = map(int, bill["final_models_equal_uninterrupted"].split("/"))
    assert equal == total == bill["jobs"]
