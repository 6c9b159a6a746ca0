"""Fine-tuning local Hugging Face models of every family in tests/support/tiny_models, full and
LoRA, through ``jobs submit``, the agent and the runtime, on CPU; nothing is downloaded: the
models are built from configs with tokenizers trained on local text (tests/support/tiny_models)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from shipyard.storage.digests import folder_digest
from tests.builders import spec_dict
from tests.conftest import Cli
from tests.integration.test_runtime import final_weights, metrics, run_runtime
from tests.support import tiny_models
from tests.support.checkpoints import checkpoint_tensors, final_checkpoint

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bases")
    return {family: tiny_models.build(root / family, family) for family in tiny_models.FAMILIES}


FULLY_TUNED = ("llama", "gemma2", "gpt2", "falcon", "opt")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    return {
        "instruction": tiny_models.write_jsonl(root / "colors.jsonl", tiny_models.instruction_records(240)),
        "chat": tiny_models.write_jsonl(root / "chat.jsonl", tiny_models.chat_records(240)),
    }


def finetune_spec(base: Path, data: Path, fmt: str, name: str = "tuned", **finetune: Any) -> dict[str, Any]:
    return spec_dict(
        name,
        model={"preset": None, "path": str(base)},
        data={"paths": [str(data)], "format": fmt, "tokenizer": {"vocab_size": 512}},
        finetune={"method": "lora", **finetune},
        training={
            "steps": 10,
            "eval_interval": 0,
            "optimizer": {"lr": 0.01},
            "schedule": {"warmup_steps": 1},
        },
    )


def submit(cli: Cli, tmp_path: Path, spec: dict[str, Any], *flags: str, check: bool = True) -> Any:
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = cli.run("jobs", "submit", str(path), "--wait", "--json", *flags, check=check)
    return json.loads(done.stdout) if check else done


def test_each_family_fine_tunes_through_jobs_submit_with_its_lineage(
    cli: Cli, tmp_path: Path, bases: dict[str, Path], datasets: dict[str, Path]
) -> None:
    # Every family with adapters (each names its projections its own way), and full fine-tuning of
    # those whose weights export otherwise (LLaMA's layout, Gemma 2's soft caps, and the three that
    # spell their shape their own way), queued at once: the agent runs two at a time on two cores.
    submitted = {}
    for family in tiny_models.FAMILIES:
        fmt = "chat" if family == "qwen2" else "instruction"
        for method in ("lora", "full") if family in FULLY_TUNED else ("lora",):
            name = f"{family.replace('_', '-')}-{method}"
            spec = finetune_spec(bases[family], datasets[fmt], fmt, name, method=method)
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump(spec, sort_keys=False))
            submitted[family, method] = cli.json("jobs", "submit", str(path))["id"]
    for (family, method), job_id in submitted.items():
        name = f"{family.replace('_', '-')}-{method}"
        detail = cli.wait_for(job_id, lambda j: j["state"] not in ("queued", "running"), timeout=600)
        assert detail["state"] == "succeeded", detail
        summary = detail["summary"]
        assert summary["train_loss_end"] < summary["train_loss_start"] - 0.2, family
        # Ten steps of adapters on a random tiny Gemma 2 (soft-capped logits) fit its training
        # rows without yet lowering the held-out loss; every other run lowers both.
        assert summary["eval_loss_end"] < summary["eval_loss_start"] - 0.2 or name == "gemma2-lora", name
        assert detail["estimate"]["memory_gib_per_device"] > 0 and detail["summary"]["memory_gib"] > 0

        lineage = cli.json("models", "show", f"{name}:1")
        assert lineage["method"] == method
        assert lineage["base_model"] == str(bases[family])
        assert lineage["base_model_digest"] == folder_digest(bases[family])
        assert len(lineage["dataset_digest"]) == 64
        [version] = cli.json("models", "list", name)
        export = Path(version["path"])
        if method == "lora":
            assert lineage["adapter"]["rank"] == 16
            assert (export / "adapter_config.json").is_file() and not (export / "config.json").exists()
            log = cli.run("jobs", "logs", job_id).stdout
            assert "lora fine-tuning" in log and "exported Hugging Face adapters" in log
            # Gemma 2's soft-capped attention has no fused kernel: its own eager one runs.
            assert f"{'eager' if family == 'gemma2' else 'sdpa'} attention" in log
        else:
            assert lineage["adapter"] is None and (export / "config.json").is_file()
    for name in ("qwen2-lora", "llama-full"):  # a chat model's adapters, an instruction model
        assert cli.json("generate", name, "--prompt", "What colors are sky and coal?")["tokens"] > 0

    # The same shape again: planned with the peak the first one measured.
    again = submit(
        cli, tmp_path, finetune_spec(bases["llama"], datasets["instruction"], "instruction", "llama-lora")
    )
    estimate = cli.json("jobs", "show", again["id"])["estimate"]
    first = cli.json("jobs", "show", submitted["llama", "lora"])
    assert estimate["memory_measured_by"] == first["id"]
    assert estimate["memory_gib_per_device"] == pytest.approx(first["summary"]["memory_gib"], abs=1e-3)
    assert f"as job {first['id']} peaked" in cli.run("jobs", "show", again["id"]).stdout


def test_an_adapter_resumed_run_equals_an_uninterrupted_one_and_checkpoints_hold_adapters_only(
    tmp_path: Path, bases: dict[str, Path], datasets: dict[str, Path]
) -> None:
    spec = finetune_spec(bases["mistral"], datasets["instruction"], "instruction", lora={"rank": 2})
    spec["training"]["steps"] = 6
    straight = run_runtime(tmp_path / "straight", tmp_path / "cache", spec)
    stopped = run_runtime(tmp_path / "stopped", tmp_path / "cache", spec, stop_at=3)
    checkpoint = final_checkpoint(stopped)
    adapters = checkpoint_tensors(checkpoint)
    assert adapters and all("lora_" in name for name in adapters)
    weights = sum(f.stat().st_size for f in bases["mistral"].glob("*.safetensors"))
    assert sum(t.nbytes for t in adapters.values()) < weights / 4  # the adapters, not the base
    resumed = run_runtime(tmp_path / "resumed", tmp_path / "cache", spec, resume_from=checkpoint)
    a = checkpoint_tensors(final_checkpoint(straight))
    b = checkpoint_tensors(final_checkpoint(resumed))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert [m["loss"] for m in metrics(resumed, "train")] == [m["loss"] for m in metrics(straight, "train")][
        3:
    ]


def test_the_merged_export_gives_the_logits_of_base_plus_adapters(
    tmp_path: Path, bases: dict[str, Path], datasets: dict[str, Path]
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    spec = finetune_spec(bases["qwen2"], datasets["chat"], "chat", merge=True, lora={"rank": 8, "dora": True})
    spec["training"]["steps"] = 3
    run = run_runtime(tmp_path / "run", tmp_path / "cache", spec)
    export = run / "export"
    tokens = torch.randint(0, tiny_models.VOCAB, (2, 24))
    base = AutoModelForCausalLM.from_pretrained(str(bases["qwen2"]))
    with torch.no_grad():
        adapted = PeftModel.from_pretrained(base, str(export)).eval()(tokens).logits
        merged = AutoModelForCausalLM.from_pretrained(str(export / "merged")).eval()(tokens).logits
        plain = AutoModelForCausalLM.from_pretrained(str(bases["qwen2"])).eval()(tokens).logits
    torch.testing.assert_close(merged, adapted, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(merged, plain, atol=1e-4)  # the adapters changed something
    assert json.loads((export / "adapter_config.json").read_text())["use_dora"] is True


def test_a_stored_model_and_a_registered_version_are_fine_tuned_like_a_folder(
    cli: Cli, tmp_path: Path, bases: dict[str, Path], datasets: dict[str, Path]
) -> None:
    cli.run("storage", "put", str(bases["mistral"]), "models/mistral-tiny")
    spec = finetune_spec(Path("store:models/mistral-tiny"), datasets["instruction"], "instruction", "stored")
    spec["model"]["path"] = "store:models/mistral-tiny"
    spec["training"]["steps"] = 2
    first = submit(cli, tmp_path, spec)
    assert first["state"] == "succeeded", first
    assert cli.json("models", "show", "stored:1")["base_model_digest"] == folder_digest(bases["mistral"])

    # A version of adapters trains on only through its merged export.
    spec["model"] = {"version": "stored"}
    done = submit(cli, tmp_path, {**spec, "name": "on-top"}, check=False)
    assert done.returncode == 1 and "holds adapters without a merged model" in done.stderr
    spec["model"] = {"path": "store:models/mistral-tiny"}
    spec["finetune"]["merge"] = True
    assert submit(cli, tmp_path, spec)["state"] == "succeeded"  # stored:2, with export/merged
    spec["model"] = {"version": "stored"}
    again = submit(cli, tmp_path, {**spec, "name": "on-top"})
    assert again["state"] == "succeeded", again
    stored_spec = cli.json("jobs", "show", again["id"])["spec"]
    assert stored_spec["model"]["version"] == "default/stored:2"  # pinned at submit, in its project
    merged = Path(cli.json("models", "list", "stored")[0]["path"]) / "merged"
    assert cli.json("models", "show", "on-top:1")["base_model_digest"] == folder_digest(merged)


def test_qlora_on_cpu_is_refused_at_submit_with_what_to_use_instead(
    cli: Cli, tmp_path: Path, bases: dict[str, Path], datasets: dict[str, Path]
) -> None:
    spec = finetune_spec(bases["llama"], datasets["instruction"], "instruction", method="qlora")
    done = submit(cli, tmp_path, spec, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "NVIDIA GPU" in done.stderr and "finetune.method: lora" in done.stderr
    assert cli.json("jobs", "list") == []


def test_bad_fine_tuning_input_is_refused_at_submit(
    cli: Cli, tmp_path: Path, bases: dict[str, Path], datasets: dict[str, Path]
) -> None:
    def refused(spec: dict[str, Any], *flags: str) -> str:
        done = submit(cli, tmp_path, spec, *flags, check=False)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        return str(done.stderr)

    llama, data = bases["llama"], datasets["instruction"]
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(
        json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]})
    )
    assert "holds a BertForMaskedLM, not a causal language model" in refused(
        finetune_spec(bert, data, "instruction")
    )
    wrong = refused(finetune_spec(llama, data, "instruction", lora={"target_modules": ["qkv"]}))
    assert "['qkv'] are not layers" in wrong and "down_proj, gate_proj, k_proj" in wrong
    assert "rank" in refused(finetune_spec(llama, data, "instruction", lora={"rank": 0}))

    plain = tmp_path / "no-template"
    tiny_models.build(plain, "llama")
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    assert "has none" in refused(finetune_spec(plain, datasets["chat"], "chat"))

    broken = tiny_models.write_jsonl(
        tmp_path / "broken.jsonl", [{"prompt": "a", "response": "b"}, {"prompt": "c"}]
    )
    assert f"{broken}:2 has no field 'response'" in refused(finetune_spec(llama, broken, "instruction"))

    # A checkpoint resumes only onto the weights it was trained on.
    spec = finetune_spec(plain, data, "instruction", "drift")
    spec["training"]["steps"] = 2
    assert submit(cli, tmp_path, spec)["state"] == "succeeded"
    tiny_models.build(plain, "llama", seed=1)  # the same folder, other weights
    assert "trained on other weights than" in refused(spec, "--resume")


def test_the_planned_memory_of_full_and_lora_fine_tuning_is_within_15_percent_of_the_peak(
    tmp_path: Path, datasets: dict[str, Path]
) -> None:
    from shipyard.executors.base import NodeInventory
    from shipyard.hardware import Device
    from shipyard.hardware.catalog import catalog
    from shipyard.schemas.jobspec import validate_job_spec
    from shipyard.services.estimates.estimates import estimate_job

    # Large enough (24 M parameters) that the weights, their state and the activations, not
    # the interpreter, make most of the peak; the CPU's figure is the process's peak RSS.
    shape = {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8, "num_attention_heads": 8}
    base = tiny_models.build(tmp_path / "base", "llama", **shape)
    cpu = Device(
        accelerator_type="cpu", index=0, name="cpu", vendor="cpu", memory_gib=20.0,
        peak_bf16_tflops=1.0, peak_fp32_tflops=1.0, cores=2,
    )  # fmt: skip
    here = [NodeInventory(id="here", devices=(cpu,))]
    for method in ("full", "lora"):
        spec = finetune_spec(base, datasets["instruction"], "instruction", method=method)
        spec["training"].update(steps=3, micro_batch_size=4, seq_len=128, global_batch_tokens=512)
        run = run_runtime(tmp_path / method, tmp_path / "cache", spec)
        measured = max(m["mem_gib"] for m in metrics(run, "train"))
        planned = estimate_job(validate_job_spec(spec), here, catalog()).memory_gib_per_device  # type: ignore[union-attr]
        assert planned == pytest.approx(measured, rel=0.15), (method, planned, measured)


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_lora_on_two_processes_matches_one_large_batch_token_for_token(
    tmp_path: Path, bases: dict[str, Path], datasets: dict[str, Path], parallelism: str
) -> None:
    # Prompt-masked, padded rows: micro-batches train different numbers of tokens. The step's
    # loss and gradients are those of one batch of all its rows, as Trainer and torchtune weigh.
    spec = finetune_spec(bases["qwen2"], datasets["instruction"], "instruction", lora={"dropout": 0.0})
    rows = spec["training"]["global_batch_tokens"] // spec["training"]["seq_len"]
    spec["training"].update(steps=3, parallelism=parallelism, micro_batch_size=rows)
    one = run_runtime(tmp_path / "one", tmp_path / "cache", spec)
    spec["training"]["micro_batch_size"] = 2  # and so several micro-steps on each of the two ranks
    two = run_runtime(tmp_path / "two", tmp_path / "cache", spec, world=2)
    assert [m["loss"] for m in metrics(two, "train")] == pytest.approx(
        [m["loss"] for m in metrics(one, "train")], rel=1e-5
    )
    assert [m["grad_norm"] for m in metrics(two, "train")] == pytest.approx(
        [m["grad_norm"] for m in metrics(one, "train")], rel=1e-4
    )
    assert (two / "export" / "adapter_model.safetensors").is_file()


def test_early_stopping_ends_the_job_with_its_reason_and_exports_the_best_eval(
    cli: Cli, tmp_path: Path, bases: dict[str, Path], datasets: dict[str, Path]
) -> None:
    from safetensors.torch import load_file

    # No eval can beat the untrained model by 100: the best stays at step 0, and after two evals
    # without improvement the job stops and exports step 0's weights, the base's own.
    spec = finetune_spec(bases["llama"], datasets["instruction"], "instruction", "patient", method="full")
    spec["training"].update(steps=40, eval_interval=2, early_stopping={"patience": 2, "min_delta": 100})
    done = submit(cli, tmp_path, spec)
    assert done["state"] == "succeeded", done
    detail = cli.json("jobs", "show", done["id"])
    assert detail["message"].startswith("stopped early at step 4: eval loss did not improve for 2 evals")
    assert "exported step 0" in detail["message"]
    assert max(m["step"] for m in metrics(Path(detail["run_dir"]), "train")) == 4
    [version] = cli.json("models", "list", "patient")
    exported = load_file(str(Path(version["path"]) / "model.safetensors"))
    base = load_file(str(bases["llama"] / "model.safetensors"))
    assert exported.keys() == base.keys()
    for name, tensor in base.items():
        assert torch.equal(exported[name], tensor.float()), name

    # Eval every step against none: refused at submit, saying what to set.
    spec["training"]["eval_interval"] = 0
    refused = submit(cli, tmp_path, spec, check=False)
    assert refused.returncode == 1 and "set eval_interval" in refused.stderr


def test_dpo_on_an_sft_version_through_jobs_submit_logs_rewards_and_names_its_base(
    cli: Cli, tmp_path: Path, bases: dict[str, Path], datasets: dict[str, Path]
) -> None:
    sft = finetune_spec(bases["llama"], datasets["instruction"], "instruction", "sft", method="full")
    sft["training"]["steps"] = 3
    assert submit(cli, tmp_path, sft)["state"] == "succeeded"
    pairs = tiny_models.write_jsonl(tmp_path / "pairs.jsonl", tiny_models.preference_records(240))

    spec = finetune_spec(bases["llama"], pairs, "preference", "aligned", method="dpo", dpo={"beta": 0.1})
    spec["model"] = {"version": "sft"}
    spec["data"]["eval_fraction"] = 0.2  # 48 held-out pairs
    spec["training"].update(steps=10, eval_interval=5)
    done = submit(cli, tmp_path, spec)
    assert done["state"] == "succeeded", done
    run = Path(cli.json("jobs", "show", done["id"])["run_dir"])
    train, evals = metrics(run, "train"), metrics(run, "eval")
    # The adapters start at zero: the policy is its reference, and DPO's loss is ln 2.
    assert train[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert evals[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    # Below ln 2 on the held-out pairs: the chosen answers' margin over the rejected ones grew
    # (by Jensen, a mean loss under ln 2 means a positive mean margin).
    assert evals[-1]["loss"] < math.log(2) and evals[-1]["reward_margin"] > 0
    assert {"reward_chosen", "reward_rejected", "logps_chosen"} <= set(train[-1])
    assert "dpo fine-tuning" in cli.run("jobs", "logs", done["id"]).stdout

    lineage = cli.json("models", "show", "aligned:1")
    assert lineage["method"] == "dpo" and lineage["base_model"] == "default/sft:1"
    assert lineage["adapter"]["rank"] == 16
    export = Path(cli.json("models", "list", "aligned")[0]["path"])
    assert (export / "adapter_model.safetensors").is_file()
    assert cli.json("generate", "aligned", "--prompt", "What colors are sky and coal?")["tokens"] > 0

    # Checked at submit like the other formats: a bad pair by its line, and the format and the
    # method go together.
    bad = tmp_path / "bad-pairs.jsonl"
    wrong = {"prompt": "p", "chosen": 3, "rejected": "x"}
    bad.write_text("".join(json.dumps(r) + "\n" for r in [*tiny_models.preference_records(1), wrong]))
    refused = submit(cli, tmp_path, {**spec, "data": {**spec["data"], "paths": [str(bad)]}}, check=False)
    assert refused.returncode == 1
    assert "bad-pairs.jsonl:2 chosen is a number and rejected is text" in refused.stderr
    mismatched = finetune_spec(bases["llama"], datasets["instruction"], "instruction", "x", method="dpo")
    refused = submit(cli, tmp_path, mismatched, check=False)
    assert refused.returncode == 1 and "preference pairs train with finetune.method dpo" in refused.stderr


@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_full_dpo_resumed_equals_an_uninterrupted_run(
    tmp_path: Path, bases: dict[str, Path], loss: str
) -> None:
    pairs = tiny_models.write_jsonl(tmp_path / "pairs.jsonl", tiny_models.preference_records(120))
    dpo = {"weights": "full", "loss": loss}
    spec = finetune_spec(bases["qwen2"], pairs, "preference", method="dpo", dpo=dpo)
    spec["training"].update(steps=4, global_batch_tokens=8 * 64)
    straight = run_runtime(tmp_path / "straight", tmp_path / "cache", spec)
    stopped = run_runtime(tmp_path / "stopped", tmp_path / "cache", spec, stop_at=2)
    result = json.loads((stopped / "result.json").read_text())
    resumed = run_runtime(
        tmp_path / "resumed", tmp_path / "cache", spec, resume_from=Path(result["checkpoint"])
    )
    # The reference is the base's frozen copy, read again by the resumed attempt: the same losses.
    losses = [m["loss"] for m in metrics(straight, "train")]
    assert [m["loss"] for m in metrics(resumed, "train")] == losses[2:]
    first = losses[0]
    assert first == pytest.approx(math.log(2) if loss == "sigmoid" else (1 / (2 * 0.1)) ** 2, rel=1e-5)
    a, b = final_weights(straight), final_weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (straight / "export" / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.parametrize(("weights", "parallelism"), [("lora", "ddp"), ("full", "fsdp")])
def test_dpo_on_two_processes_matches_one_large_batch(
    tmp_path: Path, bases: dict[str, Path], weights: str, parallelism: str
) -> None:
    # A step's loss is the mean over all its pairs, on every micro-batch and rank.
    pairs = tiny_models.write_jsonl(tmp_path / "pairs.jsonl", tiny_models.preference_records(120))
    dpo = {"weights": weights}
    spec = finetune_spec(bases["qwen2"], pairs, "preference", method="dpo", dpo=dpo, lora={"dropout": 0.0})
    spec["training"].update(steps=3, global_batch_tokens=8 * 64, micro_batch_size=8, parallelism=parallelism)
    one = run_runtime(tmp_path / "one", tmp_path / "cache", spec)
    spec["training"]["micro_batch_size"] = 2
    two = run_runtime(tmp_path / "two", tmp_path / "cache", spec, world=2)
    for key in ("loss", "reward_margin", "reward_accuracy"):
        assert [m[key] for m in metrics(two, "train")] == pytest.approx(
            [m[key] for m in metrics(one, "train")], abs=1e-5
        )
