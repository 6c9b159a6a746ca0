"""Each remote CLI command pinned to the request it sends: the command line, run in this process
against a real server, goes through a real ``Client`` whose every request is written down (method,
path, query, JSON body) before it is sent. What is pinned is the wire contract of the versioned
API, not which SDK method a command happens to call: the SDK may change inside, the requests may
not without this test saying so."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from shipyard.cli import _jobs_backend, _remote
from shipyard.cli import storage as storage_cli
from shipyard.cli.main import main
from shipyard.client import Client
from tests.builders import write_spec
from tests.conftest import Server

pytestmark = pytest.mark.integration
Sent = tuple[str, str, dict[str, str], Any]


def sent(request: httpx.Request) -> Sent:
    """What a request says on the wire: its method, path, query and JSON body (None for another)."""
    is_json = request.headers.get("content-type") == "application/json"
    body = json.loads(request.read()) if is_json else None
    return (request.method, request.url.path, dict(request.url.params), body)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("sdk-calls")
    running = Server(base / "home", f"sqlite:///{base / 'shipyard.db'}", "correct horse battery staple")
    yield running
    running.stop()


@pytest.fixture
def calls(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Sent]:
    recorded: list[Sent] = []
    signed_in, issued = Client.login(server.url, "admin", server.admin_password)
    signed_in.close()
    token = issued.token

    def spy() -> Client:
        return Client(server.url, token, on_request=lambda request: recorded.append(sent(request)))

    for module in (_remote, _jobs_backend, storage_cli):
        monkeypatch.setattr(module, "client", spy)
    monkeypatch.setenv("SHIPYARD_URL", server.url)
    monkeypatch.setenv("SHIPYARD_TOKEN", token)
    monkeypatch.setenv("SHIPYARD_HOME", str(tmp_path / "laptop"))
    monkeypatch.setenv("SHIPYARD_NEW_PASSWORD", "a long enough passphrase")
    return recorded


def run(*argv: str) -> int:
    """The command's exit status (its output is not the point here)."""
    saved = sys.argv
    sys.argv = ["shipyard", *argv]
    try:
        main()
    except SystemExit as done:
        return int(done.code or 0)
    finally:
        sys.argv = saved
    return 0


NO_QUERY: dict[str, str] = {}
CASES: list[tuple[list[str], Sent]] = [
    (
        ["users", "add", "carol"],
        (
            "POST",
            "/api/v1/users",
            NO_QUERY,
            {"name": "carol", "password": "a long enough passphrase", "admin": False, "service": False},
        ),
    ),
    (["users", "list"], ("GET", "/api/v1/users", NO_QUERY, None)),
    (
        ["tokens", "create", "ci", "--scope", "read", "--days", "2"],
        ("POST", "/api/v1/tokens", NO_QUERY, {"name": "ci", "scopes": ["read"], "days": 2.0, "user": None}),
    ),
    (["tokens", "list"], ("GET", "/api/v1/tokens", NO_QUERY, None)),
    (["tokens", "revoke", "nosuchtoken"], ("DELETE", "/api/v1/tokens/nosuchtoken", NO_QUERY, None)),
    (
        ["projects", "grant", "nlp", "carol", "member"],
        ("PUT", "/api/v1/projects/nlp/members/carol", NO_QUERY, {"role": "member"}),
    ),
    (
        ["projects", "revoke", "nlp", "carol"],
        ("DELETE", "/api/v1/projects/nlp/members/carol", NO_QUERY, None),
    ),
    (
        ["jobs", "list", "--state", "queued", "--limit", "7"],
        ("GET", "/api/v1/jobs", {"limit": "7", "offset": "0", "state": "queued"}, None),
    ),
    (["jobs", "show", "nosuchjob"], ("GET", "/api/v1/jobs/nosuchjob", NO_QUERY, None)),
    (["jobs", "cancel", "nosuchjob"], ("POST", "/api/v1/jobs/nosuchjob/cancel", NO_QUERY, None)),
    (["jobs", "logs", "nosuchjob"], ("GET", "/api/v1/jobs/nosuchjob/logs", {"offset": "0"}, None)),
    (
        ["jobs", "logs", "nosuchjob", "--attempt", "2"],
        ("GET", "/api/v1/jobs/nosuchjob/logs", {"offset": "0", "attempt": "2"}, None),
    ),
    (["queue"], ("GET", "/api/v1/queues", NO_QUERY, None)),
    (["queues"], ("GET", "/api/v1/queues", NO_QUERY, None)),
    (["queues", "config"], ("GET", "/api/v1/queue-config", NO_QUERY, None)),
    (["queues", "remove", "nosuchqueue"], ("DELETE", "/api/v1/queues/nosuchqueue", NO_QUERY, None)),
    (["models", "list"], ("GET", "/api/v1/models", NO_QUERY, None)),
    (["models", "show", "chat:3"], ("GET", "/api/v1/models/chat/versions/3/lineage", NO_QUERY, None)),
    (
        ["models", "show", "nlp/chat:3"],
        ("GET", "/api/v1/models/chat/versions/3/lineage", {"project": "nlp"}, None),
    ),
    (["models", "delete", "chat:3"], ("DELETE", "/api/v1/models/chat/versions/3", NO_QUERY, None)),
    (
        ["models", "promote", "chat:3", "production"],
        ("POST", "/api/v1/models/chat/versions/3/stage", NO_QUERY, {"stage": "production"}),
    ),
    (
        ["models", "register", "nosuchjob", "--name", "chat"],
        ("POST", "/api/v1/models/chat/versions", NO_QUERY, {"job_id": "nosuchjob"}),
    ),
    (
        ["storage", "ls", "ckpt/", "--project", "nlp"],
        ("GET", "/api/v1/artifacts", {"prefix": "ckpt/", "project": "nlp"}, None),
    ),
    (
        ["storage", "stat", "docs/a.txt", "--project", "nlp"],
        ("GET", "/api/v1/artifacts/nlp/docs/a.txt", NO_QUERY, None),
    ),
    (
        ["storage", "rm", "docs/a.txt", "--project", "nlp"],
        ("DELETE", "/api/v1/artifacts/nlp/docs/a.txt", NO_QUERY, None),
    ),
    (["datasets", "--project", "nlp"], ("GET", "/api/v1/datasets", {"project": "nlp"}, None)),
    (
        ["usage", "--by", "type", "--since", "2026-12-01", "--csv"],
        (
            "GET",
            "/api/v1/usage",
            {"by": "type", "since": datetime(2026, 12, 1, tzinfo=UTC).isoformat()},
            None,
        ),
    ),
]


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(argv) for argv, _ in CASES])
def test_a_command_sends_its_request(calls: list[Sent], argv: list[str], expected: Sent) -> None:
    run(*argv)  # some answer 404 (no such job): the request they send is what is pinned
    assert calls[:1] == [expected]


def test_submit_sends_the_spec_document_and_its_resume_options(calls: list[Sent], tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    run("jobs", "submit", str(spec), "--resume-from", "nosuchjob")
    (method, path, query, body), *_ = calls
    assert (method, path, query) == ("POST", "/api/v1/jobs", NO_QUERY)
    assert body["spec"]["name"] == "tiny" and body["spec"]["data"]["paths"]
    assert (body["resume"], body["resume_from"]) == (False, "nosuchjob")


def test_queue_changes_send_the_validated_queue(calls: list[Sent], tmp_path: Path) -> None:
    run("queues", "set", "lab", "--nominal", "cpu=2", "--cohort", "all", "--local-queue", "nlp")
    (method, path, _, body), *_ = calls
    assert (method, path) == ("PUT", "/api/v1/queues/lab")
    assert body == {"nominal": {"cpu": 2}, "cohort": "all", "localQueues": ["nlp"]}
    assert run("queues", "remove", "lab") == 0


def test_storage_put_streams_the_file_as_the_artifact(calls: list[Sent], tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello")
    assert run("storage", "put", str(tmp_path / "a.txt"), "docs/a.txt", "--project", "nlp") == 0
    assert calls[-1][:2] == ("PUT", "/api/v1/artifacts/nlp/docs/a.txt")
