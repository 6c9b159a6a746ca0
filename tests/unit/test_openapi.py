"""The OpenAPI document is pinned: a change to a route, a parameter or a model shows up here and
must be taken on purpose (``SHIPYARD_UPDATE_SNAPSHOTS=1 pytest tests/unit/test_openapi.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from shipyard.api.app import create_app
from shipyard.settings import Settings

SNAPSHOT = Path(__file__).parents[1] / "snapshots" / "openapi.json"
UNTYPED_ANSWERS = {"metrics", "streamJobLogs", "downloadModelFile", "downloadArtifact"}
"""Operations whose answer is text or a file's bytes, not JSON."""


def document(tmp_path: Path) -> dict[str, Any]:
    # Building the app opens nothing: the database and the executor come at its start.
    app = create_app(Settings(home=tmp_path, db_url=f"sqlite:///{tmp_path}/unused.db"), run_agent=False)
    doc = app.openapi()
    doc["info"].pop("version")  # the package's version moves on its own
    return doc


def test_the_openapi_document_matches_its_snapshot(tmp_path: Path) -> None:
    current = json.dumps(document(tmp_path), indent=1, sort_keys=True) + "\n"
    if os.environ.get("SHIPYARD_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(current)
    assert SNAPSHOT.exists(), f"no snapshot yet: run with SHIPYARD_UPDATE_SNAPSHOTS=1 to write {SNAPSHOT}"
    if current != SNAPSHOT.read_text():
        pytest.fail(
            "the OpenAPI document changed; if that is intended, update the snapshot with "
            "SHIPYARD_UPDATE_SNAPSHOTS=1 pytest tests/unit/test_openapi.py and commit it"
        )


def test_every_operation_has_an_id_a_tag_and_a_typed_answer(tmp_path: Path) -> None:
    doc = document(tmp_path)
    seen = set()
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            op = operation["operationId"]
            assert op not in seen, f"{op} is used twice"
            seen.add(op)
            assert operation.get("tags"), f"{method.upper()} {path} has no tag"
            ok = next(str(s) for s in operation["responses"] if str(s).startswith("2"))
            if ok == "204" or op in UNTYPED_ANSWERS:
                continue
            schema = operation["responses"][ok]["content"]["application/json"]["schema"]
            assert schema != {}, f"{op} answers untyped JSON"
            assert "$ref" in schema or (schema.get("type") == "array" and "$ref" in schema["items"]), (
                f"{op} answers {schema}, not a named model"
            )
