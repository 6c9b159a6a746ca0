"""Shipyard on a real Ray cluster: a head and three nodes on loopback, each started with `shipyard
node start` from a home of its own as on separate machines, a SeaweedFS store every node reads,
jobs that span nodes.

The three nodes advertise ``h100-sxm`` devices this machine does not have
(``SHIPYARD_EMULATE_ACCELERATORS``, the seam for absent hardware): the scheduler, Ray's
accounting and the placement see H100s, and the ranks run on the CPU with gloo.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from shipyard.agent.outputs import keep_stored_only
from shipyard.errors import DependencyMissing
from shipyard.executors.base import StoredCheckpoint
from shipyard.schemas.launch import CHECKPOINT_MARKER
from shipyard.storage import config as storage_config
from tests.builders import SMALL_CORPUS, spec_dict, write_spec
from tests.conftest import Cli
from tests.integration.test_runtime import final_weights, metrics, run_runtime
from tests.support.checkpoints import checkpoint_tensors

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.slow]

NODES = ("n1", "n2", "n3")
STEPS = {"eval_interval": 0}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    pytest.importorskip("ray")
    pytest.importorskip("boto3")
    from tests.support.ray_cluster import NodeCluster
    from tests.support.seaweedfs import SeaweedCluster

    base = tmp_path_factory.mktemp("cluster")
    try:
        store = SeaweedCluster(base / "seaweedfs").start()
    except DependencyMissing as exc:
        pytest.skip(str(exc))
    ray_cluster = NodeCluster(base / "nodes")
    try:
        ray_cluster.start()
        for i, name in enumerate(NODES, start=1):
            ray_cluster.add(name, "h100-sxm", 2, rack=f"r{i}")
        yield ray_cluster, store
    finally:
        ray_cluster.stop()
        store.stop()


@pytest.fixture
def on_cluster(world: tuple[Any, Any], tmp_path: Path) -> Iterator[Cli]:
    """The CLI of a home whose server runs jobs on the cluster, with its store on SeaweedFS."""
    ray_cluster, store = world
    runner = Cli(tmp_path / "home")
    runner.env.update(ray_cluster.env())
    s3 = store.s3.model_copy(update={"prefix": f"{tmp_path.name}/"})
    storage_config.save(runner.home, storage_config.StorageConfig(backend="s3", s3=s3))
    yield runner
    runner.stop_agent()


def two_node_spec(directory: Path, parallelism: str = "ddp", **training: Any) -> Path:
    return write_spec(
        directory,
        training={**STEPS, "steps": 6, "parallelism": parallelism, **training},
        resources={"accelerator": "h100-sxm", "devices": 1, "nodes": 2, "cpus_per_device": 1},
    )


def one_process_reference(tmp_path: Path, parallelism: str = "ddp", **training: Any) -> Path:
    spec = spec_dict(training={**STEPS, "steps": 6, "parallelism": parallelism, **training})
    return run_runtime(tmp_path / "reference", tmp_path / "cache", spec)


def run_folder(cli: Cli, job_id: str) -> Path:
    return cli.home / "runs" / job_id


def stored_checkpoint(cli: Cli, job_id: str, step: int, into: Path) -> Path:
    """The job's checkpoint of ``step`` read back from the artifact store, once committed there."""
    name = f"jobs/{job_id}/checkpoint/step-{step}"
    deadline = time.monotonic() + 120
    while cli.run("storage", "stat", name, check=False).returncode != 0:
        assert time.monotonic() < deadline, f"{name} never reached the store"
        time.sleep(2)
    cli.run("storage", "get", name, str(into))
    return into


def test_nodes_lists_each_node_with_its_accelerators_labels_and_health(on_cluster: Cli) -> None:
    nodes = {n["id"]: n for n in on_cluster.json("nodes")}
    assert set(nodes) == {"head", *NODES}
    assert nodes["head"]["up"] and set(nodes["head"]["capacity"]) == {"cpu"}  # this machine's own
    for i, name in enumerate(NODES, start=1):
        node = nodes[name]
        assert node["up"] and node["capacity"]["h100-sxm"] == 2
        assert node["labels"]["rack"] == f"r{i}" and node["memory_gib"]["h100-sxm"] == 80
    assert "h100-sxm 0/2" in on_cluster.run("nodes").stdout


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_a_two_node_job_matches_one_process_with_the_same_global_batch(
    on_cluster: Cli, tmp_path: Path, parallelism: str
) -> None:
    job = on_cluster.json("jobs", "submit", str(two_node_spec(tmp_path, parallelism)))
    done = on_cluster.wait_for(job["id"], lambda j: j["state"] in ("succeeded", "failed"))
    assert done["state"] == "succeeded", on_cluster.run("jobs", "logs", job["id"]).stdout
    (attempt,) = done["attempts"]
    assert len(set(attempt["node"].split(","))) == 2  # one rank on each of two nodes
    ran = run_folder(on_cluster, job["id"])
    assert metrics(ran, "start")[0]["world_size"] == 2
    reference = one_process_reference(tmp_path, parallelism)
    losses = [m["loss"] for m in metrics(ran, "train")]
    assert losses == pytest.approx([m["loss"] for m in metrics(reference, "train")], abs=1e-5)
    # The final checkpoint as its nodes stored it: the agent's run folder keeps only its record.
    stored = stored_checkpoint(on_cluster, job["id"], 6, tmp_path / "stored")
    a, b = final_weights(reference), checkpoint_tensors(stored)
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-5), name
    log = on_cluster.run("jobs", "logs", job["id"]).stdout
    assert "[rank 0] step 6/6" in log
    model = on_cluster.json("models", "show", "tiny:1")
    assert model["model"] == "default/tiny:1"  # the export came back from the node and was published


def submit(cli: Cli, directory: Path, name: str, steps: int, **resources: Any) -> dict[str, Any]:
    spec = write_spec(directory, name, training={**STEPS, "steps": steps}, resources=resources)
    job: dict[str, Any] = cli.json("jobs", "submit", str(spec))
    return job


def cancel_and_wait(cli: Cli, job: dict[str, Any]) -> None:
    """Cancel, and wait until its ranks are gone (they would hold their nodes past the test)."""
    cli.run("jobs", "cancel", job["id"])
    cli.wait_for(job["id"], lambda j: j["state"] == "cancelled")


WHOLE_NODE = {"accelerator": "h100-sxm", "devices": 2, "cpus_per_device": 1}
IDLING = json.dumps({"slow_rank": 0, "slow_s": 0.5})
"""Injected into jobs that only hold nodes: they sleep through their steps instead of taking the
cores from the other jobs and tests."""


def test_a_gang_of_two_nodes_waits_with_its_reason_until_both_are_free(
    on_cluster: Cli, tmp_path: Path
) -> None:
    # In arrival order: under the default (shortest remaining first) the 4-step gang may preempt
    # a blocker, depending on how far apart the two started; this test is about the gang's wait.
    on_cluster.env.update({"SHIPYARD_POLICY": "fifo", "SHIPYARD_FAULTS": IDLING})
    blockers = [submit(on_cluster, tmp_path, f"block{i}", 5000, **WHOLE_NODE) for i in range(2)]
    for blocker in blockers:
        on_cluster.wait_for(blocker["id"], lambda j: j["state"] == "running")
    gang = submit(on_cluster, tmp_path, "gang", 4, **WHOLE_NODE, nodes=2)
    waiting = on_cluster.wait_for(gang["id"], lambda j: "needs 2 nodes" in (j["pending_reason"] or ""))
    assert waiting["state"] == "queued" and waiting["pending_code"] == "insufficient_devices"
    assert "1 of them free now" in waiting["pending_reason"]
    on_cluster.run("jobs", "cancel", blockers[0]["id"])
    done = on_cluster.wait_for(gang["id"], lambda j: j["state"] in ("succeeded", "failed"))
    assert done["state"] == "succeeded"
    cancel_and_wait(on_cluster, blockers[1])


def test_cancel_checkpoints_every_rank_and_the_job_resumes_on_the_cluster(
    on_cluster: Cli, tmp_path: Path
) -> None:
    # Its data is a dataset of the store: the nodes get it from the agent, not from a shared disk.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for n, pattern in enumerate(SMALL_CORPUS):
        for path in sorted(Path(pattern).parent.glob(Path(pattern).name)):
            shutil.copy(path, corpus / f"{n}-{path.name}")
    on_cluster.run("storage", "put", str(corpus), "datasets/code")
    spec = write_spec(
        tmp_path,
        data={"paths": ["store:datasets/code"], "tokenizer": {"vocab_size": 512}},
        training={**STEPS, "steps": 30, "parallelism": "fsdp"},
        resources={"accelerator": "h100-sxm", "devices": 1, "nodes": 2, "cpus_per_device": 1},
    )
    # The first attempt is slowed (rank 0, and so its peer, 0.3 s a step) so that it is still
    # running when cancelled, however fast the machine; the resumed ones run at full speed.
    on_cluster.env["SHIPYARD_FAULTS"] = json.dumps({"attempts": [1], "slow_rank": 0, "slow_s": 0.3})
    job = on_cluster.json("jobs", "submit", str(spec))
    on_cluster.wait_for(job["id"], lambda j: j["step"] >= 3)
    on_cluster.run("jobs", "cancel", job["id"])
    stopped = on_cluster.wait_for(job["id"], lambda j: j["state"] == "cancelled")
    (attempt,) = stopped["attempts"]
    # Every rank exited cleanly after the checkpoint (a killed or failed rank would show here).
    assert attempt["exit_reason"] == "cancelled" and attempt["exit_code"] == 0
    step = int(stopped["message"].split("after step ")[1].split()[0])
    # Each node wrote its own rank's shards into the store; the agent keeps only their record.
    record = run_folder(on_cluster, job["id"]) / "checkpoints" / f"step_{step:06d}"
    assert (record / "checkpoint.json").is_file() and not list(record.glob("*.distcp"))
    (tmp_path / "mine").mkdir()
    stored = stored_checkpoint(on_cluster, job["id"], step, tmp_path / "mine" / record.name)
    assert sorted(p.name for p in stored.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    resumed = json.loads(on_cluster.run("jobs", "submit", str(spec), "--resume", "--wait", "--json").stdout)
    assert resumed["state"] == "succeeded"
    assert f"steps {step}->30" in on_cluster.run("jobs", "logs", resumed["id"]).stdout
    # A folder of this machine is written into the store at the launch, for the nodes to resume
    # from; one whose files only the store holds, its record lost, fails its job alone.
    orphan = tmp_path / "orphan" / record.name
    keep_stored_only(
        orphan.parent, StoredCheckpoint(orphan.name, (), (record / CHECKPOINT_MARKER).read_text())
    )
    lost = on_cluster.json("jobs", "submit", str(spec), "--resume-from", str(orphan))
    from_mine = on_cluster.json("jobs", "submit", str(spec), "--resume-from", str(stored))
    failed = on_cluster.wait_for(lost["id"], lambda j: j["state"] not in ("queued", "running"))
    assert failed["state"] == "failed" and "its record was lost" in failed["message"], failed
    done = on_cluster.wait_for(from_mine["id"], lambda j: j["state"] not in ("queued", "running"))
    assert done["state"] == "succeeded", done
    assert f"steps {step}->30" in on_cluster.run("jobs", "logs", from_mine["id"]).stdout


def test_quotas_hold_across_nodes(on_cluster: Cli, tmp_path: Path) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text(
        "clusterQueues: [{name: team, nominal: {h100-sxm: 2, cpu: 8}}]\nlocalQueues: {default: team}\n"
    )
    on_cluster.run("queues", "apply", str(queues))
    on_cluster.env["SHIPYARD_FAULTS"] = IDLING
    first, second = (submit(on_cluster, tmp_path, f"q{i}", 5000, **WHOLE_NODE) for i in range(2))
    on_cluster.wait_for(first["id"], lambda j: j["state"] == "running")
    waiting = on_cluster.wait_for(second["id"], lambda j: j["pending_code"] == "quota_exhausted")
    assert waiting["state"] == "queued"  # two nodes idle, but the queue's quota is spent
    for job in (first, second):
        cancel_and_wait(on_cluster, job)


def test_a_job_larger_than_any_node_is_refused_naming_the_nodes(on_cluster: Cli, tmp_path: Path) -> None:
    wide = write_spec(tmp_path, "wide", resources={"accelerator": "h100-sxm", "devices": 4})
    done = on_cluster.run("jobs", "submit", str(wide), check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "n1 has 2, n2 has 2, n3 has 2" in done.stderr and "resources.devices" in done.stderr
    many = write_spec(tmp_path, "many", resources={"accelerator": "h100-sxm", "devices": 1, "nodes": 5})
    done = on_cluster.run("jobs", "submit", str(many), check=False)
    assert done.returncode == 1 and "needs 5 node(s)" in done.stderr


def test_an_elastic_job_over_nodes_shrinks_for_a_gang_on_every_node_and_grows_back_with_the_same_losses(
    on_cluster: Cli, tmp_path: Path
) -> None:
    # Rank 0 sleeps 0.05 s a sample (timing only: a micro-batch of 1, each forward pass slowed):
    # 1.6 s a step alone, 0.4 s on four ranks, like devices that scale. The job still runs when
    # the gang arrives, and growing back pays for its restart, on any machine.
    faults = {"attempts": [1, 2, 3, 4, 5], "slow_rank": 0, "slow_s": 0.05}
    on_cluster.env.update(
        {"SHIPYARD_POLICY": "priority", "SHIPYARD_ROUND_S": "1", "SHIPYARD_RESIZE_COST_S": "1",
         "SHIPYARD_FAULTS": json.dumps(faults)}
    )  # fmt: skip
    training = {**STEPS, "steps": 100, "micro_batch_size": 1}
    # 1 to 6 devices over 1 to 3 nodes; the step's 32 samples split evenly over 1, 2 and 4 ranks.
    elastic = {
        "accelerator": "h100-sxm",
        "devices": {"min": 1, "max": 2},
        "nodes": {"min": 1, "max": 3},
        "cpus_per_device": 1,
    }
    spec = write_spec(tmp_path, "grows", training=training, checkpoint={"interval": 1000}, resources=elastic)
    job = on_cluster.json("jobs", "submit", str(spec))
    on_cluster.wait_for(job["id"], lambda j: j["state"] == "running" and j["step"] >= 5)
    [first] = on_cluster.json("jobs", "show", job["id"])["attempts"]
    assert first["world_size"] == 4 and len(first["node"].split(",")) == 2  # alone: two whole nodes

    # One device on each of the three nodes: it fits only if the elastic job gives one back.
    gang = write_spec(
        tmp_path, "gang", priority=5, training={**STEPS, "steps": 10, "global_batch_tokens": 768},
        resources={"accelerator": "h100-sxm", "devices": 1, "nodes": 3, "cpus_per_device": 1},
    )  # fmt: skip
    urgent = on_cluster.json("jobs", "submit", str(gang))
    assert on_cluster.wait_for(urgent["id"], lambda j: j["state"] not in ("queued", "running"))["state"] == (
        "succeeded"
    )
    done = on_cluster.wait_for(job["id"], lambda j: j["state"] not in ("queued", "running"), timeout=600)
    assert done["state"] == "succeeded", on_cluster.run("jobs", "logs", job["id"]).stdout
    sizes = [a["world_size"] for a in done["attempts"]]
    reasons = [a["exit_reason"] for a in done["attempts"]]
    assert sizes[:2] == [4, 1] and sizes[-1] == 4 and reasons[0] == "resized", (sizes, reasons)
    said = [a["message"] for a in done["attempts"] if a["exit_reason"] == "resized"]
    assert said[0].startswith(f"shrunk 4→1 h100-sxm: its devices went to {urgent['id']}"), said

    # Every step's loss is that of one process at the spec's global batch (checkpoints read back
    # from the store at each resize).
    losses = {m["step"]: m["loss"] for m in metrics(run_folder(on_cluster, job["id"]), "train")}
    reference = run_runtime(tmp_path / "reference", tmp_path / "cache", spec_dict(training=training))
    assert sorted(losses) == list(range(1, 101))
    assert losses == pytest.approx({m["step"]: m["loss"] for m in metrics(reference, "train")}, rel=1e-3)


def test_a_lost_node_requeues_the_job_which_resumes_elsewhere_with_the_same_weights(
    world: tuple[Any, Any], on_cluster: Cli, tmp_path: Path
) -> None:
    ray_cluster, _ = world
    interval = 10
    # Two replicas, as the reference below: the same sums in the same order, so the weights after
    # the loss and the resume are those of a run that lost nothing (a one-process reference drifts
    # by ~1e-5 over 200 steps from the order of the gradient sums alone).
    training = {**STEPS, "steps": 80, "parallelism": "ddp"}
    spec = write_spec(
        tmp_path,
        training=training,
        checkpoint={"interval": interval, "keep": 2},
        resources={"accelerator": "h100-sxm", "devices": 1, "nodes": 2, "cpus_per_device": 1},
    )
    # The first attempt is slowed (0.25 s a step, 20 s in all) so that it still runs when its node
    # is lost, on any machine (on a loaded one it ended before the agent held step 20); the resume
    # is at speed.
    on_cluster.env["SHIPYARD_FAULTS"] = json.dumps({"attempts": [1], "slow_rank": 0, "slow_s": 0.25})
    job = on_cluster.json("jobs", "submit", str(spec))
    # Killed once the agent holds the checkpoint of step 20, every node's part of it (they are
    # written in the background, each node its own).
    running = on_cluster.wait_for(
        job["id"],
        lambda j: any(a["kind"] == "checkpoint" and a["step"] >= 2 * interval for a in j["artifacts"]),
    )
    lost = running["attempts"][0]["node"].split(",")[1]
    killed_at = running["step"]
    ray_cluster.kill(lost)
    try:
        done = on_cluster.wait_for(job["id"], lambda j: j["state"] in ("succeeded", "failed"), timeout=300)
        assert done["state"] == "succeeded", on_cluster.run("jobs", "logs", job["id"]).stdout
        first, second = done["attempts"]
        assert first["exit_reason"] == "node_lost" and lost not in second["node"].split(",")
        log = on_cluster.run("jobs", "logs", job["id"]).stdout
        resumed_at = int(log.split("at step ")[-1].split()[0])
        assert killed_at - resumed_at <= interval  # nothing lost beyond the checkpoint interval
        nodes = {n["id"]: n for n in on_cluster.json("nodes")}
        assert nodes[lost]["up"] is False
        # A job that only the lost node's return could run is taken, and waits for it saying so.
        every_node = write_spec(
            tmp_path, "every-node", training={**STEPS, "global_batch_tokens": 768},
            resources={"accelerator": "h100-sxm", "devices": 1, "nodes": 3, "cpus_per_device": 1},
        )  # fmt: skip
        waiting = on_cluster.json("jobs", "submit", str(every_node))
        held = on_cluster.wait_for(waiting["id"], lambda j: j["pending_code"] == "nodes_down")
        assert held["state"] == "queued" and f"node {lost} " in held["pending_reason"]
        cancel_and_wait(on_cluster, waiting)
        reference = run_runtime(
            tmp_path / "reference", tmp_path / "cache",
            spec_dict(training=training, checkpoint={"interval": interval, "keep": 2}), world=2,
        )  # fmt: skip
        # The final weights as the store holds them: the nodes wrote them, the agent never did.
        stored = stored_checkpoint(on_cluster, job["id"], training["steps"], tmp_path / "stored")
        a, b = final_weights(reference), checkpoint_tensors(stored)
        for name in a:
            assert torch.allclose(a[name], b[name], atol=1e-5), name
    finally:
        ray_cluster.add(lost, "h100-sxm", 2, rack="back")


def test_an_address_where_no_ray_answers_is_a_clear_error(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home")
    storage_config.save(
        cli.home,
        storage_config.StorageConfig(
            backend="s3", s3=storage_config.S3Config(endpoint_url="http://127.0.0.1:9", bucket="b")
        ),
    )
    cli.env.update({"SHIPYARD_EXECUTOR": "ray", "SHIPYARD_RAY_ADDRESS": "127.0.0.1:9"})
    done = cli.run("nodes", check=False, timeout=120)  # refused at once, not after Ray's retries
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "no Ray cluster answers at 127.0.0.1:9" in done.stderr
    assert "shipyard node start --head" in done.stderr


def test_a_store_only_this_machine_sees_is_refused_in_cluster_mode(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home")
    cli.env.update({"SHIPYARD_EXECUTOR": "ray", "SHIPYARD_RAY_ADDRESS": "127.0.0.1:9"})
    done = cli.run("nodes", check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "needs an artifact store every node sees" in done.stderr and "backend: s3" in done.stderr
