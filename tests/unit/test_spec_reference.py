"""The spec reference is read off the models: every field is in it, described, with its bounds;
each starter spec is a valid job spec."""

from __future__ import annotations

import os
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from shipyard.errors import InvalidSpec
from shipyard.schemas.jobspec import JobSpec, parse_job_spec
from shipyard.schemas.spec_reference import STARTERS, markdown, reference, select, starter


def _model_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name)
        paths.append(path)
        for candidate in (info.annotation, *typing.get_args(info.annotation)):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                paths += _model_paths(candidate, path + ".")
    return paths


def test_the_reference_lists_every_field_of_the_models_each_with_why() -> None:
    docs = reference()
    assert [d.path for d in docs] == _model_paths(JobSpec)
    assert len(docs) > 80
    undocumented = [d.path for d in docs if not d.why]
    assert undocumented == []  # a new field needs its docstring: `shipyard spec` prints it
    assert not any("``" in d.why for d in docs)  # reST literals read as `code` in a terminal


def test_types_defaults_and_bounds_come_from_the_annotations() -> None:
    docs = {d.path: d for d in reference()}
    lr = docs["training.optimizer.lr"]
    assert (lr.type, lr.default, lr.valid, lr.required) == ("number", "0.0003", "> 0 and <= 10", False)
    assert docs["training.schedule.decay"].valid == "one of: cosine, linear, constant"
    assert docs["training.compile"].valid == "one of: true, false, auto"
    assert docs["name"].required and docs["name"].default is None and "lower-case" in docs["name"].valid
    assert docs["training.steps"].type == "integer, optional"
    assert docs["training.optimizer.betas"].type == "list of 2 numbers"
    assert docs["training.optimizer.betas"].valid == "each >= 0 and < 1"
    assert docs["restarts.on"].default == "[signal, lost, node_lost, collective, hang, oom]"
    assert "llama-7b" in docs["model.preset"].valid and "h100-sxm" in docs["resources.accelerator"].valid
    assert docs["finetune"].type == "section, optional" and docs["training"].required
    assert "ddp, fsdp" in docs["training.parallelism"].valid
    assert docs["training.tokens"].valid == "> 0 and <= 1_000_000_000_000_000"


def test_a_section_is_selected_with_its_fields_and_an_unknown_one_is_refused() -> None:
    docs = select(reference(), "training.optimizer")
    assert docs[0].path == "training.optimizer" and docs[0].section
    assert {d.path for d in docs[1:]} >= {"training.optimizer.lr", "training.optimizer.state_dtype"}
    with pytest.raises(InvalidSpec, match="no section 'trainin'") as err:
        select(reference(), "trainin")
    assert "training.optimizer" in (err.value.hint or "")


@pytest.mark.parametrize("kind", sorted(STARTERS))
def test_each_starter_is_a_valid_spec(kind: str) -> None:
    spec = parse_job_spec(starter(kind, data="/data/*.txt", model="/models/m"), source=kind)
    assert spec.data.paths == ["/data/*.txt"]
    assert (spec.model.path == "/models/m") == (kind == "finetune")


def test_a_path_with_yaml_syntax_in_it_stays_one_string() -> None:
    tricky = 'corpus: "all" #1/*.txt'
    spec = parse_job_spec(starter("pretrain", data=tricky), source="pretrain")
    assert spec.data.paths == [tricky]
    with pytest.raises(InvalidSpec, match="no starter spec 'rlhf'"):
        starter("rlhf", data="x")


PAGE = Path(__file__).resolve().parents[2] / "docs" / "spec-reference.md"


def test_the_spec_reference_page_is_the_models_rendered() -> None:
    # docs/spec-reference.md is this rendering: a field added, renamed or re-described in the code
    # shows here until the page is written again.
    rendered = markdown(reference())
    if os.environ.get("SHIPYARD_UPDATE_SNAPSHOTS") == "1":
        PAGE.write_text(rendered)
    assert "`training.optimizer.lr`" in rendered and "## `resources`" in rendered
    fix = "run SHIPYARD_UPDATE_SNAPSHOTS=1 pytest tests/unit/test_spec_reference.py"
    assert PAGE.read_text() == rendered, fix
