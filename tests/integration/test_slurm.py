"""Shipyard on a real Slurm cluster (``SHIPYARD_EXECUTOR=slurm``): a slurmctld and two slurmd of
the test's own, jobs submitted through ``shipyard jobs submit``, launched by the agent with
``sbatch``, their ranks started by ``srun``; run folders shared as on a cluster's shared filesystem
(here the nodes are on this machine, so every node sees the home).

The nodes' GPUs are GRES entries (``gpu:h100:2``) over device files that are not GPUs: the seam
for hardware this machine lacks (``SHIPYARD_SLURM_EMULATED_GPUS``; ranks run on the CPU). The
site's GRES type ``h100`` is mapped onto the catalog's ``h100-sxm`` as an administrator would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shipyard.errors import DependencyMissing
from tests.builders import spec_dict, write_spec
from tests.conftest import Cli
from tests.integration.test_runtime import metrics, run_runtime

pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.slow]

STEPS = {"eval_interval": 0}
ONE_GPU = {"accelerator": "h100-sxm", "devices": 1, "cpus_per_device": 1}
IDLING = json.dumps({"slow_rank": 0, "slow_s": 0.5})
"""Injected into jobs that only hold devices: they sleep through their steps."""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.support.slurm_cluster import SlurmCluster, SlurmNode

    cluster = SlurmCluster(
        tmp_path_factory.mktemp("slurm"),
        nodes=tuple(SlurmNode(f"n{i}", "h100", 2, features=(f"rack=r{i}", "ib")) for i in (1, 2)),
    )
    try:
        cluster.start()
    except DependencyMissing as exc:
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def on_slurm(slurm: Any, tmp_path: Path) -> Iterator[Cli]:
    """The CLI of a home whose agent runs jobs through the Slurm cluster."""
    runner = Cli(tmp_path / "home")
    runner.env.update(
        {
            **slurm.env(),
            "SHIPYARD_EXECUTOR": "slurm",
            "SHIPYARD_SLURM_GRES_TYPES": "h100=h100-sxm",
            "SHIPYARD_SLURM_EMULATED_GPUS": "1",
        }
    )
    yield runner
    runner.stop_agent()
    slurm.slurm("scancel", "--full", "--signal=KILL", f"--partition={slurm.partition}", check=False)
    slurm.wait_idle(60)  # the next test starts on idle nodes


def submit(cli: Cli, directory: Path, name: str, steps: int, **resources: Any) -> dict[str, Any]:
    spec = write_spec(directory, name, training={**STEPS, "steps": steps}, resources=resources)
    job: dict[str, Any] = cli.json("jobs", "submit", str(spec))
    return job


def settled(job: dict[str, Any]) -> bool:
    return job["state"] not in ("queued", "running")


def test_nodes_shows_slurms_nodes_with_mapped_gpus_features_and_state(on_slurm: Cli) -> None:
    nodes = {n["id"]: n for n in on_slurm.json("nodes")}
    assert set(nodes) == {"n1", "n2"}
    for i, name in enumerate(("n1", "n2"), start=1):
        node = nodes[name]
        assert node["up"] and node["capacity"]["h100-sxm"] == 2 and node["capacity"]["cpu"] == 2
        assert node["labels"]["slurm.state"] == "idle" and node["labels"]["rack"] == f"r{i}"
        assert node["labels"]["feature.ib"] == "true" and node["memory_gib"]["h100-sxm"] == 80
    listed = on_slurm.run("nodes").stdout
    assert "h100-sxm 0/2" in listed and "slurm.state=idle" in listed


def test_without_the_gres_mapping_a_job_is_refused_naming_the_fix(on_slurm: Cli, tmp_path: Path) -> None:
    on_slurm.env.pop("SHIPYARD_SLURM_GRES_TYPES")
    spec = write_spec(tmp_path, resources=ONE_GPU)
    done = on_slurm.run("jobs", "submit", str(spec), check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "gpu:h100:2" in done.stderr and "SHIPYARD_SLURM_GRES_TYPES" in done.stderr


def test_a_two_node_job_runs_through_sbatch_and_srun_with_the_losses_of_one_process(
    on_slurm: Cli, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, training={**STEPS, "steps": 6}, resources={**ONE_GPU, "nodes": 2})
    job = on_slurm.json("jobs", "submit", str(spec))
    done = on_slurm.wait_for(job["id"], settled)
    run_dir = on_slurm.home / "runs" / job["id"]
    assert done["state"] == "succeeded", on_slurm.run("jobs", "logs", job["id"]).stdout
    (attempt,) = done["attempts"]
    assert sorted(attempt["node"].split(",")) == ["n1", "n2"]
    assert metrics(run_dir, "start")[0]["world_size"] == 2
    reference = run_runtime(
        tmp_path / "reference", tmp_path / "cache", spec_dict(training={**STEPS, "steps": 6})
    )
    losses = [m["loss"] for m in metrics(run_dir, "train")]
    assert losses == pytest.approx([m["loss"] for m in metrics(reference, "train")], abs=1e-5)
    script = (run_dir / "slurm-attempt-1.sh").read_text()
    assert "srun --label" in script and "RANK=$SLURM_PROCID" in script
    log = on_slurm.run("jobs", "logs", job["id"]).stdout
    assert "0: " in log and "step 6/6" in log  # rank 0 speaks for the ranks; Slurm labels its lines


def test_a_job_slurm_holds_shows_slurms_reason_then_runs(on_slurm: Cli, slurm: Any, tmp_path: Path) -> None:
    # Another Slurm user holds every GPU: Shipyard admits the job, Slurm keeps it pending.
    blocker = slurm.slurm(
        "sbatch", "--parsable", "--nodes=2", "--gres=gpu:h100:2", "--ntasks-per-node=1",
        "--mem=500M", "--output=/dev/null", "--wrap=sleep 600",
    ).stdout.strip()  # fmt: skip
    job = submit(on_slurm, tmp_path, "held", 4, **ONE_GPU)
    # First "not considered yet" (Slurm: None), then, once its scheduler has looked, why it waits.
    held = on_slurm.wait_for(
        job["id"],
        lambda j: j["pending_code"] == "held_by_engine" and "(Slurm: None)" not in j["pending_reason"],
    )
    assert held["state"] == "running"
    assert "(Slurm: Resources)" in held["pending_reason"] or "(Slurm: Priority)" in held["pending_reason"]
    assert "(Slurm: " in on_slurm.run("jobs", "list").stdout
    # A job cancelled while Slurm holds it has nothing to checkpoint: its allocation is withdrawn.
    other = submit(on_slurm, tmp_path, "withdrawn", 4, **ONE_GPU)
    on_slurm.wait_for(other["id"], lambda j: j["pending_code"] == "held_by_engine")
    on_slurm.run("jobs", "cancel", other["id"])
    withdrawn = on_slurm.wait_for(other["id"], settled)
    assert withdrawn["state"] == "cancelled" and "before it started" in withdrawn["message"], withdrawn
    slurm.slurm("scancel", blocker)
    done = on_slurm.wait_for(job["id"], settled)
    assert done["state"] == "succeeded" and done["pending_reason"] is None


def test_cancel_checkpoints_through_scancel_and_the_job_resumes(on_slurm: Cli, tmp_path: Path) -> None:
    on_slurm.env["SHIPYARD_FAULTS"] = json.dumps({"attempts": [1], "slow_rank": 0, "slow_s": 0.3})
    spec = write_spec(tmp_path, training={**STEPS, "steps": 20}, resources={**ONE_GPU, "nodes": 2})
    job = on_slurm.json("jobs", "submit", str(spec))
    on_slurm.wait_for(job["id"], lambda j: j["step"] >= 3)
    on_slurm.run("jobs", "cancel", job["id"])
    stopped = on_slurm.wait_for(job["id"], settled)
    assert stopped["state"] == "cancelled", stopped
    (attempt,) = stopped["attempts"]
    assert attempt["exit_reason"] == "cancelled" and attempt["exit_code"] == 0  # every rank checkpointed
    step = int(stopped["message"].split("after step ")[1].split()[0])
    assert (on_slurm.home / "runs" / job["id"] / "checkpoints" / f"step_{step:06d}").is_dir()
    on_slurm.env.pop("SHIPYARD_FAULTS")
    resumed = json.loads(on_slurm.run("jobs", "submit", str(spec), "--resume", "--wait", "--json").stdout)
    assert resumed["state"] == "succeeded"
    assert f"steps {step}->20" in on_slurm.run("jobs", "logs", resumed["id"]).stdout


def test_a_node_set_down_requeues_the_job_which_resumes_on_the_other(
    on_slurm: Cli, slurm: Any, tmp_path: Path
) -> None:
    on_slurm.env["SHIPYARD_FAULTS"] = json.dumps({"attempts": [1], "slow_rank": 0, "slow_s": 0.3})
    spec = write_spec(
        tmp_path,
        training={**STEPS, "steps": 40},
        checkpoint={"interval": 2, "keep": 2},
        restarts={"backoff_s": 1},
        resources=ONE_GPU,
    )
    job = on_slurm.json("jobs", "submit", str(spec))
    running = on_slurm.wait_for(job["id"], lambda j: j["step"] >= 5)
    node = running["attempts"][0]["node"]
    try:
        slurm.set_state(node, "down", "failing GPU")
        done = on_slurm.wait_for(job["id"], settled, timeout=300)
    finally:
        slurm.set_state(node, "resume")
    assert done["state"] == "succeeded", done
    first, second = done["attempts"]
    assert first["exit_reason"] == "node_lost" and first["node"] == node
    assert second["node"] != node
    log = on_slurm.run("jobs", "logs", job["id"]).stdout
    resumed_from = int(log.rsplit("steps ", 1)[1].split("->")[0])
    assert resumed_from >= 2  # from the newest checkpoint, not from the start


def test_the_time_limit_warning_checkpoints_and_the_job_continues_in_a_new_allocation(
    on_slurm: Cli, tmp_path: Path
) -> None:
    # A site limit of two minutes; Slurm warns 80 s before it (the cancel grace): 40 s after the
    # start, time enough for a loaded machine to begin training before the warning comes.
    on_slurm.env.update({"SHIPYARD_SLURM_TIME_LIMIT_MIN": "2", "SHIPYARD_CANCEL_GRACE_S": "80"})
    on_slurm.env["SHIPYARD_FAULTS"] = json.dumps({"attempts": [1], "slow_rank": 0, "slow_s": 0.5})
    job = submit(on_slurm, tmp_path, "limited", 400, **ONE_GPU)
    limited = on_slurm.wait_for(job["id"], lambda j: len(j["attempts"]) >= 2, timeout=240)
    first = limited["attempts"][0]
    assert first["exit_reason"] == "time_limit", limited
    deadline = time.monotonic() + 120
    while "steps " not in (log := on_slurm.run("jobs", "logs", job["id"]).stdout):  # attempt 2's
        assert time.monotonic() < deadline, log
        time.sleep(2)
    step = int(log.rsplit("steps ", 1)[1].split("->")[0])
    assert step > 0  # the second allocation continued from the checkpoint the warning made
    on_slurm.run("jobs", "cancel", job["id"])
    on_slurm.wait_for(job["id"], settled)


def test_quotas_hold_across_slurm_nodes(on_slurm: Cli, tmp_path: Path) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text(
        "clusterQueues: [{name: team, nominal: {h100-sxm: 2, cpu: 4}}]\nlocalQueues: {default: team}\n"
    )
    on_slurm.run("queues", "apply", str(queues))
    on_slurm.env["SHIPYARD_FAULTS"] = IDLING
    whole_node = {**ONE_GPU, "devices": 2}
    first, second = (submit(on_slurm, tmp_path, f"q{i}", 5000, **whole_node) for i in range(2))
    on_slurm.wait_for(first["id"], lambda j: j["state"] == "running" and j["pending_code"] is None)
    waiting = on_slurm.wait_for(second["id"], lambda j: j["pending_code"] == "quota_exhausted")
    assert waiting["state"] == "queued"  # a node idle in Slurm, but the queue's quota is spent
    time.sleep(1)
    for job in (first, second):
        on_slurm.run("jobs", "cancel", job["id"])
        on_slurm.wait_for(job["id"], settled)
