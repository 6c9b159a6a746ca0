"""Every route of the API × every role × the scopes of the caller's token, against the exact
allowed set.

The table below is the authorization contract. A route the server serves that has no row here
fails the test, so no new route can ship without deciding who may call it. Each route needs the
``read`` scope (GET) or the ``write`` scope (anything else); a token without it is refused
whatever its holder's role, and an admin's token without the ``admin`` scope is no admin's.
A thing the caller may not see is answered 404, exactly as one that does not exist.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from shipyard.client import Client
from shipyard.errors import Forbidden
from shipyard.schemas.queues import ClusterQueueSpec
from tests.builders import spec_dict
from tests.conftest import Server, seed_finished_job, seed_model_version

pytestmark = pytest.mark.integration  # real servers, databases or processes

PASSWORD = "a long enough passphrase"
PROJECT = "research"
ROLES = ("anonymous", "outsider", "viewer", "member", "maintainer", "owner", "admin")
"""``member`` is the owner of the jobs the matrix acts on ("own"); for the others they are foreign."""
HOLD = "clusterQueues: [{name: hold, nominal: {cpu: 0}}]\nlocalQueues: {default: hold}\n"
"""No quota anywhere: submitted jobs stay queued, so the matrix never starts a training run."""

AUTHENTICATED = frozenset(ROLES) - {"anonymous"}
PROJECT_READ = frozenset({"viewer", "member", "maintainer", "owner", "admin"})
PROJECT_WRITE = frozenset({"member", "maintainer", "owner", "admin"})
EVERYONE = frozenset(ROLES)
SCOPED = {"member": (["read"], ["write"]), "admin": (["read"], ["write"], ["read", "write"])}
"""Tokens with fewer scopes than their holder may have, by the role whose holder mints them."""
OUTSIDER = frozenset({"outsider"})
"""Who may not know a project's jobs and models exist: answered 404 for them."""
NOT_THEIRS = AUTHENTICATED - {"admin"}
"""Who may not know another user's token exists."""


@dataclass
class World:
    server: Server
    tokens: dict[str, str]
    counter: Iterator[int]

    def as_(self, role: str) -> Client:
        return Client(self.server.url, self.tokens[role])

    def fresh_job(self) -> str:
        """A queued job of the member's in the project."""
        with self.as_("member") as member:
            return member.submit_job(spec_dict(project=PROJECT)).id

    def ended_job(self) -> str:
        """A job of the member's that was cancelled before it started (its log stream ends at once)."""
        job_id = self.fresh_job()
        with self.as_("member") as member:
            member.cancel_job(job_id)
        return job_id

    def fresh_model(self) -> int:
        """A version of model ``m`` in the project, as a finished job of the member's leaves it."""
        return seed_model_version(self.server, "m", PROJECT, "member")

    def finished_job(self) -> str:
        """A job of the member's in the project that succeeded with an export."""
        return seed_finished_job(self.server, "j", PROJECT, "member")[0]

    def fresh_artifact(self) -> str:
        """An artifact of the project, uploaded by the member."""
        name = f"data/a{next(self.counter)}.bin"
        with self.as_("member") as member:
            member._call("PUT", f"/api/v1/artifacts/{PROJECT}/{name}", content=b"payload")
        return name

    def fresh_queue(self) -> str:
        """A cluster queue without quota (the admin adds it)."""
        name = f"q{next(self.counter)}"
        with self.as_("admin") as root:
            root.set_queue(ClusterQueueSpec(name=name, nominal={"cpu": 0}), [])
        return name

    def fresh_token(self) -> str:
        """A token of dave's, who is none of the callers."""
        with self.as_("admin") as root:
            return root.issue_token(f"t{next(self.counter)}", ["read"], user="dave").id


Request = Callable[[World], tuple[str, dict[str, Any]]]
"""-> (path, httpx keyword arguments) for one call, with fresh resources where a call uses one up."""

MATRIX: dict[tuple[str, str], tuple[frozenset[str], Request]] = {
    ("GET", "/healthz"): (EVERYONE, lambda w: ("/healthz", {})),
    ("GET", "/metrics"): (EVERYONE, lambda w: ("/metrics", {})),
    ("POST", "/api/v1/auth/token"): (
        EVERYONE,  # anyone may try to log in; the credentials decide
        lambda w: ("/api/v1/auth/token", {"json": {"username": "member", "password": PASSWORD}}),
    ),
    ("GET", "/api/v1/users/me"): (AUTHENTICATED, lambda w: ("/api/v1/users/me", {})),
    ("GET", "/api/v1/users"): (frozenset({"admin"}), lambda w: ("/api/v1/users", {})),
    ("POST", "/api/v1/users"): (
        frozenset({"admin"}),
        lambda w: ("/api/v1/users", {"json": {"name": f"new{next(w.counter)}", "password": PASSWORD}}),
    ),
    ("GET", "/api/v1/tokens"): (AUTHENTICATED, lambda w: ("/api/v1/tokens", {})),
    ("POST", "/api/v1/tokens"): (AUTHENTICATED, lambda w: ("/api/v1/tokens", {"json": {"name": "mine"}})),
    ("DELETE", "/api/v1/tokens/{token_id}"): (  # someone else's token
        frozenset({"admin"}),
        lambda w: (f"/api/v1/tokens/{w.fresh_token()}", {}),
    ),
    ("PUT", "/api/v1/projects/{project}/members/{user}"): (
        frozenset({"owner", "admin"}),
        lambda w: (f"/api/v1/projects/{PROJECT}/members/dave", {"json": {"role": "viewer"}}),
    ),
    ("DELETE", "/api/v1/projects/{project}/members/{user}"): (
        frozenset({"owner", "admin"}),
        lambda w: (f"/api/v1/projects/{PROJECT}/members/dave", {}),
    ),
    ("GET", "/api/v1/jobs"): (AUTHENTICATED, lambda w: ("/api/v1/jobs", {})),
    ("POST", "/api/v1/jobs"): (
        PROJECT_WRITE,
        lambda w: ("/api/v1/jobs", {"json": {"spec": spec_dict(project=PROJECT)}}),
    ),
    ("GET", "/api/v1/jobs/{job_id}"): (PROJECT_READ, lambda w: (f"/api/v1/jobs/{w.fresh_job()}", {})),
    ("GET", "/api/v1/jobs/{job_id}/metrics"): (
        PROJECT_READ,
        lambda w: (f"/api/v1/jobs/{w.fresh_job()}/metrics", {}),
    ),
    ("GET", "/api/v1/jobs/{job_id}/telemetry"): (
        PROJECT_READ,
        lambda w: (f"/api/v1/jobs/{w.fresh_job()}/telemetry", {}),
    ),
    ("GET", "/api/v1/nodes/{node}/telemetry"): (AUTHENTICATED, lambda w: ("/api/v1/nodes/n1/telemetry", {})),
    ("GET", "/api/v1/series"): (
        PROJECT_READ,
        lambda w: ("/api/v1/series", {"params": {"job": w.fresh_job(), "name": "loss"}}),
    ),
    ("GET", "/api/v1/series/names"): (
        PROJECT_READ,
        lambda w: ("/api/v1/series/names", {"params": {"job": w.fresh_job()}}),
    ),
    ("POST", "/api/v1/jobs/{job_id}/cancel"): (  # the member cancels its own; others need cancel.any
        frozenset({"member", "maintainer", "owner", "admin"}),
        lambda w: (f"/api/v1/jobs/{w.fresh_job()}/cancel", {}),
    ),
    ("GET", "/api/v1/jobs/{job_id}/logs"): (
        PROJECT_READ,
        lambda w: (f"/api/v1/jobs/{w.fresh_job()}/logs", {}),
    ),
    ("GET", "/api/v1/jobs/{job_id}/logs/stream"): (
        PROJECT_READ,
        lambda w: (f"/api/v1/jobs/{w.ended_job()}/logs/stream", {}),
    ),
    ("GET", "/api/v1/queues"): (AUTHENTICATED, lambda w: ("/api/v1/queues", {})),
    ("GET", "/api/v1/queue-config"): (AUTHENTICATED, lambda w: ("/api/v1/queue-config", {})),
    ("PUT", "/api/v1/queue-config"): (
        frozenset({"admin"}),
        lambda w: ("/api/v1/queue-config", {"json": yaml.safe_load(HOLD)}),
    ),
    ("PUT", "/api/v1/queues/{name}"): (
        frozenset({"admin"}),
        lambda w: (f"/api/v1/queues/q{next(w.counter)}", {"json": {"nominal": {"cpu": 0}}}),
    ),
    ("DELETE", "/api/v1/queues/{name}"): (
        frozenset({"admin"}),
        lambda w: (f"/api/v1/queues/{w.fresh_queue()}", {}),
    ),
    ("GET", "/api/v1/nodes"): (AUTHENTICATED, lambda w: ("/api/v1/nodes", {})),
    ("GET", "/api/v1/nodes/status"): (AUTHENTICATED, lambda w: ("/api/v1/nodes/status", {})),
    ("GET", "/api/v1/planner/compare"): (
        AUTHENTICATED,
        lambda w: ("/api/v1/planner/compare", {"params": {"params_b": 1, "devices": 8}}),
    ),
    ("GET", "/api/v1/models"): (AUTHENTICATED, lambda w: ("/api/v1/models", {})),
    ("POST", "/api/v1/models/{name}/versions"): (
        frozenset({"maintainer", "owner", "admin"}),
        lambda w: (f"/api/v1/models/r{next(w.counter)}/versions", {"json": {"job_id": w.finished_job()}}),
    ),
    ("POST", "/api/v1/models/{name}/versions/{version}/stage"): (
        frozenset({"maintainer", "owner", "admin"}),
        lambda w: (f"/api/v1/models/m/versions/{w.fresh_model()}/stage", {"json": {"stage": "staging"}}),
    ),
    ("GET", "/api/v1/models/{name}/versions/{version}/files/{file}"): (
        PROJECT_WRITE,  # downloading weights: members and up, not viewers
        lambda w: (f"/api/v1/models/m/versions/{w.fresh_model()}/files/config.json", {}),
    ),
    ("GET", "/api/v1/models/{name}/versions/{version}/lineage"): (
        PROJECT_READ,
        lambda w: (f"/api/v1/models/m/versions/{w.fresh_model()}/lineage", {}),
    ),
    ("GET", "/api/v1/models/{name}/compare"): (
        PROJECT_READ,
        lambda w: ("/api/v1/models/m/compare", {"params": {"a": w.fresh_model(), "b": w.fresh_model()}}),
    ),
    ("DELETE", "/api/v1/models/{name}/versions/{version}"): (
        frozenset({"owner", "admin"}),
        lambda w: (f"/api/v1/models/m/versions/{w.fresh_model()}", {}),
    ),
    ("GET", "/api/v1/usage"): (AUTHENTICATED, lambda w: ("/api/v1/usage", {"params": {"by": "user"}})),
    ("GET", "/api/v1/datasets"): (AUTHENTICATED, lambda w: ("/api/v1/datasets", {})),
    ("GET", "/api/v1/artifacts"): (AUTHENTICATED, lambda w: ("/api/v1/artifacts", {})),
    ("PUT", "/api/v1/artifacts/{project}/{name}"): (
        PROJECT_WRITE,
        lambda w: (f"/api/v1/artifacts/{PROJECT}/data/u{next(w.counter)}.bin", {"content": b"bytes"}),
    ),
    ("GET", "/api/v1/artifacts/{project}/{name}"): (
        PROJECT_WRITE,  # artifact contents and digests: members and up, as model weights
        lambda w: (f"/api/v1/artifacts/{PROJECT}/{w.fresh_artifact()}", {}),
    ),
    ("GET", "/api/v1/downloads/{project}/{name}"): (
        PROJECT_WRITE,
        lambda w: (f"/api/v1/downloads/{PROJECT}/{w.fresh_artifact()}", {}),
    ),
    ("DELETE", "/api/v1/artifacts/{project}/{name}"): (
        frozenset({"maintainer", "owner", "admin"}),
        lambda w: (f"/api/v1/artifacts/{PROJECT}/{w.fresh_artifact()}", {}),
    ),
    ("GET", "/api/v1/audit"): (frozenset({"admin"}), lambda w: ("/api/v1/audit", {})),
    ("GET", "/api/v1/audit/verify"): (frozenset({"admin"}), lambda w: ("/api/v1/audit/verify", {})),
}

HIDDEN: dict[tuple[str, str], frozenset[str]] = {
    **{
        key: OUTSIDER
        for key in MATRIX
        if key[1].startswith(("/api/v1/jobs/{job_id}", "/api/v1/models/{name}", "/api/v1/series"))
    },
    ("DELETE", "/api/v1/tokens/{token_id}"): NOT_THEIRS,
}
"""Rows whose object some callers may not know exists: 404 for them, as for a missing one."""
DOCUMENTATION = {"/openapi.json", "/docs"}
UNSCOPED = {("GET", "/healthz"), ("GET", "/metrics"), ("POST", "/api/v1/auth/token")}
"""What needs no token, so no scope."""


def expected(caller: str, method: str, template: str) -> str:
    """The answer a caller (a role, or ``ROLE:SCOPE+SCOPE`` for a token of fewer scopes) gets."""
    role, _, scoped = caller.partition(":")
    scopes = set(scoped.split("+")) if scoped else {"read", "write", "admin"}
    allowed, _ = MATRIX[(method, template)]
    if role == "admin" and "admin" not in scopes:
        role = "outsider"  # a role in no project, and no admin without the scope
    if role == "anonymous" and role not in allowed:
        return "401"
    if (method, template) not in UNSCOPED and ("read" if method == "GET" else "write") not in scopes:
        return "403"
    if role in allowed:
        return "2xx"
    return "404" if role in HIDDEN.get((method, template), ()) else "403"


@pytest.fixture
def world(tmp_path: Path, db_url: str) -> Iterator[World]:
    server = Server(tmp_path / "home", db_url, "correct horse battery staple", queues_yaml=HOLD)
    try:
        root, _ = Client.login(server.url, "admin", server.admin_password)
        with root:
            for name in ("outsider", "viewer", "member", "maintainer", "owner", "dave"):
                root.create_user(name, PASSWORD)
            for role in ("viewer", "member", "maintainer", "owner"):
                root.set_role(PROJECT, role, role)
        tokens = {"anonymous": ""}
        for role in AUTHENTICATED:
            name, password = ("admin", server.admin_password) if role == "admin" else (role, PASSWORD)
            client, issued = Client.login(server.url, name, password)
            with client:
                for scopes in SCOPED.get(role, ()):
                    tokens[f"{role}:{'+'.join(scopes)}"] = client.issue_token("scoped", scopes).token
            tokens[role] = issued.token
        yield World(server, tokens, itertools.count())
    finally:
        server.stop()


def served_routes(url: str) -> set[tuple[str, str]]:
    schema = httpx.get(f"{url}/openapi.json").json()
    routes = {(m.upper(), path) for path, ops in schema["paths"].items() for m in ops}
    # Served but not in the OpenAPI document: the documentation itself and /metrics' twin.
    return routes | {("GET", "/healthz"), ("GET", "/metrics")}


def test_every_route_and_role_gets_exactly_the_allowed_answer(world: World) -> None:
    missing = served_routes(world.server.url) - set(MATRIX) - {("GET", p) for p in DOCUMENTATION}
    assert not missing, f"routes without an authorization row: {sorted(missing)}"
    wrong = []
    with httpx.Client(base_url=world.server.url, timeout=60) as http:
        for method, template in MATRIX:
            _, make = MATRIX[(method, template)]
            for caller, token in world.tokens.items():
                path, kwargs = make(world)
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                status = http.request(method, path, headers=headers, **kwargs).status_code
                want = expected(caller, method, template)
                got = "2xx" if 200 <= status < 300 else str(status)
                if got != want:
                    wrong.append(f"{caller:>18} {method} {template}: expected {want}, got {status}")
    assert not wrong, "\n".join(wrong)


def test_a_token_mints_nothing_worth_more_than_itself(world: World) -> None:
    """A leaked ``read, write`` token of an admin does not become an admin's token, nor a
    ``write`` token a reader's; a token asked for without scopes gets the caller's own."""
    with Client(world.server.url, world.tokens["admin:read+write"]) as ci:
        assert not ci.whoami().admin
        with pytest.raises(Forbidden, match="cannot issue a token with admin"):
            ci.issue_token("escalate", ["read", "write", "admin"])
        minted = ci.issue_token("same", None)
        with Client(world.server.url, minted.token) as again:
            assert sorted(again.whoami().scopes) == ["read", "write"]
        with pytest.raises(Forbidden):  # nor for another user: managing users is an admin's
            ci.issue_token("theirs", ["read"], user="member")
    with Client(world.server.url, world.tokens["member:write"]) as writer:
        with pytest.raises(Forbidden, match="cannot issue a token with read"):
            writer.issue_token("reader", ["read"])
        assert writer.issue_token("writer", ["write"]).token.startswith("shy_")
    root = Client(world.server.url, world.tokens["admin"])
    with root, Client(world.server.url, root.issue_token("full", None).token) as full:
        assert full.whoami().admin and sorted(full.whoami().scopes) == ["admin", "read", "write"]
