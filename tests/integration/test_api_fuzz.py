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
from tests.builders import spec_dict
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


@pytest.mark.slow
def test_the_dashboards_forms_and_paths_take_any_input_without_a_server_error(tmp_path: Path) -> None:
    """Every dashboard route (what schemathesis cannot see: they are not in the OpenAPI document)
    with generated path segments, queries and form fields, as a signed-in admin whose forms carry
    their CSRF token: refused, redirected or answered, never a 5xx."""
    from urllib.parse import quote

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from shipyard.api.ui.pages import routes
    from tests.conftest import seed_model_version
    from tests.integration.test_dashboard_http import browser_session, csrf_of

    server = Server(tmp_path / "home", f"sqlite:///{tmp_path / 'shipyard.db'}", "correct horse battery", HOLD)
    known = {
        "job_id": [],
        "name": ["m"],
        "version": [str(seed_model_version(server, "m", "default", "admin"))],
    }
    with Client.login(server.url, "admin", server.admin_password)[0] as root:
        known["job_id"].append(root.submit_job(spec_dict()).id)
    walked = [r for r in routes() if r.path not in ("/logout", "/login/link")]  # type: ignore[attr-defined]
    anything = st.one_of(
        st.text(max_size=40),
        st.integers(min_value=-(10**30), max_value=10**30).map(str),
        st.sampled_from(
            ["", "\x00", "..", "../../etc/passwd", "%00", "café", "e\u0301", "\u202e", "10" * 12]
        ),
    )
    browser = browser_session(server)
    csrf = csrf_of(browser)
    failures: list[str] = []

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.data())
    def request(data: st.DataObject) -> None:
        route = data.draw(st.sampled_from(walked))
        path = route.path
        for param in route.dependant.path_params:
            value = data.draw(st.one_of(st.sampled_from(known.get(param.name, ["x"])), anything))
            path = path.replace(f"{{{param.name}}}", quote(value, safe="") or "%20")
        query = {
            p.name: data.draw(anything) for p in route.dependant.query_params if data.draw(st.booleans())
        }
        method = sorted(route.methods)[0]
        form = {p.name: data.draw(anything) for p in route.dependant.body_params}
        if method == "POST":
            form["csrf"] = csrf
        answer = browser.request(method, path, params=query, data=form or None, timeout=60)
        if answer.status_code >= 500:
            failures.append(f"{method} {path} {query} {form}: {answer.status_code} {answer.text[:200]}")

    try:
        request()
    finally:
        browser.close()
        server.stop()
    assert not failures, "\n".join(failures[:20])
