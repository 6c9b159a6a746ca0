"""The training runtime launched as executors launch it: ``python -m shipyard.training`` and
``torchrun -m shipyard.training`` (gloo on CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from shipyard.schemas.jobspec import validate_job_spec
from shipyard.schemas.launch import LaunchPlan
from tests.builders import spec_dict

pytestmark = pytest.mark.integration


def run_runtime(
    run_dir: Path,
    cache: Path,
    spec: dict[str, Any],
    *,
    world: int = 1,
    stop_at: int | None = None,
    resume_from: Path | None = None,
) -> Path:
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
    if world == 1:
        command = [sys.executable, "-m", "shipyard.training", str(run_dir)]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={world}",
            "-m",
            "shipyard.training",
            str(run_dir),
        ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env={"OMP_NUM_THREADS": "1", **_env()}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return run_dir


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def metrics(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    result = json.loads((run_dir / "result.json").read_text())
    state = torch.load(Path(result["checkpoint"]) / "state.pt", weights_only=False)
    return state["model"]  # type: ignore[no-any-return]


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
