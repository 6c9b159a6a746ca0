"""Help pages as a newcomer reads them: plain words (no reST), flags without a type, examples."""

from __future__ import annotations

import pytest

from tests.conftest import Cli

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "command", [[], ["jobs"], ["jobs", "list"], ["sim", "run"], ["storage", "roots", "ls"], ["server"]]
)
def test_help_reads_as_text_and_flags_take_no_value(cli: Cli, command: list[str]) -> None:
    shown = cli.run(*command, "--help").stdout
    assert "``" not in shown  # the docstrings' reST stays out of the terminal
    assert "<bool>" not in shown  # a flag takes no value, so no type is printed beside it
    assert "--help" in shown


def test_the_top_level_help_ends_with_examples(cli: Cli) -> None:
    shown = cli.run("--help").stdout
    assert "Train and fine-tune LLMs on your own accelerators." in shown
    examples = shown[shown.index("Examples:") :]
    assert "shipyard quickstart" in examples and "shipyard jobs submit" in examples
