"""The training runtime launched as executors launch it: ``python -m shipyard.training`` and
``torchrun -m shipyard.training`` (gloo on CPU)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from shipyard.executors.local import training_command
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.schemas.launch import LaunchPlan
from tests.builders import spec_dict
from tests.support.checkpoints import checkpoint_tensors, final_checkpoint

pytestmark = pytest.mark.integration


def run_runtime(run_dir: Path, cache: Path, spec: dict[str, Any], **launch: Any) -> Path:
    """Run the runtime as an executor would (``launch_command``'s options) and wait for it."""
    command = launch_command(run_dir, cache, spec, **launch)
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env={"OMP_NUM_THREADS": "1", **_env()}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return run_dir


def launch_command(
    run_dir: Path,
    cache: Path,
    spec: dict[str, Any],
    *,
    world: int = 1,
    stop_at: int | None = None,
    resume_from: Path | None = None,
) -> list[str]:
    """Write the launch plan and return the command an executor would run for it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    LaunchPlan(
        job_id=run_dir.name,
        attempt=1,
        spec=validate_job_spec(spec),
        run_dir=str(run_dir),
        cache_dir=str(cache),
        accelerator_type="cpu",
        torch_device="cpu",
        world_size=world,
        threads_per_process=1,
        peak_tflops_bf16=0.1,
        peak_tflops_fp32=0.05,
        stop_at_step=stop_at,
        resume_from=str(resume_from) if resume_from else None,
    ).write(run_dir)
    return training_command(world, run_dir)


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def metrics(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return checkpoint_tensors(final_checkpoint(run_dir))


def test_a_resumed_run_ends_with_identical_weights(tmp_path: Path) -> None:
    spec = spec_dict(training={"steps": 8, "eval_interval": 0})
    straight = run_runtime(tmp_path / "straight", tmp_path / "cache", spec)
    stopped = run_runtime(tmp_path / "stopped", tmp_path / "cache", spec, stop_at=3)
    result = json.loads((stopped / "result.json").read_text())
    assert result["status"] == "cancelled" and result["step"] == 3
    resumed = run_runtime(
        tmp_path / "resumed", tmp_path / "cache", spec, resume_from=Path(result["checkpoint"])
    )
    a, b = final_weights(straight), final_weights(resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert [m["loss"] for m in metrics(resumed, "train")] == [m["loss"] for m in metrics(straight, "train")][
        3:
    ]


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_two_processes_match_one_with_the_same_global_batch(tmp_path: Path, parallelism: str) -> None:
    spec = spec_dict(training={"steps": 6, "eval_interval": 0, "parallelism": parallelism})
    one = run_runtime(tmp_path / "one", tmp_path / "cache", spec)
    two = run_runtime(
        tmp_path / "two",
        tmp_path / "cache",
        {**spec, "resources": {"accelerator": "cpu", "devices": 2}},
        world=2,
    )
    assert metrics(two, "start")[0]["world_size"] == 2
    losses_one = [m["loss"] for m in metrics(one, "train")]
    losses_two = [m["loss"] for m in metrics(two, "train")]
    assert losses_two == pytest.approx(losses_one, abs=1e-5)
    assert metrics(two, "eval")[-1]["loss"] == pytest.approx(metrics(one, "eval")[-1]["loss"], abs=1e-5)
    a, b = final_weights(one), final_weights(two)
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-5), name


def test_the_hugging_face_export_loads_in_transformers_with_the_same_logits(tmp_path: Path) -> None:
    from transformers import AutoTokenizer, LlamaForCausalLM

    from shipyard.training import hf

    run = run_runtime(tmp_path / "run", tmp_path / "cache", spec_dict())
    export = run / "export"
    theirs = LlamaForCausalLM.from_pretrained(export, local_files_only=True).eval()
    ours = hf.load_model(export).eval()
    tokenizer = AutoTokenizer.from_pretrained(export, local_files_only=True)
    ids = tokenizer("def encode(self, obj):\n    return json.dumps(obj)", return_tensors="pt").input_ids
    assert ids.shape[1] > 5
    with torch.no_grad():
        assert torch.allclose(theirs(ids).logits, ours(ids), atol=1e-5)
    assert tokenizer.decode(ids[0]) == "def encode(self, obj):\n    return json.dumps(obj)"
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True


def test_fine_tuning_starts_from_the_exported_weights(tmp_path: Path) -> None:
    base = run_runtime(tmp_path / "base", tmp_path / "cache", spec_dict(training={"steps": 20}))
    export = base / "export"
    tuned = run_runtime(
        tmp_path / "tuned",
        tmp_path / "cache",
        spec_dict(
            model={"preset": None, "path": str(export)},
            data={"tokenizer": {"path": str(export)}},
            training={"steps": 2, "seed": 7},
        ),
    )
    base_end = metrics(base, "eval")[-1]["loss"]
    tuned_start = metrics(tuned, "eval")[0]["loss"]
    assert tuned_start == pytest.approx(base_end, abs=1e-4)  # same weights, same held-out data


def _losses(run_dir: Path) -> list[float]:
    return [m["loss"] for m in metrics(run_dir, "train")]


def _with_layout(spec: dict[str, Any], devices: int, parallelism: object) -> dict[str, Any]:
    return {
        **spec,
        "training": {**spec["training"], "parallelism": parallelism},
        "resources": {**spec["resources"], "devices": devices},
    }


@pytest.mark.slow
def test_tensor_parallel_layouts_train_as_one_process_and_reshard_their_checkpoints(tmp_path: Path) -> None:
    """tp=2 x FSDP2 over 4 processes trains as one process does; its checkpoint, written by the 4
    ranks, resumes with tp=2 on 2 processes and on a single one; the export, gathered from the
    shards, gives the single process's logits in transformers."""
    from transformers import LlamaForCausalLM

    cache = tmp_path / "cache"
    spec = spec_dict(training={"steps": 8, "eval_interval": 4}, checkpoint={"interval": 4, "keep": 2})
    one = run_runtime(tmp_path / "one", cache, spec)
    mesh = run_runtime(tmp_path / "mesh", cache, _with_layout(spec, 4, {"tp": 2, "dp_shard": 2}), world=4)
    assert _losses(mesh) == pytest.approx(_losses(one), abs=1e-5)
    assert [m["loss"] for m in metrics(mesh, "eval")] == pytest.approx(
        [m["loss"] for m in metrics(one, "eval")], abs=1e-5
    )

    at_4 = mesh / "checkpoints" / "step_000004"
    assert len(list(at_4.glob("*.distcp"))) == 4  # every rank wrote its own shards
    tp_2 = run_runtime(tmp_path / "tp2", cache, _with_layout(spec, 2, {"tp": 2}), world=2, resume_from=at_4)
    single = run_runtime(tmp_path / "single", cache, spec, resume_from=at_4)
    expected = final_weights(one)
    for resumed in (tp_2, single):
        assert metrics(resumed, "resume")[0]["step"] == 4
        assert _losses(resumed) == pytest.approx(_losses(one)[4:], abs=1e-5)
        weights = final_weights(resumed)
        assert weights.keys() == expected.keys()
        for name in expected:
            assert torch.allclose(weights[name], expected[name], atol=1e-5), name

    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = [
            LlamaForCausalLM.from_pretrained(run / "export", local_files_only=True).eval()(ids).logits
            for run in (one, mesh)
        ]
    assert torch.allclose(logits[0], logits[1], atol=1e-4)


def test_a_checkpoint_killed_mid_write_never_becomes_latest(tmp_path: Path) -> None:
    """Step 4's checkpoint is written in the background and never finishes (its index is never
    written) while training goes on; the process is killed then. Step 2's stays the latest, no
    folder of step 4 appears, and the job resumes from step 2."""
    import os
    import signal
    import time

    from shipyard.schemas.launch import latest_checkpoint

    spec = spec_dict(training={"steps": 40, "eval_interval": 0}, checkpoint={"interval": 2, "keep": 5})
    run_dir = tmp_path / "run"
    command = launch_command(run_dir, tmp_path / "cache", spec)
    env = {**_env(), "OMP_NUM_THREADS": "1", "SHIPYARD_FAULTS": json.dumps({"stall_checkpoint_at_step": 4})}
    log = tmp_path / "attempt.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    staging = run_dir / "checkpoints" / "step_000004.tmp"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            trained = metrics(run_dir, "train") if (run_dir / "metrics.jsonl").exists() else []
            if list(staging.glob("*.distcp")) and any(m["step"] >= 5 for m in trained):
                break  # the shards are on disk, their index is not, and training went on
            time.sleep(0.2)
        assert process.poll() is None, log.read_text()
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    checkpoints = run_dir / "checkpoints"
    assert not (staging / ".metadata").exists()
    assert (checkpoints / "latest").read_text().strip() == "step_000002"
    assert latest_checkpoint(checkpoints) == checkpoints / "step_000002"
    assert not (checkpoints / "step_000004").exists()
    resumed = run_runtime(
        tmp_path / "resumed",
        tmp_path / "cache",
        {**spec, "training": {**spec["training"], "steps": 4}},
        resume_from=checkpoints / "step_000002",
    )
    assert metrics(resumed, "resume")[0]["step"] == 2
    assert [m["step"] for m in metrics(resumed, "train")] == [3, 4]


def test_adam_moments_in_bf16_are_kept_in_bf16_and_resume_exactly(tmp_path: Path) -> None:
    spec = spec_dict(
        training={"steps": 8, "eval_interval": 0, "optimizer": {"lr": 0.003, "state_dtype": "bf16"}},
        checkpoint={"interval": 4, "keep": 2},
    )
    straight = run_runtime(tmp_path / "straight", tmp_path / "cache", spec)
    at_4 = straight / "checkpoints" / "step_000004"
    moments = checkpoint_tensors(at_4, "optimizer")
    assert {t.dtype for name, t in moments.items() if name.endswith(("exp_avg", "exp_avg_sq"))} == {
        torch.bfloat16
    }
    resumed = run_runtime(tmp_path / "resumed", tmp_path / "cache", spec, resume_from=at_4)
    a, b = final_weights(straight), final_weights(resumed)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert _losses(resumed) == _losses(straight)[4:]
