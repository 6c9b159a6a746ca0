from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shipyard.errors import DatasetError, InvalidSpec
from shipyard.schemas.dataset_files import check_data, files_of
from shipyard.schemas.jobspec import parse_job_spec, validate_job_spec
from tests.builders import spec_dict


def parse(document: dict[str, object]) -> object:
    return parse_job_spec(yaml.safe_dump(document))


def test_a_complete_spec_parses_with_defaults() -> None:
    spec = validate_job_spec(spec_dict())
    assert spec.api_version == "shipyard/v1"
    assert spec.training.total_steps == 8
    assert spec.resources.accelerator == ["cpu"]
    assert spec.checkpoint.keep == 2
    assert spec.queue == "default"


def test_unknown_field_names_the_field_the_value_and_the_valid_ones() -> None:
    document = spec_dict(training={"stepz": 5})
    with pytest.raises(InvalidSpec) as err:
        parse(document)
    message = str(err.value)
    assert "unknown field `training.stepz` (value 5)" in message
    assert "steps, tokens, global_batch_tokens" in message


def test_unknown_preset_lists_the_presets() -> None:
    with pytest.raises(
        InvalidSpec,
        match=r"`model.preset`: unknown preset; valid presets: llama-tiny.*\(got 'llama-3b'\)",
    ):
        parse(spec_dict(model={"preset": "llama-3b"}))


def test_malformed_yaml_gives_the_line() -> None:
    with pytest.raises(InvalidSpec, match="not valid YAML at line 2"):
        parse_job_spec("name: x\nmodel: preset: llama-tiny\n", source="job.yaml")


def test_a_yaml_list_is_not_a_spec() -> None:
    with pytest.raises(InvalidSpec, match="must be a YAML mapping"):
        parse_job_spec("- a\n- b\n")


def test_steps_and_tokens_are_exclusive() -> None:
    with pytest.raises(InvalidSpec, match="exactly one of `steps` or `tokens`"):
        parse(spec_dict(training={"tokens": 10_000}))


def test_tokens_give_steps_rounded_up() -> None:
    document = spec_dict()
    del document["training"]["steps"]
    document["training"]["tokens"] = 5000
    assert validate_job_spec(document).training.total_steps == 3  # 5000 / 2048


def test_global_batch_must_split_into_micro_batches() -> None:
    with pytest.raises(
        InvalidSpec, match=r"must be a multiple of micro_batch_size × seq_len \(4 × 64 = 256\)"
    ):
        parse(spec_dict(training={"global_batch_tokens": 1000}))


def test_gradient_accumulation_is_derived_from_the_global_batch() -> None:
    training = validate_job_spec(spec_dict()).training  # 2048 tokens, micro 4 x 64
    assert training.grad_accum_steps(1) == 8
    assert training.grad_accum_steps(2) == 4
    with pytest.raises(InvalidSpec, match="not a multiple of micro_batch_size × seq_len × devices"):
        training.grad_accum_steps(3)


def test_accelerator_accepts_one_type_or_an_any_of_list() -> None:
    spec = validate_job_spec(spec_dict(resources={"accelerator": ["h100-sxm", "a800", "cpu"]}))
    assert spec.resources.accelerator == ["h100-sxm", "a800", "cpu"]
    with pytest.raises(InvalidSpec, match="unknown accelerator type 'h900'; did you mean 'h800'"):
        parse(spec_dict(resources={"accelerator": "h900"}))


def test_missing_section_is_named() -> None:
    document = spec_dict()
    del document["data"]
    with pytest.raises(InvalidSpec, match="missing required field `data`"):
        parse(document)


def test_job_name_must_be_a_slug() -> None:
    with pytest.raises(InvalidSpec, match="`name`"):
        parse(spec_dict(name="My Job"))


def test_dataset_paths_expand_and_missing_or_empty_ones_fail(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl").write_text('{"text": "x"}\n')
    data = validate_job_spec(spec_dict(data={"paths": [str(tmp_path)]})).data
    assert [p.name for p in files_of(data)] == ["a.txt", "b.jsonl"]

    missing = validate_job_spec(spec_dict(data={"paths": [str(tmp_path / "nope" / "*.txt")]})).data
    with pytest.raises(DatasetError, match="does not exist or matches no file"):
        files_of(missing)

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "z.txt").write_text("")
    empty = validate_job_spec(spec_dict(data={"paths": [str(tmp_path / "empty")]})).data
    with pytest.raises(DatasetError, match="is empty"):
        files_of(empty)


@pytest.mark.parametrize(
    "layout",
    [
        {"a.txt": "x"},
        {"a.txt": ""},
        {"deep/er/a.txt": "x", "b.txt": ""},
        {"deep/er/a.txt": "", "deep/b.txt": ""},
        {},
    ],
)
@pytest.mark.parametrize("pattern", ["", "*.txt", "**/*.txt", "deep"])
def test_the_submit_check_of_a_dataset_fails_exactly_when_listing_it_does(
    tmp_path: Path, layout: dict[str, str], pattern: str
) -> None:
    for name, text in layout.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    data = validate_job_spec(spec_dict(data={"paths": [str(tmp_path / pattern)]})).data
    try:
        files_of(data)
    except DatasetError as listing:
        with pytest.raises(DatasetError) as checking:
            check_data(data)
        assert str(checking.value) == str(listing)
    else:
        check_data(data)


def test_fine_tuning_settings_are_checked_in_the_spec() -> None:
    tuned = {"preset": None, "path": "/models/base"}
    spec = validate_job_spec(spec_dict(model=tuned, finetune={"method": "lora", "lora": {"rank": 8}}))
    assert spec.method == "lora" and spec.finetune is not None and spec.finetune.lora.alpha == 32
    assert validate_job_spec(spec_dict(model=tuned)).method == "full"  # a path alone: every weight
    assert validate_job_spec(spec_dict()).method is None  # a preset: pre-training
    for bad, words in (
        ({"finetune": {"lora": {"rank": 0}}, "model": tuned}, "finetune.lora.rank"),
        ({"finetune": {"method": "sft"}, "model": tuned}, "'full', 'lora', 'qlora' or 'dpo'"),
        ({"finetune": {"method": "dpo"}, "model": tuned}, "preference pairs train with finetune.method dpo"),
        ({"finetune": {"method": "lora"}}, "give `model.path`, not a preset"),
        ({"data": {"paths": ["x.jsonl"], "format": "chat"}}, "fine-tunes an existing model"),
    ):
        with pytest.raises(InvalidSpec) as err:
            parse(spec_dict(**bad))
        assert words in str(err.value), str(err.value)


def test_every_example_spec_parses() -> None:
    examples = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))
    assert len(examples) >= 3
    for path in examples:
        parse_job_spec(path.read_text(), source=str(path))


def _layout(parallelism: object, devices: int = 4, nodes: int = 1) -> dict[str, object]:
    return spec_dict(
        training={"parallelism": parallelism},
        resources={"accelerator": "cpu", "devices": devices, "nodes": nodes},
    )


@pytest.mark.parametrize(
    ("given", "resolved"),
    [
        ("ddp", (1, 1, 4)),
        ("fsdp", (1, 4, 1)),
        ("auto", (1, 1, 4)),
        ({"tp": 2}, (2, 1, 2)),
        ({"tp": 2, "dp_shard": -1}, (2, 2, 1)),
        ({"dp_shard": 2, "dp_replicate": -1}, (1, 2, 2)),
    ],
)
def test_parallelism_shorthands_and_degrees_resolve_over_the_devices(
    given: object, resolved: tuple[int, int, int]
) -> None:
    p = validate_job_spec(_layout(given)).training.parallelism.resolved(4)
    assert (p.tp, p.dp_shard, p.dp_replicate) == resolved


def test_a_tensor_parallel_degree_must_divide_a_node_s_devices() -> None:
    with pytest.raises(InvalidSpec, match=r"tp 3 does not divide resources.devices 4.*valid: 1, 2, 4"):
        parse(_layout({"tp": 3}))


def test_degrees_that_do_not_multiply_to_the_devices_are_refused_with_the_fix() -> None:
    with pytest.raises(InvalidSpec, match="does not multiply to the job's 8 devices") as err:
        parse(_layout({"tp": 2, "dp_shard": 2, "dp_replicate": 1}, devices=4, nodes=2))
    assert "-1" in (err.value.hint or "")
    with pytest.raises(InvalidSpec, match="only one of dp_shard and dp_replicate may be -1"):
        parse(_layout({"dp_shard": -1, "dp_replicate": -1}))
    with pytest.raises(InvalidSpec, match="unknown parallelism 'zero3'; valid: ddp, fsdp, auto"):
        parse(_layout("zero3"))


def test_compile_is_refused_where_inductor_does_not_run() -> None:
    document = spec_dict(training={"compile": True}, resources={"accelerator": ["h100-sxm", "gaudi2"]})
    with pytest.raises(InvalidSpec, match=r"training.compile true.*does not run on gaudi2; valid: auto"):
        parse(document)
    assert validate_job_spec(spec_dict(training={"compile": "auto"})).training.compile == "auto"


def test_activation_checkpointing_takes_a_mode_or_a_section() -> None:
    assert (
        validate_job_spec(
            spec_dict(training={"activation_checkpointing": "full"})
        ).activation_checkpointing.mode
        == "full"
    )
    blocks = {"mode": "selective", "selective": "blocks", "every": 3}
    section = validate_job_spec(
        spec_dict(training={"activation_checkpointing": blocks})
    ).activation_checkpointing
    assert (section.selective, section.every) == ("blocks", 3)
    with pytest.raises(InvalidSpec, match=r"activation_checkpointing\.every"):
        parse(spec_dict(training={"activation_checkpointing": {"mode": "selective", "every": 1}}))


def test_gradient_checkpointing_is_full_activation_checkpointing_and_may_not_contradict_it() -> None:
    model = {"preset": None, "path": "/models/llama"}
    spec = validate_job_spec(spec_dict(model=model, finetune={"gradient_checkpointing": True}))
    assert spec.activation_checkpointing.mode == "full"
    with pytest.raises(
        InvalidSpec, match="gradient_checkpointing true asks for activation_checkpointing full"
    ):
        parse(
            spec_dict(
                model=model,
                finetune={"gradient_checkpointing": True},
                training={"activation_checkpointing": "none"},
            )
        )


def test_an_elastic_range_is_read_as_its_largest_and_fewest_devices_and_every_size_keeps_the_batch() -> None:
    spec = validate_job_spec(spec_dict(resources={"devices": {"min": 2, "max": 8}}))
    assert (spec.resources.devices, spec.resources.min_devices, spec.resources.elastic) == (8, 2, True)
    # 2,048 tokens of 64 a step: 32 samples, split evenly over 2, 4 and 8 ranks only.
    assert spec.elastic_layouts == [(1, 2), (1, 4), (1, 8)]
    at_two = spec.sized(1, 2)
    assert (at_two.resources.devices, at_two.resources.elastic) == (2, False)
    assert at_two.training.global_batch_tokens == spec.training.global_batch_tokens
    assert at_two.training.grad_accum_steps(2) * at_two.training.micro_batch_size * 2 * 64 == 2048
    stored = validate_job_spec(spec.model_dump(mode="json", by_alias=True))
    assert stored == spec  # the stored form reads back as the same spec


def test_an_elastic_range_over_nodes_sizes_the_job_in_devices_in_all_on_the_fewest_nodes() -> None:
    spec = validate_job_spec(
        spec_dict(resources={"devices": {"min": 1, "max": 2}, "nodes": {"min": 1, "max": 3}})
    )
    assert (spec.resources.nodes, spec.resources.min_nodes, spec.resources.elastic) == (3, 1, True)
    # 32 samples a step: 3 or 6 ranks would not split them; 2 devices run on one node, not two.
    assert spec.elastic_layouts == [(1, 1), (1, 2), (2, 2)]
    fixed_devices = validate_job_spec(spec_dict(resources={"devices": 2, "nodes": {"min": 1, "max": 4}}))
    assert fixed_devices.elastic_layouts == [(1, 2), (2, 2), (4, 2)]
    on_two = fixed_devices.sized(2, 2)
    assert (on_two.resources.nodes, on_two.resources.devices, on_two.resources.elastic) == (2, 2, False)
    assert on_two.training.grad_accum_steps(4) * on_two.training.micro_batch_size * 4 * 64 == 2048
    assert validate_job_spec(spec.model_dump(mode="json", by_alias=True)) == spec


@pytest.mark.parametrize(
    ("resources", "words"),
    [
        ({"devices": {"min": 4, "max": 2}}, "min_devices 4 is more than devices 2"),
        ({"devices": {"min": 1}}, "takes min and max"),
        ({"nodes": {"min": 3, "max": 1}}, "min_nodes 3 is more than nodes 1"),
        ({"devices": {"min": 3, "max": 5}}, "no two sizes in that range split the step's 32 samples"),
    ],
)
def test_an_elastic_range_that_cannot_run_is_refused_with_the_fix(
    resources: dict[str, object], words: str
) -> None:
    with pytest.raises(InvalidSpec) as refused:
        validate_job_spec(spec_dict(resources=resources))
    assert words in str(refused.value)
