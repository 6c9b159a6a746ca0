"""Schemathesis fuzzes every operation of the OpenAPI document against a real server: examples,
coverage, fuzzing, then stateful sequences that follow the document's links between operations
(a submitted job's id into show, cancel and logs; a token's into revoke; ...)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from shipyard.client import Client
from tests.conftest import Server
from tests.integration.test_rbac_matrix import HOLD

pytestmark = pytest.mark.integration  # real servers, databases or processes


@pytest.mark.slow
def test_a_thousand_generated_requests_and_stateful_sequences_get_no_server_error_and_match_the_schema(
    tmp_path: Path,
) -> None:
    server = Server(tmp_path / "home", f"sqlite:///{tmp_path / 'shipyard.db'}", "correct horse battery", HOLD)
    try:
        client, issued = Client.login(server.url, "admin", server.admin_password)
        client.close()
        done = subprocess.run(
            [
                str(Path(sys.executable).with_name("schemathesis")),
                "run",
                f"{server.url}/openapi.json",
                "--header",
                f"Authorization: Bearer {issued.token}",
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
                "--max-examples",
                "50",
                "--seed",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout[-5000:]
    found = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
    assert found, done.stdout[-2000:]
    generated, passed = int(found[1]), int(found[2])
    assert generated >= 1000 and passed == generated
    stateful = re.search(
        r"Stateful \(in [^)]*\)\s+Scenarios:\s+(\d+)\s+API Links:\s+(\d+) covered", done.stdout
    )
    assert stateful and int(stateful[1]) > 0 and int(stateful[2]) > 0, done.stdout[-3000:]
