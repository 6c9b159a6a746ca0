"""Reading Slurm's answers (``scontrol --oneliner``, host lists, GRES, states, reasons) and what
the Slurm executor asks ``sbatch`` for. The text is as Slurm 22.05 prints it; the commands
themselves run in ``tests/integration/test_slurm.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shipyard.errors import ExecutorError
from shipyard.executors.base import Placement
from shipyard.executors.slurm import SlurmExecutor
from shipyard.executors.slurm_batch import SlurmQueue, batch_script, parse_queues
from shipyard.executors.slurm_records import (
    Gres,
    exit_code,
    expand_hostlist,
    node_state,
    oneliner_records,
    parse_gpus,
    pending_words,
)
from shipyard.settings import Settings

NODE = (
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=32 CPUAlloc=16 CPUEfctv=64 CPUTot=64 "
    "AvailableFeatures=rack=r1,ib ActiveFeatures=rack=r1,ib Gres=gpu:a100:8(S:0-1) NodeAddr=10.0.0.1 "
    "NodeHostName=gpu01 OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian RealMemory=515000 "
    "State=MIXED+DRAIN Partitions=gpu,debug Reason=bad dimm [root@2026-12-01T10:00:00]"
)


def test_a_oneliner_record_keeps_values_with_spaces_whole() -> None:
    (record,) = oneliner_records(NODE)
    assert record["OS"] == "Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian"
    assert record["AvailableFeatures"] == "rack=r1,ib" and record["Gres"] == "gpu:a100:8(S:0-1)"
    assert record["Reason"] == "bad dimm [root@2026-12-01T10:00:00]" and record["CPUTot"] == "64"


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("gpu[01-02,07],login", ["gpu01", "gpu02", "gpu07", "login"]),
        ("a1,b[9-10]-ib", ["a1", "b9-ib", "b10-ib"]),
        ("", []),
        ("(null)", []),
    ],
)
def test_host_lists_expand_as_slurm_writes_them(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


def test_gpus_are_read_from_gres_whatever_else_the_node_has() -> None:
    assert parse_gpus("gpu:h100:4(S:0-1),nic:mlx5:2") == [Gres("h100", 4)]
    assert parse_gpus("gpu:2,gpu:a100:1") == [Gres("", 2), Gres("a100", 1)]
    assert parse_gpus("(null)") == []


@pytest.mark.parametrize(
    ("state", "fit"),
    [("IDLE", True), ("MIXED", True), ("ALLOCATED", True), ("DOWN+NOT_RESPONDING", False),
     ("IDLE+DRAIN", False), ("MIXED+DRAIN", False), ("DOWN*", False), ("IDLE+COMPLETING", True)],
)  # fmt: skip
def test_only_nodes_fit_for_work_take_new_allocations(state: str, fit: bool) -> None:
    assert node_state(state) == (state.lower(), fit)


def test_exit_codes_and_pending_reasons_read_in_shipyards_words() -> None:
    assert exit_code("1:0") == (1, None) and exit_code("0:9") == (0, 9)
    assert pending_words("Resources") == "Slurm waits for nodes with enough free resources (Slurm: Resources)"
    assert "limit on GPUs per user" in pending_words("QOSMaxGRESPerUser")
    assert pending_words("SomethingNew") == "Slurm holds it in its queue (Slurm: SomethingNew)"


def test_queues_map_onto_partitions_accounts_and_qos() -> None:
    queues = parse_queues("default=gpu,research=gpu:lab-a:high,*=debug")
    assert queues == {
        "default": SlurmQueue("gpu"),
        "research": SlurmQueue("gpu", "lab-a", "high"),
        "*": SlurmQueue("debug"),
    }
    with pytest.raises(ExecutorError, match="QUEUE=PARTITION"):
        parse_queues("default")


def settings(tmp_path: Path, **slurm: object) -> Settings:
    return Settings(home=tmp_path, db_url="sqlite://", executor="slurm", **slurm)  # type: ignore[arg-type]


def test_a_gres_mapping_to_a_type_the_catalog_lacks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ExecutorError, match="not in the catalog"):
        SlurmExecutor(settings(tmp_path, slurm_gres_types="a100=a100-999gb"))
    with pytest.raises(ExecutorError, match="GRES_TYPE=CATALOG_TYPE"):
        SlurmExecutor(settings(tmp_path, slurm_gres_types="a100"))


def test_an_allocation_asks_for_gres_by_the_sites_name_its_queue_and_a_time_limit(tmp_path: Path) -> None:
    executor = SlurmExecutor(
        settings(tmp_path, slurm_gres_types="a100=a100-80gb", slurm_queues="*=gpu:lab:normal")
    )
    executor._read = (float("inf"), [])  # no Slurm to ask: the options without a node's memory
    run_dir = tmp_path / "runs" / "j1"
    run_dir.mkdir(parents=True)
    plan = {"job_id": "j1", "attempt": 2, "spec": {"queue": "default"}, "expected_s": 3600.0}
    (run_dir / "launch.json").write_text(json.dumps(plan))
    placement = Placement(
        node="gpu01", peers=("gpu02",), accelerator_type="a100-80gb", torch_device="cuda", device_ids=(),
        core_ids=(), threads_per_process=8, world_size=16, peak_tflops_bf16=312, peak_tflops_fp32=19.5,
    )  # fmt: skip
    options = executor.sbatch_options(placement, run_dir, run_dir / "logs" / "attempt-2.log", plan)
    assert "--job-name=shipyard-j1.2" in options and "--nodes=2" in options
    assert "--ntasks-per-node=8" in options and "--gres=gpu:a100:8" in options
    assert {"--partition=gpu", "--account=lab", "--qos=normal", "--no-requeue"} <= set(options)
    assert "--time=100" in options  # 60 min planned x 1.5 + 10 min
    assert "--signal=B:USR2@60" in options  # the cancel grace before the limit
    script = batch_script(placement, run_dir, 2)
    assert "--ntasks-per-node=8" in script and "CUDA_VISIBLE_DEVICES" not in script
    assert "scancel --signal=TERM" in script and "trap" in script
