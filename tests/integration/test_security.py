"""Attacks on a real ``shipyard server`` over HTTP, with a project member's token: the classes of
untrusted input of docs/security.md, each refused at the service layer with a clear answer."""

from __future__ import annotations

import os
import re
import socket
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shipyard.errors import DatasetError, Forbidden, InvalidSpec, PayloadTooLarge
from tests.builders import spec_dict
from tests.conftest import Server
from tests.integration.test_api import PASSWORD, admin, problem_of, user
from tests.integration.test_rbac_matrix import HOLD

pytestmark = pytest.mark.integration

PROJECT = "research"
CORPUS = "one line of training text\n" * 200


class Site:
    """A server whose project ``research`` may read one data root, a secret beside it, and a
    member (``mia``) of the project."""

    def __init__(self, base: Path) -> None:
        self.root = base / "data" / PROJECT
        self.outside = base / "outside"
        for folder in (self.root, self.outside):
            folder.mkdir(parents=True)
        (self.root / "corpus.txt").write_text(CORPUS)
        self.secret = self.outside / "secret.txt"
        self.secret.write_text("the server's secret\n" * 50)
        os.symlink(self.secret, self.root / "link-to-secret.txt")
        os.symlink(self.outside, self.root / "link-to-outside")
        home = base / "home"
        home.mkdir()
        (home / "server.yaml").write_text(
            f"data_roots:\n  {PROJECT}: [{self.root}]\n  other: [{self.root}]\n"
        )
        self.server = Server(home, f"sqlite:///{base / 'shipyard.db'}", "correct horse battery", HOLD)
        self.member = user(self.server, "mia", PROJECT, "member")

    def spec(self, *paths: str, **overrides: Any) -> dict[str, Any]:
        base = spec_dict(project=PROJECT, data={"paths": list(paths), "tokenizer": {"vocab_size": 512}})
        return {**base, **overrides}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    made = Site(tmp_path_factory.mktemp("site"))
    yield made
    made.member.close()
    made.server.stop()


# --- 1. server-side paths ---------------------------------------------------------------------


def test_paths_outside_the_data_roots_are_refused_alike_whether_or_not_they_exist(site: Site) -> None:
    home = site.server.home
    attacks = {
        "/etc/shadow": True,
        "/etc/no-such-file-anywhere": False,
        str(home / "audit.key"): True,
        str(home / "shipyard-no-such.key"): False,
        f"{site.root}/../outside/secret.txt": True,  # .. resolved first
        str(site.root / "link-to-secret.txt"): True,  # a link in the root pointing out of it
        str(site.root / "link-to-outside" / "secret.txt"): True,
        str(site.root / "link-to-outside" / "missing.txt"): False,
        "/etc/*": True,  # a glob is judged by its folders
        "corpus.txt": True,  # relative: no meaning on the server's disk
        "~/.ssh/id_rsa": False,
    }
    answers = {}
    for path, exists in attacks.items():
        with pytest.raises(Forbidden) as refused:
            site.member.submit_job(site.spec(path))
        assert (
            f"data.paths[0] {path!r} is not inside a data root of project 'research'" in refused.value.message
        )
        assert str(site.root) in (refused.value.hint or "")
        assert refused.value.http_status == 403
        answers[exists] = refused.value.message.replace(repr(path), "PATH"), refused.value.hint
    assert answers[True] == answers[False]  # nothing tells an existing file from a missing one
    with admin(site.server) as root:
        denied = [r for r in root.audit() if r.outcome == "denied" and r.actor == "mia"]
    assert len(denied) >= len(attacks)
    assert all(r.detail is not None and r.detail["reason"] == "path outside the data roots" for r in denied)


def test_model_and_tokenizer_folders_and_checkpoints_are_confined_too(site: Site, tmp_path: Path) -> None:
    corpus = str(site.root / "corpus.txt")
    with pytest.raises(Forbidden, match=r"model\.path '/etc' is not inside"):
        site.member.submit_job(site.spec(corpus, model={"path": "/etc"}))
    # A tokenizer folder inside the root whose tokenizer.json links out of it.
    folder = site.root / "tokenizer-with-a-link"
    folder.mkdir(exist_ok=True)
    if not (folder / "tokenizer.json").exists():
        os.symlink(site.server.home / "audit.key", folder / "tokenizer.json")
    spec = site.spec(corpus)
    spec["data"]["tokenizer"] = {"path": str(folder)}
    with pytest.raises(Forbidden, match=r"data.tokenizer.path '.*/tokenizer.json' is not inside"):
        site.member.submit_job(spec)
    for resume_from in ("/etc", str(site.server.home / "runs"), f"{site.root}/../outside"):
        with pytest.raises(Forbidden, match="--resume-from"):
            site.member.submit_job(site.spec(corpus), resume_from=resume_from)
    # A job id is a job's checkpoints: only for those who may read that job.
    with user(site.server, "oscar", "other", "member") as oscar:
        other_job = oscar.submit_job(spec_dict(project="other", data={"paths": [corpus]})).id
    with pytest.raises(Forbidden, match=r"mia may not job\.read"):
        site.member.submit_job(site.spec(corpus), resume_from=other_job)


def test_cluster_admins_are_confined_through_the_server_too(site: Site) -> None:
    with admin(site.server) as root, pytest.raises(Forbidden, match="is not inside a data root"):
        root.submit_job(site.spec("/etc/passwd"))


def test_paths_inside_the_roots_work_and_a_missing_one_says_so(site: Site) -> None:
    job = site.member.submit_job(site.spec(str(site.root / "corpus.txt")))
    assert job.state == "queued" and job.project == PROJECT
    with pytest.raises(DatasetError, match="does not exist or matches no file"):
        site.member.submit_job(site.spec(str(site.root / "no-such.txt")))
    binary = site.root / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(DatasetError, match="is not UTF-8 text"):
        site.member.submit_job(site.spec(str(binary)))


# --- 2. bounded input ------------------------------------------------------------------------


def _raw_request(server: Server, head: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request on a plain socket: what an attacker sends, not what a polite client would."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(head.encode() + b"\r\n" + body)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    header, _, payload = answer.partition(b"\r\n\r\n")
    status_line, *lines = header.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, payload


def test_a_huge_body_is_refused_before_it_is_read_even_without_a_token(site: Site) -> None:
    declared = 60 << 20  # the 60 MB login body: refused on its declared length, nothing parsed
    status, headers, payload = _raw_request(
        site.server,
        f"POST /api/v1/auth/token HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {declared}\r\n",
        b'{"username": "' + b"a" * 1000,
    )
    assert status == 413 and headers["content-type"].startswith("application/problem+json")
    assert b"this server reads at most 1,048,576" in payload
    # Without a declared length (chunked), it is read up to the limit and no further.
    chunk = b"x" * (256 << 10)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(5)) + b"0\r\n\r\n"
    status, _, payload = _raw_request(
        site.server, "POST /api/v1/auth/token HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n", chunks
    )
    assert status == 413 and b"payload_too_large" in payload


def test_oversized_fields_and_specs_name_the_field_and_the_limit(site: Site) -> None:
    corpus = str(site.root / "corpus.txt")
    with pytest.raises(PayloadTooLarge, match="reads at most 1,048,576"):
        site.member.submit_job(site.spec(corpus, queue="q" * (2 << 20)))  # the 50 MB queue name
    cases = {
        "queue": ("q" * 1000, "`queue`: must be 1-64 letters"),
        "project": ("p" * 70, "`project`: must be 1-63 lower-case letters"),
        "priority": (10**30, "`priority`: Input should be less than or equal to 2147483647"),
        "name": ("job\nname", "`name`: must be 1-63 lower-case letters"),
    }
    for field, (value, message) in cases.items():
        with pytest.raises(InvalidSpec, match=message):
            site.member.submit_job({**site.spec(corpus), field: value})
    training = {**spec_dict()["training"], "steps": True}
    with pytest.raises(InvalidSpec, match=r"`training.steps`: Input should be a valid integer \(got True\)"):
        site.member.submit_job(site.spec(corpus, training=training))
    many = site.spec(*[corpus] * 1001)
    with pytest.raises(InvalidSpec, match=r"`data\.paths`: List should have at most 1000 items"):
        site.member.submit_job(many)
    deep: Any = "leaf"
    for _ in range(40):
        deep = [deep]
    with pytest.raises(InvalidSpec, match="nests deeper than 32 levels"):
        site.member.submit_job({**site.spec(corpus), "checkpoint": deep})
    # Nothing of it was stored: every listing stays small.
    assert all(len(job.queue) <= 64 for job in site.member.list_jobs())


def test_uploads_keep_their_own_streamed_limit(site: Site, tmp_path: Path) -> None:
    big = tmp_path / "two-mib.bin"
    big.write_bytes(os.urandom(2 << 20))
    stored = site.member.upload_artifact(big, PROJECT, "uploads/two-mib.bin")
    assert stored.size_bytes == 2 << 20


# --- 3. text that would drive a terminal ------------------------------------------------------


def test_control_characters_are_refused_in_every_identifier(site: Site) -> None:
    corpus = str(site.root / "corpus.txt")
    with pytest.raises(InvalidSpec, match="`queue`: must be"):
        site.member.submit_job({**site.spec(corpus), "queue": "team\x1b[31m\nred"})
    with pytest.raises(InvalidSpec, match="control character"):
        site.member.submit_job(site.spec(corpus + "\x1b[2J"))
    with pytest.raises(InvalidSpec, match="token name"):
        site.member.issue_token("laptop\x1b[31m", ["read"])
    with admin(site.server) as root:
        response = root._http.put("/api/v1/queues/evil", json={"nominal": {"cpu\x1b[31m": 1}})
        assert response.status_code == 422 and "must be 1-64 letters" in problem_of(response)["detail"]
        with pytest.raises(InvalidSpec):
            root.create_user("eve\u202e", PASSWORD)  # a bidi override
    with pytest.raises(InvalidSpec, match="holds a control character"):
        site.member._call("GET", f"/api/v1/artifacts/{PROJECT}/data/%1B%5B31m")  # ESC, percent-encoded


# --- 4. logins ---------------------------------------------------------------------------------


def _login(server: Server, name: str, password: str, source: str = "127.0.0.1") -> httpx.Response:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, base_url=server.url, timeout=30) as client:
        return client.post("/api/v1/auth/token", json={"username": name, "password": password})


def test_failed_logins_throttle_one_name_from_one_address_and_no_answer_tells_names_apart(
    site: Site,
) -> None:
    user(site.server, "bob").close()
    answers = {}
    for name in ("bob", "ghost"):  # a real user and a name nobody has
        for _ in range(5):
            failed = _login(site.server, name, "not the password")
            assert failed.status_code == 401
            assert problem_of(failed)["detail"] == "invalid user name or password"
        throttled = _login(site.server, name, PASSWORD)  # from this address, the right one waits too
        assert throttled.status_code == 429 and 0 < int(throttled.headers["retry-after"]) <= 30
        body = problem_of(throttled)
        # The seconds left may differ by one on a slow machine: a clock, not a name, tells them apart.
        detail = re.sub(r"\d+ s\b", "N s", body["detail"].replace(repr(name), "NAME"))
        answers[name] = (body["code"], detail, body["hint"])
    assert answers["bob"] == answers["ghost"]
    # A guesser elsewhere never locks bob out: his own address still signs in.
    assert _login(site.server, "bob", PASSWORD, source="127.0.0.2").status_code == 200


def test_a_wrong_password_and_an_unknown_name_take_the_same_time(site: Site) -> None:
    with admin(site.server) as root:
        root.create_user("carla", PASSWORD)
    known, unknown = [], []
    for i in range(8):  # each from its own address, so that no pair is throttled
        for name, times in (("carla", known), (f"nobody-{i}", unknown)):
            start = time.perf_counter()
            assert _login(site.server, name, "not the password", f"127.0.1.{i + 1}").status_code == 401
            times.append(time.perf_counter() - start)
    # Both do one argon2 verification; before, an unknown name answered 45x faster.
    ratio = statistics.median(unknown) / statistics.median(known)
    assert 0.5 < ratio < 2, (known, unknown)


# --- 5. the server says what it does --------------------------------------------------------


def test_a_control_plane_only_server_queues_jobs_and_starts_no_agent(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "corpus.txt").write_text(CORPUS)
    home = tmp_path / "home"
    home.mkdir()
    (home / "server.yaml").write_text(f'data_roots: {{"*": [{root}]}}\n')
    server = Server(home, f"sqlite:///{tmp_path / 'db.sqlite'}", "correct horse battery", args=["--no-agent"])
    try:
        with admin(server) as root_client:
            job = root_client.submit_job(spec_dict(data={"paths": [str(root / "corpus.txt")]}))
            assert root_client.get_job(job.id).state == "queued"
        assert not (home / "agent.lock").exists() or not (home / "agent.lock").read_text().strip()
    finally:
        server.stop()
