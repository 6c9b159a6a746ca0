"""Untrusted input at the edges: bounded documents, confined paths, strict fields, and a fuzzer
that makes "unexpected" unreachable from a job spec."""

from __future__ import annotations

import copy
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from shipyard.audit import Actor
from shipyard.cli import _output
from shipyard.domain.paths import is_inside
from shipyard.domain.text import printable
from shipyard.errors import DatasetError, InvalidSpec, PayloadTooLarge, ShipyardError
from shipyard.schemas.data_roots import literal_part, parse_server_config, refuse_escaped_folders
from shipyard.schemas.dataset_files import files_of
from shipyard.schemas.documents import MAX_NODES, check_shape, load_mapping
from shipyard.schemas.jobspec import parse_job_spec, validate_job_spec
from shipyard.services.context import ServiceContext, open_context
from shipyard.services.jobs import jobs as job_service
from shipyard.settings import Settings
from tests.builders import spec_dict


def load(text: str) -> dict[str, Any]:
    return load_mapping(text, source="doc", expected="a mapping", hint="h")


# --- documents --------------------------------------------------------------------------------


def test_an_alias_bomb_is_refused_without_being_expanded() -> None:
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    levels += [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(9)]
    with pytest.raises(PayloadTooLarge, match=f"holds more than {MAX_NODES:,} values"):
        load("\n".join(levels))
    assert load("base: &b {lr: 1}\nother: *b\n") == {"base": {"lr": 1}, "other": {"lr": 1}}  # aliases work


@pytest.mark.parametrize(
    "text", ["a: &a [*a]", "a: " + "[" * 40 + "]" * 40, "a: " + "[" * 100_000 + "]" * 100_000]
)
def test_recursion_and_depth_are_refused_before_python_recurses(text: str) -> None:
    with pytest.raises(InvalidSpec, match="nests deeper than 32 levels"):
        load(text)


def test_json_documents_are_measured_too() -> None:
    deep: Any = 1
    for _ in range(40):
        deep = {"k": deep}
    with pytest.raises(InvalidSpec, match="nests deeper"):
        check_shape(deep)
    with pytest.raises(PayloadTooLarge):
        check_shape({"wide": list(range(MAX_NODES + 1))})


def test_yaml_reads_exponents_as_numbers_as_yaml_1_2_does() -> None:
    assert load("lr: 3e-4\ntokens: 1e9\nversion: 1.2.3\n") == {"lr": 3e-4, "tokens": 1e9, "version": "1.2.3"}


def test_a_bad_value_is_shown_cut_short() -> None:
    with pytest.raises(InvalidSpec) as refused:
        validate_job_spec(spec_dict(queue="q" * 10_000))
    assert len(refused.value.message) < 400 and "(10,002 characters)" in refused.value.message


# --- paths ----------------------------------------------------------------------------------


def test_inside_is_decided_on_the_resolved_path(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "escape")
    roots = [root.resolve()]
    assert is_inside(root / "a" / "b.txt", roots)  # whether or not it exists
    assert not is_inside(root / ".." / "outside" / "x", roots)
    assert not is_inside(root / "escape" / "x", roots)
    assert not is_inside("relative/x", roots)
    assert not is_inside(str(root) + "-sibling/x", roots)  # a prefix of the name is not a parent
    assert literal_part(f"{root}/**/*.txt") == str(root) and literal_part("*.txt") == ""


def test_the_runtime_refuses_files_and_folders_that_link_out(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "tok").mkdir(parents=True)
    outside.mkdir()
    (root / "good.txt").write_text("text\n")
    (outside / "secret").write_text("secret\n")
    os.symlink(outside / "secret", root / "bad.txt")
    os.symlink(outside / "secret", root / "tok" / "tokenizer.json")
    spec = validate_job_spec(spec_dict(data={"paths": [f"{root}/*.txt"]}))
    with pytest.raises(DatasetError, match=r"bad\.txt resolves outside the project's data roots"):
        files_of(spec.data, within=[root.resolve()])
    assert files_of(spec.data) == sorted([root / "bad.txt", root / "good.txt"])  # the machine's own user
    folder_spec = validate_job_spec(
        spec_dict(data={"paths": [str(root)], "tokenizer": {"path": str(root / "tok")}})
    )
    with pytest.raises(DatasetError, match=r"data\.tokenizer\.path"):
        refuse_escaped_folders(folder_spec, [root.resolve()])


def test_server_config_names_projects_and_absolute_folders() -> None:
    config = parse_server_config('data_roots: {"*": [/data/shared], nlp: [/data/nlp]}', "server.yaml")
    assert [str(p) for p in config.roots_for("nlp")] == ["/data/shared", "/data/nlp"]
    assert [str(p) for p in config.roots_for("vision")] == ["/data/shared"]
    with pytest.raises(InvalidSpec, match=r"server\.yaml is invalid"):
        parse_server_config("data_roots: {NLP!: [/x]}", "server.yaml")


# --- the terminal -------------------------------------------------------------------------


def test_tables_print_control_characters_as_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(_output, "console", Console(file=screen, width=200, force_terminal=True))
    _output.table(None, ["name"], [["evil\x1b[31m\nred [bold]markup[/]"]])
    shown = screen.getvalue()
    assert "\\x1b[31m\\nred [bold]markup[/]" in shown and "\x1b[31m" not in shown.replace("\x1b[1m", "")
    assert printable("plain") == "plain" and printable("a\u202eb") == "a\\u202eb"


# --- the fuzzer: every spec is accepted or refused with a hint ---------------------------------

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=30,
)


def _paths_of(document: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, value in document.items():
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from _paths_of(value, (*prefix, key))


@st.composite
def mutated_specs(draw: st.DrawFn, corpus: str) -> dict[str, Any]:
    """A valid spec with a few fields replaced, removed or added."""
    document = spec_dict(data={"paths": [corpus], "tokenizer": {"vocab_size": 512}})
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(sorted(_paths_of(document))))
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "remove":
            del parent[path[-1]]
        else:
            parent[draw(st.text(max_size=12))] = draw(values)
    return document


@pytest.fixture(scope="module")
def confined(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceContext, str]]:
    """A platform whose caller submits as through the server: admin, but confined to one root."""
    base = tmp_path_factory.mktemp("fuzz")
    data = base / "data"
    data.mkdir()
    (data / "corpus.txt").write_text("some training text\n" * 100)
    home = base / "home"
    home.mkdir()
    (home / "server.yaml").write_text(f'data_roots: {{"*": [{data}]}}\n')
    ctx = open_context(Settings(home=home, db_url=f"sqlite:///{base / 'db.sqlite'}"))
    yield ctx.acting_as(Actor(name="fuzzer", source="test", is_admin=True)), str(data / "corpus.txt")
    ctx.close()


def _submit(ctx: ServiceContext, document: Any) -> bool:
    """Whether the document was submitted; a refusal must be a ShipyardError with a hint."""
    try:
        job_service.submit(ctx, validate_job_spec(copy.deepcopy(document)))
    except ShipyardError as exc:
        assert exc.hint, f"{type(exc).__name__} without a hint: {exc.message}"
        return False
    return True


def test_generated_job_specs_are_accepted_or_refused_with_a_hint(
    confined: tuple[ServiceContext, str],
) -> None:
    ctx, corpus = confined

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(
        st.one_of(mutated_specs(corpus), st.dictionaries(st.text(max_size=12), values, max_size=6), values)
    )
    def submit_any(document: Any) -> None:
        accepted.append(_submit(ctx, document))

    accepted: list[bool] = []
    submit_any()
    assert any(accepted) and not all(accepted)  # both sides of the check were exercised


@settings(max_examples=300, deadline=None, database=None)
@given(st.one_of(st.text(max_size=300), values.map(lambda v: yaml.safe_dump(v, allow_unicode=True))))
def test_generated_yaml_texts_are_parsed_or_refused_with_a_hint(text: str) -> None:
    try:
        parse_job_spec(text)
    except ShipyardError as exc:
        assert exc.hint, f"{type(exc).__name__} without a hint: {exc.message}"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            '{"hidden_size": "64", "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 9}',
            "`hidden_size`: Input should be a valid integer",
        ),
        ("[1, 2]", "is not a JSON object"),
        (b"\xff\xfe".decode("latin-1"), "Invalid JSON"),
    ],
)
def test_a_models_config_is_typed_before_the_planner_reads_it(
    tmp_path: Path, config: str, message: str
) -> None:
    from shipyard.services.estimates.estimates import job_arch

    (tmp_path / "config.json").write_text(config)
    document = spec_dict()
    document["model"] = {"path": str(tmp_path)}
    with pytest.raises(InvalidSpec, match=message):
        job_arch(validate_job_spec(document))
