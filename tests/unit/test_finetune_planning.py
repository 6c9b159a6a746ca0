"""The planner at submit for fine-tuning: a job that fits nowhere is refused with the lighter
method that would fit. Only config.json is read, so a 7 B shape needs no weights; the node's
GPU is a seam (a device advertising an RTX 4090), as this machine has none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shipyard.errors import Unschedulable
from shipyard.executors.base import NodeInventory
from shipyard.hardware import Device
from shipyard.hardware.catalog import catalog
from shipyard.schemas.estimate import Estimate
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.services.estimates.estimates import estimate_job
from tests.builders import spec_dict

QWEN2_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,  # as Qwen2.5-7B's config.json says (left out, it would be tied)
}


def _spec(folder: Path, method: str, accelerator: str) -> object:
    return validate_job_spec(
        spec_dict(
            model={"preset": None, "path": str(folder)},
            finetune={"method": method},
            training={"steps": 10, "precision": "bf16", "micro_batch_size": 1, "seq_len": 512,
                      "global_batch_tokens": 512},
            resources={"accelerator": accelerator, "devices": 1},
        )
    )  # fmt: skip


def test_full_fine_tuning_that_fits_nowhere_names_the_methods_that_would(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_7B))
    rtx = catalog()["rtx-4090"]
    gpu = Device(
        accelerator_type="rtx-4090", index=0, name="NVIDIA GeForce RTX 4090", vendor="nvidia",
        memory_gib=rtx.memory_gib, peak_bf16_tflops=rtx.bf16_tflops, peak_fp32_tflops=82.6,
    )  # fmt: skip
    node = [NodeInventory(id="node", devices=(gpu,))]
    with pytest.raises(Unschedulable) as refused:
        estimate_job(_spec(tmp_path, "full", "rtx-4090"), node, catalog())  # type: ignore[arg-type]
    message, hint = refused.value.message, refused.value.hint or ""
    assert message.startswith("full fine-tuning of 7.6 B parameters needs")
    assert "lora fits in" in hint and "on rtx-4090" in hint and "qlora fits in" in hint
    lora = estimate_job(_spec(tmp_path, "lora", "rtx-4090"), node, catalog())  # type: ignore[arg-type]
    qlora = estimate_job(_spec(tmp_path, "qlora", "rtx-4090"), node, catalog())  # type: ignore[arg-type]
    assert qlora is not None and lora is not None
    assert qlora.memory_gib_per_device < lora.memory_gib_per_device < rtx.memory_gib


def test_full_dpo_counts_its_reference_copy_and_lora_dpo_none(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_7B))
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    big = Device(
        accelerator_type="cpu", index=0, name="cpu", vendor="cpu",
        memory_gib=4096.0, peak_bf16_tflops=1.0, peak_fp32_tflops=1.0,
    )  # fmt: skip
    cpu = [NodeInventory(id="node", devices=(big,))]

    def memory(method: str, **dpo: object) -> dict[str, float]:
        return planned(method, **dpo).memory

    def planned(method: str, **dpo: object) -> Estimate:
        fmt = "preference" if method == "dpo" else "text"
        document = spec_dict(
            model={"preset": None, "path": str(tmp_path)},
            finetune={"method": method, "dpo": dpo},
            data={"paths": [str(tmp_path / "pairs.jsonl")], "format": fmt},
            training={"steps": 10, "precision": "bf16", "micro_batch_size": 1, "seq_len": 512,
                      "global_batch_tokens": 512},
        )  # fmt: skip
        estimate = estimate_job(validate_job_spec(document), cpu, catalog())  # type: ignore[arg-type]
        assert estimate is not None
        return estimate

    full, dpo = memory("full"), memory("dpo", weights="full")
    params = 7_615_616_512  # Qwen2.5-7B's, as its config describes it
    assert dpo["weights_gib"] - full["weights_gib"] == pytest.approx(params * 2 / 2**30, rel=0.01)
    assert dpo["activations_gib"] > full["activations_gib"]  # two sequences a pair
    simpo = memory("dpo", weights="full", loss="simpo")  # reference-free
    assert simpo["weights_gib"] == pytest.approx(full["weights_gib"])
    assert memory("dpo", weights="lora")["weights_gib"] == pytest.approx(memory("lora")["weights_gib"])
    # Every step also runs the reference forward (2 FLOPs a parameter a token), as the runtime
    # counts it; SimPO has none.
    sigmoid, reference_free = planned("dpo", weights="full"), planned("dpo", weights="full", loss="simpo")
    assert sigmoid.flops_per_token is not None and reference_free.flops_per_token is not None
    assert sigmoid.flops_per_token - reference_free.flops_per_token == pytest.approx(2 * params, rel=0.01)
    assert reference_free.flops_per_token == pytest.approx(planned("full").flops_per_token)
