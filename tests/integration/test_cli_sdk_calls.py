"""Each remote CLI command pinned to the SDK call it makes: the command line, run in this process
against a real server, goes through a spy that records every ``Client`` method called (and then
calls the real one). A change in how a command maps its arguments shows up here by name."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shipyard.cli import _jobs_backend, _remote
from shipyard.cli import storage as storage_cli
from shipyard.cli.main import main
from shipyard.client import Client
from tests.builders import write_spec
from tests.conftest import Server

pytestmark = pytest.mark.integration
Call = tuple[str, tuple[Any, ...], dict[str, Any]]


class Spy:
    """A real ``Client`` whose public calls are written down first."""

    def __init__(self, real: Client, calls: list[Call]) -> None:
        self._real, self._calls = real, calls

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if name.startswith("_") or name == "close" or not callable(attr):
            return attr

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self._calls.append((name, args, kwargs))
            return attr(*args, **kwargs)

        return recorded

    def __enter__(self) -> Spy:
        return self

    def __exit__(self, *_: object) -> None:
        self._real.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("sdk-calls")
    running = Server(base / "home", f"sqlite:///{base / 'shipyard.db'}", "correct horse battery staple")
    yield running
    running.stop()


@pytest.fixture
def calls(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    recorded: list[Call] = []
    signed_in, issued = Client.login(server.url, "admin", server.admin_password)
    signed_in.close()
    token = issued.token

    def spy() -> Spy:
        return Spy(Client(server.url, token), recorded)

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


CASES: list[tuple[list[str], Call]] = [
    (
        ["users", "add", "carol"],
        ("create_user", ("carol", "a long enough passphrase"), {"admin": False, "service": False}),
    ),
    (["users", "list"], ("list_users", (), {})),
    (
        ["tokens", "create", "ci", "--scope", "read", "--days", "2"],
        ("issue_token", ("ci", ["read"], 2.0, None), {}),
    ),
    (["tokens", "list"], ("list_tokens", (), {})),
    (["tokens", "revoke", "nosuchtoken"], ("revoke_token", ("nosuchtoken",), {})),
    (["projects", "grant", "nlp", "carol", "member"], ("set_role", ("nlp", "carol", "member"), {})),
    (["projects", "revoke", "nlp", "carol"], ("set_role", ("nlp", "carol", None), {})),
    (["jobs", "list", "--state", "queued", "--limit", "7"], ("list_jobs", ("queued", 7), {})),
    (["jobs", "show", "nosuchjob"], ("get_job", ("nosuchjob",), {})),
    (["jobs", "cancel", "nosuchjob"], ("cancel_job", ("nosuchjob",), {})),
    (["jobs", "logs", "nosuchjob"], ("job_logs", ("nosuchjob", 0), {"attempt": None})),
    (["jobs", "logs", "nosuchjob", "--attempt", "2"], ("job_logs", ("nosuchjob", 0), {"attempt": 2})),
    (["queue"], ("queues", (), {})),
    (["queues"], ("queues", (), {})),
    (["queues", "config"], ("queue_config", (), {})),
    (["queues", "remove", "nosuchqueue"], ("remove_queue", ("nosuchqueue",), {})),
    (["models", "list"], ("list_models", (None,), {})),
    (["models", "show", "chat:3"], ("model_lineage", ("chat", 3), {"project": None})),
    (["models", "show", "nlp/chat:3"], ("model_lineage", ("chat", 3), {"project": "nlp"})),
    (["models", "delete", "chat:3"], ("delete_model", ("chat", 3), {"project": None})),
    (
        ["models", "promote", "chat:3", "production"],
        ("promote_model", ("chat", 3, "production"), {"project": None}),
    ),
    (["models", "register", "nosuchjob", "--name", "chat"], ("register_model", ("nosuchjob", "chat"), {})),
    (["storage", "ls", "ckpt/", "--project", "nlp"], ("list_artifacts", ("nlp", "ckpt/"), {})),
    (["storage", "stat", "docs/a.txt", "--project", "nlp"], ("stat_artifact", ("nlp", "docs/a.txt"), {})),
    (["storage", "rm", "docs/a.txt", "--project", "nlp"], ("delete_artifact", ("nlp", "docs/a.txt"), {})),
    (["datasets", "--project", "nlp"], ("list_datasets", ("nlp",), {})),
    (
        ["usage", "--by", "type", "--since", "2026-12-01", "--csv"],
        ("usage", ("type",), {"since": datetime(2026, 12, 1, tzinfo=UTC)}),
    ),
]


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(argv) for argv, _ in CASES])
def test_a_command_makes_its_sdk_call(calls: list[Call], argv: list[str], expected: Call) -> None:
    run(*argv)  # some answer 404 (no such job): the call they make is what is pinned
    assert calls[:1] == [expected]


def test_submit_sends_the_spec_document_and_its_resume_options(calls: list[Call], tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    run("jobs", "submit", str(spec), "--resume-from", "nosuchjob")
    (name, args, kwargs), *_ = calls
    assert name == "submit_job" and args[0]["name"] == "tiny" and args[0]["data"]["paths"]
    assert kwargs == {"resume": False, "resume_from": "nosuchjob"}


def test_queue_changes_send_the_validated_queue(calls: list[Call], tmp_path: Path) -> None:
    run("queues", "set", "lab", "--nominal", "cpu=2", "--cohort", "all", "--local-queue", "nlp")
    (name, (queue, local_queues), _), *_ = calls
    assert (name, queue.name, dict(queue.nominal), queue.cohort, local_queues) == (
        "set_queue",
        "lab",
        {"cpu": 2},
        "all",
        ["nlp"],
    )
    assert run("queues", "remove", "lab") == 0


def test_storage_put_streams_the_file_as_the_artifact(calls: list[Call], tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello")
    assert run("storage", "put", str(tmp_path / "a.txt"), "docs/a.txt", "--project", "nlp") == 0
    assert calls[0][0] == "upload_artifact"
    assert calls[0][1] == (tmp_path / "a.txt", "nlp", "docs/a.txt")
