"""The API server over real HTTP: authentication, tokens, RBAC, problem JSON, audit, metrics."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from shipyard.client import Client
from shipyard.errors import Conflict, Forbidden, InvalidSpec, NotFound, Throttled, Unauthenticated
from shipyard.schemas.queues import ClusterQueueSpec
from tests.builders import spec_dict, write_spec
from tests.conftest import Cli, Server, seed_finished_job, seed_model_version
from tests.integration.test_rbac_matrix import HOLD

pytestmark = pytest.mark.integration  # real servers, databases or processes

PASSWORD = "a long enough passphrase"


def admin(server: Server) -> Client:
    client, _ = Client.login(server.url, "admin", server.admin_password)
    return client


def user(server: Server, name: str, project: str | None = None, role: str | None = None) -> Client:
    with admin(server) as root:
        root.create_user(name, PASSWORD)
        if project and role:
            root.set_role(project, name, role)
    client, _ = Client.login(server.url, name, PASSWORD)
    return client


def problem_of(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert set(body) == {"type", "title", "status", "detail", "code", "hint"}
    assert body["status"] == response.status_code and "Traceback" not in body["detail"]
    return body


def test_every_api_route_needs_a_valid_token(server: Server) -> None:
    for path in ("/api/v1/jobs", "/api/v1/models", "/api/v1/audit"):
        response = httpx.get(server.url + path)
        assert response.status_code == 401
        assert problem_of(response)["code"] == "unauthenticated"
    issued = httpx.post(
        f"{server.url}/api/v1/auth/token", json={"username": "admin", "password": server.admin_password}
    )
    token = issued.json()["token"]
    good = httpx.get(f"{server.url}/api/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    assert good.status_code == 200 and good.json() == []
    # One character changed anywhere in the token: refused, without saying which part was wrong.
    for i in (4, len(token) - 1):
        tampered = token[:i] + ("A" if token[i] != "A" else "B") + token[i + 1 :]
        bad = httpx.get(f"{server.url}/api/v1/jobs", headers={"Authorization": f"Bearer {tampered}"})
        assert bad.status_code == 401 and problem_of(bad)["detail"] == "invalid, expired or revoked token"


def test_revoked_tokens_are_refused(server: Server) -> None:
    """(Expiry is moved on an injected clock in tests/unit/test_accounts.py, not slept through.)"""
    with admin(server) as root:
        revoked = root.issue_token("ci", ["read"])
        root.revoke_token(revoked.id)
    with Client(server.url, revoked.token) as client, pytest.raises(Unauthenticated):
        client.list_jobs()


def test_a_token_in_use_is_refused_as_soon_as_it_is_revoked(server: Server) -> None:
    """The server keeps a token it checked for a moment; revoking it there forgets it at once."""
    with admin(server) as root:
        issued = root.issue_token("laptop", ["read"])
        with Client(server.url, issued.token) as client:
            assert client.list_jobs() == []  # checked and kept
            root.revoke_token(issued.id)
            with pytest.raises(Unauthenticated):
                client.list_jobs()


def test_a_read_token_cannot_write(server: Server) -> None:
    with admin(server) as root:
        read_only = root.issue_token("dashboard", ["read"])
        assert next(t for t in root.list_tokens() if t.id == read_only.id).last_used_at is None
    with Client(server.url, read_only.token) as client:
        assert client.list_jobs() == []
        with pytest.raises(Forbidden, match=r"this token's scopes \(read\) do not include write"):
            client.create_user("eve", PASSWORD)
    with admin(server) as root:  # when each token was last used: to find the ones nobody needs
        assert next(t for t in root.list_tokens() if t.id == read_only.id).last_used_at is not None


def test_wrong_passwords_throttle_that_name_from_that_address_and_are_audited(server: Server) -> None:
    user(server, "bob").close()
    for _ in range(5):
        with pytest.raises(Unauthenticated, match="invalid user name or password"):
            Client.login(server.url, "bob", "not the password at all")
    with pytest.raises(Throttled, match="too many failed logins from this address") as waited:
        Client.login(server.url, "bob", PASSWORD)  # from here, even the right password waits now
    assert 0 < waited.value.retry_after_s <= 30
    with pytest.raises(Unauthenticated, match="invalid user name or password"):
        Client.login(server.url, "nobody", PASSWORD)
    with admin(server) as root:
        logins = [(r.actor, r.outcome) for r in root.audit() if r.action == "auth.login"]
        assert logins.count(("bob", "failure")) == 5
        assert ("bob", "throttled") in logins and ("nobody", "failure") in logins
        assert root.verify_audit().ok


def test_roles_decide_who_submits_reads_and_cancels(server: Server, tmp_path: Path) -> None:
    spec = spec_dict(project="research", training={"steps": 400})
    with (
        user(server, "bob", "research", "member") as bob,
        user(server, "alice", "research", "viewer") as alice,
        user(server, "carol") as carol,
    ):
        job = bob.submit_job(spec)
        with pytest.raises(Forbidden, match=r"alice may not job\.submit project/research: its role 'viewer'"):
            alice.submit_job(spec)
        assert [j.id for j in alice.list_jobs()] == [job.id]  # a viewer reads the project's jobs
        assert carol.list_jobs() == []
        with pytest.raises(NotFound, match=f"no job with id '{job.id}'"):  # as if it did not exist
            carol.get_job(job.id)
        with pytest.raises(Forbidden, match=r"job\.cancel\.any"):
            alice.cancel_job(job.id)
        assert bob.cancel_job(job.id).state in ("cancelled", "running")  # one's own job
        with pytest.raises(Forbidden):
            bob.audit()
    with admin(server) as root:
        denied = [(r.actor, r.action) for r in root.audit() if r.outcome == "denied"]
        assert ("alice", "job.submit") in denied and ("carol", "job.read") in denied
        assert ("alice", "job.cancel.any") in denied and ("bob", "audit.read") in denied
        submitted = next(r for r in root.audit() if r.action == "job.submit")
        assert (submitted.actor, submitted.resource) == ("bob", f"job/{job.id}")
        assert submitted.source == "127.0.0.1"


def test_a_retried_submission_creates_its_job_once(server: Server) -> None:
    spec = spec_dict(training={"steps": 400})
    with admin(server) as root:
        first = root.submit_job(spec, idempotency_key="nightly-7")
        assert root.submit_job(spec, idempotency_key="nightly-7").id == first.id  # the answer was lost
        # Requests with one key in flight at once (a client that retried too soon): one job.
        with ThreadPoolExecutor(8) as pool:
            burst = set(pool.map(lambda _: root.submit_job(spec, idempotency_key="burst").id, range(8)))
        assert len(burst) == 1
        with pytest.raises(Conflict, match=r"idempotency key 'nightly-7' already created job"):
            root.submit_job(spec_dict("other"), idempotency_key="nightly-7")
        jobs = root.list_jobs()
        assert sorted(j.id for j in jobs) == sorted({first.id, *burst})
        too_long = httpx.post(
            f"{server.url}/api/v1/jobs",
            json={"spec": spec},
            headers={**root._http.headers, "Idempotency-Key": "k" * 129},
        )
        assert too_long.status_code == 422 and "Idempotency-Key" in problem_of(too_long)["detail"]
        assert len(root.list_jobs()) == len(jobs)
        for job in jobs:
            root.cancel_job(job.id)


def test_bad_input_is_a_clear_problem_and_changes_nothing(server: Server) -> None:
    with admin(server) as root:
        token = root.issue_token("x'; DROP TABLE users; --", ["read", "write"])
        names = [t.name for t in root.list_tokens()]
        assert "x'; DROP TABLE users; --" in names  # stored verbatim
        with pytest.raises(InvalidSpec, match="job_id: must be a valid name"):
            root.get_job("..hidden")
        with pytest.raises(InvalidSpec, match="is not a valid name"):
            root.list_models("../../etc/passwd")
        with pytest.raises(InvalidSpec, match=r"training\.steps"):
            root.submit_job(spec_dict(training={"steps": -1}))
        assert root.list_jobs() == []
    headers = {"Authorization": f"Bearer {token.token}"}
    response = httpx.post(f"{server.url}/api/v1/users", json={"name": 42}, headers=headers)
    assert response.status_code == 422 and "name" in problem_of(response)["detail"]
    response = httpx.post(f"{server.url}/api/v1/jobs", content=b"{not json", headers=headers)
    assert response.status_code == 422


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as {(series name, labels): value}, read with Prometheus' own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_and_openapi(server: Server) -> None:
    with admin(server) as root:
        job = root.submit_job(spec_dict())
        deadline = time.monotonic() + 120
        while root.get_job(job.id).started_at is None:
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.3)
    # The agent reports its pass just after the pass's own transaction, which started the job.
    metrics = scrape(server.url)
    while not any(name == "shipyard_devices" for name, _ in metrics):
        assert time.monotonic() < deadline, "no agent reported"
        time.sleep(0.3)
        metrics = scrape(server.url)
    by_state = {dict(labels)["state"]: v for (name, labels), v in metrics.items() if name == "shipyard_jobs"}
    assert set(by_state) == {"queued", "running", "succeeded", "failed", "cancelled"}  # zeros too
    assert sum(by_state.values()) == 1
    waits = {dict(labels)["quantile"] for (name, labels), _ in metrics.items()
             if name == "shipyard_queue_wait_seconds"}  # fmt: skip
    assert waits == {"0.5", "0.9", "0.99"}
    cores = {v for (name, labels), v in metrics.items()
             if name == "shipyard_devices" and dict(labels)["type"] == "cpu"}  # fmt: skip
    assert cores and min(cores) >= 1
    assert any(name == "shipyard_scheduling_seconds" and v >= 0 for (name, _), v in metrics.items())
    assert any(name == "shipyard_http_request_seconds_bucket" for name, _ in metrics)
    with admin(server) as root:  # the log as it is written, until the job ends
        streamed = b"".join(root.follow_logs(job.id)).decode()
        assert root.get_job(job.id).state == "succeeded"
        assert streamed == root.job_logs(job.id).data and "step" in streamed
    schema = httpx.get(f"{server.url}/openapi.json").json()
    operations = {op["operationId"] for path in schema["paths"].values() for op in path.values()}
    assert {
        "login",
        "listJobs",
        "submitJob",
        "cancelJob",
        "listModels",
        "listAudit",
        "verifyAudit",
    } <= operations


def test_model_registry_stages_downloads_and_retention(server: Server, tmp_path: Path) -> None:
    first = seed_model_version(server, "chat", "research", "bob")
    second = seed_model_version(server, "chat", "research", "bob")
    with user(server, "bob", "research", "member") as bob, admin(server) as root:
        out = tmp_path / "config.json"
        assert bob.download_model_file("chat", first, "config.json", out) == out.stat().st_size
        assert out.read_text() == '{"model_type": "llama"}'
        with pytest.raises(NotFound, match=r"has no file 'weights\.bin'"):
            bob.download_model_file("chat", first, "weights.bin", tmp_path / "w")
        assert not (tmp_path / "w").exists() and not (tmp_path / ".w.partial").exists()
        _, token = bob._http.headers["Authorization"].split()
        traversal = httpx.get(
            f"{server.url}/api/v1/models/chat/versions/{first}/files/%2E%2E/%2E%2E/%2E%2E/etc/passwd",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert traversal.status_code == 400 and "is not a file of a model" in problem_of(traversal)["detail"]
        lineage = bob.model_lineage("chat", first)
        assert (lineage.model, lineage.base_model, lineage.checkpoint_step) == (
            f"research/chat:{first}",
            "llama-tiny",
            1,
        )
        assert [d["digest"] for d in lineage.dataset] == [None, None]  # local files: no content digest
        differences = bob.compare_models("chat", first, second).differences
        assert set(differences) == {"job"}  # same spec, data and metrics; another job
        with pytest.raises(Forbidden):
            bob.promote_model("chat", first, "production")  # members do not promote
        assert root.promote_model("chat", first, "production").stage == "production"
        assert root.promote_model("chat", second, "production").stage == "production"
        stages = {m.version: m.stage for m in root.list_models("chat")}
        assert stages == {first: "archived", second: "production"}  # one version in production
        with pytest.raises(Conflict, match="is in production"):
            root.delete_model("chat", second)
        root.delete_model("chat", first)
        assert [m.version for m in root.list_models("chat")] == [second]
        actions = [(r.action, r.resource, r.actor) for r in root.audit()]
        assert ("model.download", f"model/research/chat:{first}", "bob") in actions
        assert ("model.promote", f"model/research/chat:{second}", "admin") in actions
        assert ("model.delete", f"model/research/chat:{first}", "admin") in actions
        assert root.verify_audit().ok


def test_artifacts_upload_download_limits_and_names(tmp_path: Path) -> None:
    server = Server(
        tmp_path / "home", f"sqlite:///{tmp_path / 'db'}", PASSWORD, env={"SHIPYARD_MAX_UPLOAD_MB": "1"}
    )
    try:
        with admin(server) as root:
            payload = bytes(range(256)) * 2000  # 512,000 bytes
            (tmp_path / "w.bin").write_bytes(payload)
            stored = root.upload_artifact(tmp_path / "w.bin", "nlp", "ckpt/run-1/w.bin", replicas=1)
            assert (stored.project, stored.name, stored.size_bytes) == (
                "nlp",
                "ckpt/run-1/w.bin",
                len(payload),
            )
            assert root.download_artifact("nlp", "ckpt/run-1/w.bin", tmp_path / "back.bin") == len(payload)
            assert (tmp_path / "back.bin").read_bytes() == payload
            odd = "q'; DROP TABLE stored_artifacts; --"
            root.upload_artifact(tmp_path / "w.bin", "nlp", odd)
            assert {a.name for a in root.list_artifacts("nlp")} == {"ckpt/run-1/w.bin", odd}  # verbatim

            (tmp_path / "big.bin").write_bytes(b"\0" * (2 << 20))
            headers = {"Authorization": f"Bearer {root._http.headers['Authorization'].split()[1]}"}
            too_big = httpx.put(
                f"{server.url}/api/v1/artifacts/nlp/big.bin",
                content=(tmp_path / "big.bin").read_bytes(),
                headers=headers,
            )
            assert too_big.status_code == 413
            assert "at most 1 MiB" in problem_of(too_big)["detail"]

            def chunks() -> Any:  # no Content-Length: the limit is enforced while streaming
                for _ in range(3):
                    yield b"\0" * (1 << 19)

            streamed = httpx.put(
                f"{server.url}/api/v1/artifacts/nlp/big2.bin", content=chunks(), headers=headers
            )
            assert streamed.status_code == 413
            for bad in (
                "..%2F..%2Fetc%2Fpasswd",
                "a/%2E%2E/%2E%2E/b",
                "a%00b",
            ):  # encoded: httpx normalizes ..
                response = httpx.put(
                    f"{server.url}/api/v1/artifacts/nlp/{bad}", content=b"x", headers=headers
                )
                assert response.status_code == 400, (bad, response.text)
                assert problem_of(response)["code"] == "invalid_spec"
            assert {a.name for a in root.list_artifacts("nlp")} == {"ckpt/run-1/w.bin", odd}
            assert not list((tmp_path / "home" / "uploads").iterdir())
    finally:
        server.stop()


def test_the_storage_commands_work_against_a_server(tmp_path: Path) -> None:
    server = Server(tmp_path / "home", f"sqlite:///{tmp_path / 'db'}", PASSWORD)
    try:
        folder = tmp_path / "step-10"
        (folder / "shards").mkdir(parents=True)
        (folder / "shards" / "a b&c.bin").write_bytes(b"\1" * 3000)  # a name that needs quoting
        (folder / "config.json").write_text("{}")
        node = Cli(server.home)  # a node of the platform stores a folder (as a job's agent does)
        node.env["SHIPYARD_DB_URL"] = server.env["SHIPYARD_DB_URL"]
        node.run("storage", "put", str(folder), "ckpt/step-10", "--project", "nlp")

        with admin(server) as root:
            token = root.issue_token("cli", ["read", "write", "admin"]).token
        laptop = Cli(tmp_path / "laptop")
        laptop.env.update({"SHIPYARD_URL": server.url, "SHIPYARD_TOKEN": token})
        (tmp_path / "notes.txt").write_text("hello")
        stored = laptop.json("storage", "put", str(tmp_path / "notes.txt"), "docs/notes.txt", "-p", "nlp")
        assert (stored["name"], stored["size_bytes"]) == ("docs/notes.txt", 5)
        assert [a["name"] for a in laptop.json("storage", "ls", "-p", "nlp")] == [
            "ckpt/step-10",
            "docs/notes.txt",
        ]
        assert {
            e["path"] for e in laptop.json("storage", "stat", "ckpt/step-10", "-p", "nlp")["entries"]
        } == {
            "config.json",
            "shards/a b&c.bin",
        }
        laptop.run("storage", "get", "ckpt/step-10", str(tmp_path / "restored"), "-p", "nlp")
        assert (tmp_path / "restored" / "shards" / "a b&c.bin").read_bytes() == b"\1" * 3000
        assert (tmp_path / "restored" / "config.json").read_text() == "{}"
        refused = laptop.run("storage", "put", str(folder), "again", "-p", "nlp", check=False)
        assert refused.returncode == 1 and "the server takes one file per upload" in refused.stderr
        laptop.run("storage", "rm", "docs/notes.txt", "-p", "nlp")
        assert [a["name"] for a in laptop.json("storage", "ls", "-p", "nlp")] == ["ckpt/step-10"]
        assert not (tmp_path / "laptop" / "shipyard.db").exists()
    finally:
        server.stop()


def held_server(tmp_path: Path) -> Server:
    """A server whose only queue has no quota: submitted jobs stay queued, nothing trains."""
    return Server(tmp_path / "server", f"sqlite:///{tmp_path / 'db'}", PASSWORD, queues_yaml=HOLD)


def test_queues_and_nodes_show_what_waits_and_why_to_those_who_may_read_it(tmp_path: Path) -> None:
    server = held_server(tmp_path)
    try:
        with user(server, "ana", "vision", "member") as ana, user(server, "bo", "audio", "member") as bo:
            job = ana.submit_job(spec_dict(project="vision"))
            deadline = time.monotonic() + 30
            while not (pending := ana.queues().pending) or "quota" not in pending[0].reason:
                assert time.monotonic() < deadline, pending
                time.sleep(0.3)
            assert [(p.id, p.project) for p in pending] == [(job.id, "vision")]
            assert bo.queues().pending == []  # another project's job is not shown
            assert [q.name for q in bo.queues().queues] == ["hold"]
            assert {d.accelerator_type for d in bo.nodes()} >= {"cpu"}
    finally:
        server.stop()


def test_quota_changes_are_admin_only_audited_and_drive_the_scheduler(tmp_path: Path, db_url: str) -> None:
    server = Server(tmp_path / "server", db_url, PASSWORD, queues_yaml=HOLD)
    try:
        with admin(server) as root, user(server, "ana", "vision", "member") as ana:
            assert root.queue_config().source.endswith("queues.yaml")  # never applied: the file
            job = ana.submit_job(spec_dict(project="vision"))
            with pytest.raises(Forbidden, match=r"may not queue\.manage"):
                ana.set_queue(ClusterQueueSpec(name="hold", nominal={"cpu": 8}), [])

            changed = root.set_queue(ClusterQueueSpec(name="hold", nominal={"cpu": 0}, cohort="lab"), [])
            assert changed.version == 1 and changed.changes["changed"] == {
                "hold": {"before": {"name": "hold", "nominal": {"cpu": 0}},
                         "after": {"name": "hold", "nominal": {"cpu": 0}, "cohort": "lab"}}
            }  # fmt: skip
            deadline = time.monotonic() + 30  # the agent's next pass reads the applied configuration
            while "in cohort lab" not in (reason := ana.queues().pending[0].reason):
                assert time.monotonic() < deadline, reason
                time.sleep(0.3)
            assert ana.queues().pending[0].id == job.id

            for bad, field in (
                ({"clusterQueues": [{"name": "a", "nominal": {"cpu": -1}}]}, "clusterQueues.0.nominal.cpu"),
                ({"clusterQueues": [{"name": "a"}], "localQueues": {"t": "nope"}}, "unknown cluster queues"),
                ({"clusterQueues": [{"name": "../a"}]}, "clusterQueues.0.name"),
            ):
                response = httpx.put(
                    f"{server.url}/api/v1/queue-config", json=bad, headers=root._http.headers
                )
                assert response.status_code == 422 and field in problem_of(response)["detail"], response.text
            with pytest.raises(NotFound, match="no cluster queue named 'nope'"):
                root.remove_queue("nope")
            current = root.queue_config()
            assert (current.version, current.source) == (1, "database")  # refusals changed nothing

            records = [r for r in root.audit() if r.resource == "queues"]
            assert [(r.actor, r.action, r.outcome) for r in records] == [
                ("ana", "queue.manage", "denied"),
                ("admin", "quota.change", "ok"),
            ]
            assert records[1].detail is not None and records[1].detail["replaces"].endswith("queues.yaml")
            assert root.verify_audit().ok
    finally:
        server.stop()


def test_the_jobs_commands_work_against_a_server(tmp_path: Path) -> None:
    server = held_server(tmp_path)
    try:
        with admin(server) as root:
            token = root.issue_token("cli", ["read", "write", "admin"]).token
        cli = Cli(tmp_path / "laptop")  # a machine with no platform of its own
        cli.env.update({"SHIPYARD_URL": server.url, "SHIPYARD_TOKEN": token})
        job = cli.json("jobs", "submit", str(write_spec(tmp_path)))
        assert [j["id"] for j in cli.json("jobs", "list")] == [job["id"]]
        assert cli.json("jobs", "show", job["id"])["spec"]["name"] == "tiny"
        assert cli.run("jobs", "logs", job["id"]).stdout == ""  # queued: nothing logged yet
        assert cli.json("jobs", "cancel", job["id"])["state"] == "cancelled"
        changed = cli.run("queues", "set", "hold", "--nominal", "cpu=0", "--cohort", "lab").stdout
        assert changed.startswith("queue configuration version 1 in force: changed hold"), changed
        assert cli.json("queues", "config")["config"]["clusterQueues"][0]["cohort"] == "lab"
        assert [q["name"] for q in cli.json("queues")] == ["hold"]
        finished, _ = seed_finished_job(server, "tiny", "default", "admin")
        published = cli.json("models", "register", finished, "--name", "tiny-lm")
        assert (published["name"], published["version"], published["job_id"]) == ("tiny-lm", 1, finished)
        assert [m["name"] for m in cli.json("models", "list")] == ["tiny-lm"]
        assert cli.json("models", "show", "tiny-lm")["job"] == finished
        assert (
            cli.run("models", "promote", "tiny-lm:1", "staging").stdout.strip()
            == "default/tiny-lm:1 is now staging"
        )
        cli.run("models", "delete", "tiny-lm:1")
        assert cli.json("models", "list") == []
        assert not (tmp_path / "laptop" / "shipyard.db").exists()  # everything happened on the server
        cli.env["SHIPYARD_TOKEN"] = token[:-2] + "xx"
        refused = cli.run("jobs", "list", check=False)
        assert refused.returncode == 1 and "invalid, expired or revoked token" in refused.stderr
    finally:
        server.stop()


def test_what_the_server_acknowledged_survives_a_kill_an_instant_later(
    server: Server, db_url: str, request: pytest.FixtureRequest
) -> None:
    """A submission, a cancel and a promotion answered 2xx are in the database: the server is
    killed (SIGKILL) right after each answer and a new one finds them."""
    version = seed_model_version(server, "kept", "default", "admin")
    acknowledged: dict[str, Any] = {}
    with admin(server) as root:
        acknowledged["submitted"] = root.submit_job(spec_dict("acked", training={"steps": 4000})).id
    running = server
    for step in ("cancel", "promote", "check"):
        running.process.kill()  # no shutdown, no flush: what was answered must already be durable
        running.process.wait()
        started = time.monotonic()
        running = Server(running.home, db_url, running.admin_password)
        request.addfinalizer(running.stop)  # whatever fails below, no server outlives the test
        print(f"a server answers again {time.monotonic() - started:.1f} s after the last was killed")
        with admin(running) as root:
            assert root.get_job(acknowledged["submitted"]).id == acknowledged["submitted"]
            if step == "cancel":
                root.cancel_job(acknowledged["submitted"])
            elif step == "promote":  # the cancel stood: the job stops (not after its 4,000 steps)
                deadline = time.monotonic() + 90
                while root.get_job(acknowledged["submitted"]).state != "cancelled":
                    assert time.monotonic() < deadline, root.get_job(acknowledged["submitted"])
                    time.sleep(0.5)
                root.promote_model("kept", version, "production")
            else:
                assert next(m for m in root.list_models("kept") if m.version == version).stage == "production"


def test_the_hardware_advisor_answers_over_the_api_with_its_ranges_ties_and_evidence(server: Server) -> None:
    with user(server, "advice-reader", "advice", "viewer") as viewer:  # any signed-in caller may ask
        advice = viewer.compare_hardware(8, 100, devices=8)
        with pytest.raises(InvalidSpec):
            viewer.compare_hardware(-1, 100)
    by_type = {row["accelerator"]: row for row in advice.rows}
    h100 = by_type["h100-sxm"]
    assert h100["cost_usd_range"]["low"] < h100["cost_usd"] < h100["cost_usd_range"]["high"]
    assert h100["plan"]["evidence"]["kind"] == "published" and h100["plan"]["price"]["source"]
    assert by_type["gaudi3"]["plan"]["evidence"]["kind"] == "extrapolated"
    tied = [row for row in advice.rows if row["tied"]]  # overlapping ranges share a rank
    assert tied and all(sum(r["rank"] == row["rank"] for r in advice.rows) > 1 for row in tied)
    assert advice.price_caveat is not None and "not like for like" in advice.price_caveat
