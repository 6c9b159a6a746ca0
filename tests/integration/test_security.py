"""Attacks on a real ``shipyard server`` over HTTP, with a project member's token: the classes of
untrusted input of docs/security.md, each refused at the service layer with a clear answer."""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shipyard.errors import DatasetError, Forbidden, InvalidSpec, NotFound, PayloadTooLarge
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
    with pytest.raises(NotFound, match="is neither a checkpoint path nor a job id"):  # as if none
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
        problem_of(throttled)
        answers[name] = (throttled.headers["retry-after"], throttled.content)
    assert answers["bob"] == answers["ghost"]  # to the byte: no name echoed, the wait rounded
    # A guesser elsewhere never locks bob out: his own address still signs in.
    assert _login(site.server, "bob", PASSWORD, source="127.0.0.2").status_code == 200


@pytest.mark.serial  # a ratio of times: measured alone, not beside the parallel run
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


# --- 6. what a caller may reach: checkpoints, streams, hidden things -------------------------


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_another_projects_checkpoints_need_the_right_to_read_them(site: Site) -> None:
    """A viewer of ``other`` sees its jobs but may not train on their weights (nor download
    them through a job of its own project); to a stranger the job does not exist."""
    corpus = str(site.root / "corpus.txt")
    with user(site.server, "olga", "other", "member") as olga:
        theirs = olga.submit_job(spec_dict(project="other", data={"paths": [corpus]})).id
    with user(site.server, "vic", PROJECT, "member") as vic:
        with admin(site.server) as root:
            root.set_role("other", "vic", "viewer")
        assert vic.get_job(theirs).id == theirs  # a viewer reads the job
        with pytest.raises(Forbidden, match=r"vic may not job\.checkpoints job/"):
            vic.submit_job(site.spec(corpus), resume_from=theirs)
    answers = []
    for job_id in (theirs, "no-such-job"):  # mia has no role in ``other``: both answers alike
        with pytest.raises(NotFound) as missing:
            site.member.submit_job(site.spec(corpus), resume_from=job_id)
        answers.append((missing.value.message.replace(job_id, "ID"), missing.value.hint))
    assert answers[0] == answers[1]
    status = site.member.cluster_nodes()  # the nodes' jobs: only those mia may see
    assert all(theirs not in node.jobs for node in status)


def test_a_log_stream_ends_once_its_token_is_revoked_and_streams_are_capped(site: Site) -> None:
    from shipyard.api.deps import STREAMS_PER_USER

    corpus = str(site.root / "corpus.txt")
    with user(site.server, "rita", PROJECT, "member") as rita:
        held = rita.submit_job(site.spec(corpus)).id  # queued behind no quota: its log never ends
        issued = rita.issue_token("watcher", ["read"])
        path = f"/api/v1/jobs/{held}/logs/stream"
        with httpx.Client(base_url=site.server.url, timeout=60) as http:
            headers = _bearer(issued.token)
            streams = [http.stream("GET", path, headers=headers) for _ in range(STREAMS_PER_USER)]
            opened = [stream.__enter__() for stream in streams]
            assert all(response.status_code == 200 for response in opened)
            one_more = http.get(path, headers=_bearer(issued.token))
            assert one_more.status_code == 429 and problem_of(one_more)["code"] == "throttled"
            rita.revoke_token(issued.id)
            # Each stream ends on its own (a read that never ended would time out and fail here).
            assert all(b"".join(response.iter_bytes()) == b"" for response in opened)
            for stream in streams:
                stream.__exit__(None, None, None)


def test_a_model_file_name_with_a_nul_byte_is_a_clear_refusal(site: Site) -> None:
    from tests.conftest import seed_model_version

    version = seed_model_version(site.server, "nul", PROJECT, "mia")
    _, token = site.member._http.headers["Authorization"].split()
    for file in ("config.json%00.txt", "%00", "a%1B[2Jb"):
        answer = httpx.get(
            f"{site.server.url}/api/v1/models/nul/versions/{version}/files/{file}", headers=_bearer(token)
        )
        assert answer.status_code == 400, (file, answer.text)
        assert "is not a file of a model" in problem_of(answer)["detail"]


# --- 7. no one caller takes the service from the others ---------------------------------------


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:", 1)[1].split()[0]) / 1024


def test_a_flood_of_logins_is_bounded_in_memory_and_the_server_keeps_answering(site: Site) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from shipyard.services.accounts.logins import HASH_SLOTS

    pid = site.server.process.pid
    baseline, peak, health = _rss_mib(pid), [0.0], []
    flooding = threading.Event()
    flooding.set()

    def watch() -> None:
        with httpx.Client(base_url=site.server.url, timeout=60) as http:
            while flooding.is_set():
                peak[0] = max(peak[0], _rss_mib(pid))
                health.append(http.get("/healthz").status_code)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:  # 48 fresh names at once, each from its own address: no throttle row applies
        with ThreadPoolExecutor(48) as pool:
            answers = pool.map(lambda n: _login(site.server, f"f{n}", "x", f"127.0.4.{n + 1}"), range(48))
            statuses = [answer.status_code for answer in answers]
    finally:
        flooding.clear()
        watcher.join()
    print(f"48 logins at once: {statuses.count(401)} checked, {statuses.count(503)} told to wait; "
          f"server RSS {baseline:.0f} -> {peak[0]:.0f} MiB")  # fmt: skip
    assert set(statuses) <= {401, 503}, statuses  # refused, or told to come back: never a 500
    assert health and set(health) == {200}  # liveness was answered all along
    # argon2id takes 64 MiB a hash: only HASH_SLOTS of them at once (16 unbounded took 957 MiB).
    assert peak[0] - baseline < 64 * HASH_SLOTS + 160, (baseline, peak[0])


def test_a_spec_too_large_to_read_is_refused_before_and_without_the_event_loop(site: Site) -> None:
    from tests.integration.test_dashboard_http import browser_session, csrf_of

    flow_list = "name: x\nlist: [" + "1," * 150_000 + "1]\n"  # 300 KB
    with admin(site.server) as root:
        root.create_user("nora", PASSWORD)  # no role anywhere
    nobody = browser_session(site.server, "nora", PASSWORD)
    refused = nobody.post("/submit", data={"spec": flow_list, "csrf": csrf_of(nobody)})
    assert refused.status_code == 403 and "may not job.submit in any project" in refused.text
    nobody.close()
    member = browser_session(site.server, "mia", PASSWORD)
    nested = "a: " + "[" * 250_000
    for spec, says in ((flow_list, "holds more than 20,000 values"), (nested, "nests deeper")):
        answer = member.post("/submit", data={"spec": spec, "csrf": csrf_of(member)})
        assert answer.status_code == 400 and says in answer.text
    member.close()
    assert httpx.get(f"{site.server.url}/healthz").status_code == 200


def _send_slowly(server: Server, head: bytes, every_s: float) -> bytes:
    """Send ``head`` a byte at a time, ``every_s`` apart, then read what comes back."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=90) as connection:
        try:
            for byte in head:
                connection.sendall(bytes([byte]))
                time.sleep(every_s)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us: what the server answered is still to read
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def test_headers_sent_a_byte_at_a_time_end_in_a_timeout(site: Site) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 100 + b"\r\n\r\n"
    answer = _send_slowly(site.server, head, every_s=2.0)  # 2.5 minutes if nobody stopped it
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_an_upload_is_refused_before_a_byte_of_it_is_read(site: Site) -> None:
    """A user with no role declares 200 MiB and sends none of it: the 403 comes anyway, so the
    body was never needed to decide (and nothing landed in the home)."""
    with user(site.server, "una") as una:
        _, token = una._http.headers["Authorization"].split()
    head = (
        f"PUT /api/v1/artifacts/{PROJECT}/big.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Length: {200 << 20}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", site.server.port), timeout=30) as connection:
        connection.sendall(head.encode())
        answer = b""
        while chunk := connection.recv(65536):  # the server closes: the body was never read
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 403") and b"una may not artifact.write" in answer
    uploads = site.server.home / "uploads"
    assert not uploads.exists() or not any(uploads.iterdir())


def test_a_refusal_reaches_a_client_that_sends_the_whole_body_first(site: Site) -> None:
    import http.client

    for path in ("/api/v1/auth/token", f"/api/v1/artifacts/{PROJECT}/ten.bin"):
        connection = http.client.HTTPConnection("127.0.0.1", site.server.port, timeout=60)
        headers = {"Content-Type": "application/json", **_bearer("shy_no_such")}
        method = "PUT" if "artifacts" in path else "POST"
        connection.request(method, path, body=b"x" * (10 << 20), headers=headers)
        response = connection.getresponse()  # no reset: the body was read and dropped first
        assert response.status in (401, 413), (path, response.status)
        assert b'"code"' in response.read()
        connection.close()


def test_forwarded_addresses_are_believed_only_from_listed_proxies(site: Site) -> None:
    transport = httpx.HTTPTransport(local_address="127.0.0.5")
    with httpx.Client(transport=transport, base_url=site.server.url, timeout=30) as client:
        answer = client.post(
            "/api/v1/auth/token",
            json={"username": "forger", "password": "not the password"},
            headers={"X-Forwarded-For": "203.0.113.9"},
        )
    assert answer.status_code == 401
    with admin(site.server) as root:
        [record] = [r for r in root.audit() if r.actor == "forger"]
    assert record.source == "127.0.0.5"  # the TCP peer, not what the client claimed


def test_a_listed_proxy_is_believed_and_only_it(tmp_path: Path) -> None:
    server = Server(
        tmp_path / "home", f"sqlite:///{tmp_path / 'db'}", "correct horse battery",
        args=["--trusted-proxy", "127.0.0.6"],
    )  # fmt: skip
    try:
        for peer, name in (("127.0.0.6", "via-proxy"), ("127.0.0.7", "not-a-proxy")):
            transport = httpx.HTTPTransport(local_address=peer)
            with httpx.Client(transport=transport, base_url=server.url, timeout=30) as client:
                client.post(
                    "/api/v1/auth/token",
                    json={"username": name, "password": "not the password"},
                    headers={"X-Forwarded-For": "203.0.113.9"},
                )
        with admin(server) as root:
            sources = {r.actor: r.source for r in root.audit() if r.action == "auth.login"}
        assert sources["via-proxy"] == "203.0.113.9" and sources["not-a-proxy"] == "127.0.0.7"
    finally:
        server.stop()


# --- 8. names mean one thing; the home is its user's ------------------------------------------


def test_a_name_that_is_not_composed_unicode_is_refused_with_its_composed_spelling(
    site: Site, tmp_path: Path
) -> None:
    import unicodedata

    data = tmp_path / "menu.txt"
    data.write_text("du café\n")
    composed, decomposed = "café.txt", unicodedata.normalize("NFD", "café.txt")
    assert composed != decomposed and composed == unicodedata.normalize("NFC", decomposed)
    site.member.upload_artifact(data, PROJECT, composed)
    with pytest.raises(InvalidSpec, match="not in Unicode normal form C") as refused:
        site.member.upload_artifact(data, PROJECT, decomposed)
    assert repr(composed) in (refused.value.hint or "")
    with pytest.raises(InvalidSpec, match="not in Unicode normal form C"):
        site.member.issue_token(unicodedata.normalize("NFD", "clé"), ["read"])
    assert [a.name for a in site.member.list_artifacts(PROJECT) if a.name.startswith("caf")] == [composed]


def test_the_home_database_and_store_are_the_servers_users_alone(site: Site, tmp_path: Path) -> None:
    data = tmp_path / "private.txt"
    data.write_text("a secret of research\n")
    site.member.upload_artifact(data, PROJECT, "private/secret.txt")
    home = site.server.home
    assert home.stat().st_mode & 0o777 == 0o700
    database = home.parent / "shipyard.db"
    assert database.stat().st_mode & 0o777 == 0o600
    made_by_the_server = [p for folder in ("store", "uploads") for p in (home / folder).rglob("*")]
    assert made_by_the_server and all(p.stat().st_mode & 0o077 == 0 for p in made_by_the_server)
