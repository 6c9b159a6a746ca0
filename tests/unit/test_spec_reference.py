"""docs/spec-reference.md is the spec's models rendered: a field added, renamed or re-described
in the code shows here until the page is written again."""

from __future__ import annotations

import os
from pathlib import Path

from shipyard.schemas.spec_reference import markdown, reference

PAGE = Path(__file__).resolve().parents[2] / "docs" / "spec-reference.md"


def test_the_spec_reference_page_is_the_models_rendered() -> None:
    rendered = markdown(reference())
    if os.environ.get("SHIPYARD_UPDATE_SNAPSHOTS") == "1":
        PAGE.write_text(rendered)
    assert "`training.optimizer.lr`" in rendered and "## `resources`" in rendered
    assert PAGE.read_text() == rendered, (
        "run SHIPYARD_UPDATE_SNAPSHOTS=1 pytest tests/unit/test_spec_reference.py"
    )
