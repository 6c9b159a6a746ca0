"""Runs on a GPU node only: the same runtime on CUDA (bf16 autocast, NCCL with two GPUs), and a job
placed on the GPU by the agent, with the node's vendor utilization recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from shipyard.agent.telemetry import cluster_metrics
from shipyard.hardware import discover
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.schemas.launch import LaunchPlan
from shipyard.services.context import open_context
from shipyard.settings import Settings
from tests.builders import spec_dict, write_spec
from tests.conftest import Cli

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
]


def launch(run_dir: Path, world: int, **training: object) -> dict[str, object]:
    import subprocess
    import sys

    gpu = next(d for d in discover() if d.accelerator_type != "cpu")
    spec = spec_dict(
        training={"precision": "auto", **training},
        resources={"accelerator": gpu.accelerator_type, "devices": world},
    )
    run_dir.mkdir(parents=True)
    LaunchPlan(
        job_id="gpu",
        attempt=1,
        spec=validate_job_spec(spec),
        run_dir=str(run_dir),
        cache_dir=str(run_dir / "cache"),
        accelerator_type=gpu.accelerator_type,
        torch_device="cuda",
        world_size=world,
        threads_per_process=2,
        peak_tflops_bf16=gpu.peak_bf16_tflops,
        peak_tflops_fp32=gpu.peak_fp32_tflops,
    ).write(run_dir)
    module = ["-m", "shipyard.training", str(run_dir)]
    if world > 1:
        module = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", *module]
    done = subprocess.run([sys.executable, *module], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((run_dir / "result.json").read_text())  # type: ignore[no-any-return]


def test_a_job_trains_on_one_gpu_with_mixed_precision(tmp_path: Path) -> None:
    result = launch(tmp_path / "one", world=1)
    assert result["status"] == "completed"
    start = json.loads((tmp_path / "one" / "metrics.jsonl").read_text().splitlines()[0])
    assert start["precision"] == ("bf16" if torch.cuda.is_bf16_supported() else "fp16")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs for NCCL")
def test_two_gpus_train_with_nccl(tmp_path: Path) -> None:
    assert launch(tmp_path / "two", world=2)["status"] == "completed"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs for tensor parallelism")
def test_two_gpus_train_tensor_parallel_with_compiled_blocks_and_checkpointed_activations(
    tmp_path: Path,
) -> None:
    result = launch(
        tmp_path / "tp", world=2, parallelism={"tp": 2}, activation_checkpointing="full", compile=True
    )
    assert result["status"] == "completed"


def test_blocks_compile_on_the_gpu_by_default_and_the_chunked_loss_matches_cross_entropy(
    tmp_path: Path,
) -> None:
    from shipyard.training.loss import linear_cross_entropy

    result = launch(tmp_path / "compiled", world=1, activation_checkpointing="selective")
    assert result["status"] == "completed"
    log = (tmp_path / "compiled" / "metrics.jsonl").read_text()
    assert '"kind": "train"' in log
    hidden = torch.randn(4096, 512, device="cuda", requires_grad=True)
    weight = torch.randn(32000, 512, device="cuda", requires_grad=True)
    targets = torch.randint(0, 32000, (4096,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        expected = torch.nn.functional.cross_entropy((hidden @ weight.t()).float(), targets)
        ours = linear_cross_entropy(hidden, weight, targets, chunk=1000)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-3)


def test_the_agent_places_a_job_on_the_gpu_and_records_its_utilization(cli: Cli, tmp_path: Path) -> None:
    gpu = next(d for d in cli.json("devices") if d["accelerator_type"] != "cpu")
    spec = write_spec(
        tmp_path,
        "on-gpu",
        training={"precision": "auto"},
        resources={"accelerator": gpu["accelerator_type"], "devices": 1},
    )
    job = json.loads(cli.run("jobs", "submit", str(spec), "--wait", "--json").stdout)
    assert job["state"] == "succeeded", job["message"]
    assert cli.json("jobs", "show", job["id"])["attempts"][-1]["accelerator_type"] == gpu["accelerator_type"]
    settings = Settings(home=cli.home, db_url=f"sqlite:///{cli.home / 'shipyard.db'}")
    ctx = open_context(settings)
    try:
        (agent,) = cluster_metrics(ctx).agents
    finally:
        ctx.close()
    # NVML's busy fraction of the GPU the agent saw on its last pass (the vendor query is real here).
    assert 0.0 <= agent["utilization"][str(gpu["index"])] <= 1.0
    assert agent["devices"][gpu["accelerator_type"]]["total"] >= 1


def test_qlora_fine_tunes_a_4_bit_base_on_the_gpu(cli: Cli, tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes", reason="QLoRA needs bitsandbytes: pip install 'shipyard[qlora]'")
    from tests.integration.test_finetune import finetune_spec, submit
    from tests.support import tiny_models

    gpu = next(d for d in discover() if d.accelerator_type != "cpu")
    base = tiny_models.build(tmp_path / "base", "qwen2", hidden_size=256, intermediate_size=704)
    data = tiny_models.write_jsonl(tmp_path / "chat.jsonl", tiny_models.chat_records(240))
    spec = finetune_spec(base, data, "chat", "qlora-gpu", method="qlora", merge=True)
    spec["training"]["precision"] = "auto"
    spec["resources"] = {"accelerator": gpu.accelerator_type, "devices": 1}
    job = submit(cli, tmp_path, spec)
    assert job["state"] == "succeeded", job
    detail = cli.json("jobs", "show", job["id"])
    assert detail["summary"]["eval_loss_end"] < detail["summary"]["eval_loss_start"]
    assert cli.json("models", "show", "qlora-gpu:1")["method"] == "qlora"
