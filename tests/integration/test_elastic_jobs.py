"""An elastic job through ``jobs submit`` on the local executor: it takes the whole machine while
alone, shrinks when a higher-priority job arrives, grows back when that one ends, each resize a
checkpoint and a restart, and its loss per step is that of a run that never changed size."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.builders import write_spec
from tests.conftest import Cli

pytestmark = pytest.mark.integration


def _train_losses(cli: Cli, job_id: str) -> dict[int, float]:
    run_dir = Path(cli.json("jobs", "show", job_id)["run_dir"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def _done(job: dict[str, Any]) -> bool:
    return job["state"] in ("succeeded", "failed", "cancelled")


def test_an_elastic_job_shrinks_for_a_higher_priority_job_and_grows_back_with_the_same_losses(
    cli: Cli, tmp_path: Path
) -> None:
    # Rank 0 sleeps 0.05 s a micro-batch (an injected fault, timing only): the job runs long
    # enough on any machine for the other to arrive, and for growing back to pay for its restart.
    faults = json.dumps({"attempts": [1, 2, 3, 4, 5], "slow_rank": 0, "slow_s": 0.05})
    cli.env.update(
        {
            "SHIPYARD_POLICY": "priority",
            "SHIPYARD_ROUND_S": "1",
            "SHIPYARD_RESIZE_COST_S": "1",
            "SHIPYARD_FAULTS": faults,
        }
    )
    half = max(1, len(os.sched_getaffinity(0)) // 2)  # cores per process: two processes fill the machine
    training = {"steps": 160, "eval_interval": 0}
    checkpoint = {"interval": 1000, "keep": 2}  # a resize writes its own; none are needed between
    elastic = {"accelerator": "cpu", "devices": {"min": 1, "max": 2}, "cpus_per_device": half}
    spec = write_spec(tmp_path, "grows", resources=elastic, training=training, checkpoint=checkpoint)
    job = cli.json("jobs", "submit", str(spec))
    cli.wait_for(job["id"], lambda j: j["state"] == "running" and j["step"] >= 5)
    [first] = cli.json("jobs", "show", job["id"])["attempts"]
    assert first["world_size"] == 2  # alone: both halves of the machine

    one = {"accelerator": "cpu", "devices": 1, "cpus_per_device": half}
    urgent = cli.json(
        "jobs",
        "submit",
        str(write_spec(tmp_path, "urgent", resources=one, priority=5, training={"steps": 20})),
    )
    shrunk = cli.wait_for(job["id"], lambda j: j["state"] == "queued" or len(j["attempts"]) > 1)
    assert cli.wait_for(urgent["id"], _done)["state"] == "succeeded"
    done = cli.wait_for(job["id"], _done, timeout=600)
    assert done["state"] == "succeeded", done

    attempts = cli.json("jobs", "show", job["id"])["attempts"]
    reasons = [a["exit_reason"] for a in attempts]
    assert reasons[0] == "resized" and reasons[-1] == "completed" and reasons.count("resized") >= 2, reasons
    sizes = [a["world_size"] for a in attempts]
    assert sizes[:2] == [2, 1] and sizes[-1] == 2, sizes  # shrank to one process, grew back to two
    assert shrunk["state"] in ("queued", "running")
    # Each resize says what and why (sizes in the scheduler's devices: a CPU job's cores).
    said = [a["message"] for a in attempts if a["exit_reason"] == "resized"]
    assert said[0].startswith(f"shrunk {2 * half}→{half} cpu: its devices went to {urgent['id']}"), said
    assert any(m.startswith(f"grew {half}→{2 * half} cpu") for m in said[1:]), said
    assert said[0] in cli.run("jobs", "show", job["id"]).stdout

    # The same spec at a fixed size: every step's loss is the same (same global batch, same order).
    fixed = {"accelerator": "cpu", "devices": 2, "cpus_per_device": half}
    cli.env.pop("SHIPYARD_FAULTS")
    spec = write_spec(tmp_path, "fixed", resources=fixed, training=training, checkpoint=checkpoint)
    reference = cli.json("jobs", "submit", str(spec), "--wait")
    assert reference["state"] == "succeeded"
    # Float sums in another order over 160 steps (one process accumulates what two split): 1e-3.
    assert _train_losses(cli, job["id"]) == pytest.approx(_train_losses(cli, reference["id"]), rel=1e-3)
