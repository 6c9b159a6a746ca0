"""The dashboard's sessions and the routes its pages share with the SDK, over real HTTP on both
databases: cookies and CSRF, redirects, the metric series and the job list's filters and pages.
(The pages themselves are driven in a browser in tests/browser.)"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import insert

from shipyard.client import Client
from shipyard.db import Attempt, Job, Metric
from shipyard.services.accounts import accounts
from shipyard.services.context import open_context
from shipyard.settings import Settings
from tests.builders import FakeClock, spec_dict
from tests.conftest import SHIPYARD, Cli, Server
from tests.support.ports import quiet_port

pytestmark = pytest.mark.integration

PASSWORD = "a long enough passphrase"


def login_csrf(browser: httpx.Client) -> str:
    """The CSRF token of the login form, as a browser gets it (with its pre-session cookie)."""
    return browser.get("/login").text.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def browser_session(server: Server, user: str = "admin", password: str | None = None) -> httpx.Client:
    browser = httpx.Client(base_url=server.url, follow_redirects=False)
    form = {"username": user, "password": password or server.admin_password, "next": "/jobs"}
    answer = browser.post("/login", data={**form, "csrf": login_csrf(browser)})
    assert answer.status_code == 303 and answer.headers["location"] == "/jobs"
    return browser


def session_cookie(browser: httpx.Client) -> str:
    return next(c.value for c in browser.cookies.jar if c.name == "shipyard_session" and c.value)


def csrf_of(browser: httpx.Client) -> str:
    page = browser.get("/jobs").text
    return page.split('data-csrf="', 1)[1].split('"', 1)[0]


def seed_history(server: Server, jobs: int, points: int) -> list[str]:
    """Jobs (each with one attempt and ``points`` training steps logged every 10) written
    straight into the database: a history no test could train in time."""
    ctx = open_context(Settings(home=server.home, db_url=server.env["SHIPYARD_DB_URL"]))
    ids = [f"seeded-{n:04d}" for n in range(jobs)]
    start = datetime.now(UTC) - timedelta(days=1)
    try:
        with ctx.db.transaction() as session:
            session.execute(
                insert(Job),
                [
                    {"id": job_id, "name": "seeded", "project": "default" if n % 2 else "research",
                     "queue": "default" if n % 3 else "batch", "priority": 0, "state": "succeeded",
                     "spec": spec_dict("seeded"), "devices": 1,
                     "accelerator_types": ["h100-sxm"] if n % 4 == 0 else ["cpu"], "run_dir": "/nonexistent",
                     "owner": "admin", "submitted_at": start + timedelta(seconds=n)}
                    for n, job_id in enumerate(ids)
                ],
            )  # fmt: skip
            session.execute(
                insert(Attempt),
                [
                    {"job_id": job_id, "number": 1, "state": "succeeded", "accelerator_type": "cpu",
                     "device_ids": [0], "threads_per_process": 1, "log_path": "/nonexistent"}
                    for job_id in ids
                ],
            )  # fmt: skip
        with ctx.db.read() as session:
            attempt_of = dict(session.query(Attempt.job_id, Attempt.id).all())
        with ctx.db.transaction() as session:
            session.execute(
                insert(Metric),
                [
                    {"job_id": job_id, "attempt_id": attempt_of[job_id], "kind": "train", "step": 10 * s,
                     "loss": 1.0 / s, "tokens_per_s": 100.0 + s, "mfu": 0.5, "values": {"mem_gib": s / 1000}}
                    for job_id in ids
                    for s in range(1, points + 1)
                ],
            )  # fmt: skip
    finally:
        ctx.close()
    return ids


def test_a_session_cookie_is_httponly_strict_and_sends_nobody_elsewhere(server: Server) -> None:
    with httpx.Client(base_url=server.url, follow_redirects=False) as browser:
        assert browser.get("/jobs").headers["location"] == "/login?next=/jobs"
        form = {"username": "admin", "password": server.admin_password, "next": "//evil.example/x"}
        answer = browser.post("/login", data={**form, "csrf": login_csrf(browser)})
        assert answer.headers["location"] == "/"  # never to another site
        cookie = next(
            c for c in answer.headers.get_list("set-cookie") if c.startswith("shipyard_session=")
        ).lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
        wrong = browser.post(
            "/login",
            data={"username": "admin", "password": "not it", "next": "/", "csrf": login_csrf(browser)},
        )
        assert wrong.status_code == 401 and "invalid user name or password" in wrong.text


def test_a_sign_in_takes_this_sites_form_only_and_no_api_token_is_a_sign_in_link(server: Server) -> None:
    form = {"username": "admin", "password": server.admin_password, "next": "/"}
    with httpx.Client(base_url=server.url, follow_redirects=False) as browser:
        forged = browser.post("/login", data={**form, "csrf": "0" * 64})  # no login form was shown
        assert forged.status_code == 403 and "shipyard_session" not in forged.headers.get("set-cookie", "")
        token = login_csrf(browser)
        elsewhere = browser.post(
            "/login", data={**form, "csrf": token}, headers={"Origin": "http://evil.example"}
        )
        assert elsewhere.status_code == 403 and "came from another site" in elsewhere.text
        assert browser.post("/login", data={**form, "csrf": token}).status_code == 303  # the real form
    with Client.login(server.url, "admin", server.admin_password)[0] as root:
        named = root.issue_token("dashboard sign-in link", ["read", "write", "admin"])
    with httpx.Client(base_url=server.url, follow_redirects=False) as browser:
        answer = browser.get("/login/link", params={"token": named.token})
        assert answer.status_code == 401
        assert not any(c.name == "shipyard_session" for c in browser.cookies.jar)


def test_an_expired_session_goes_back_to_the_login_form(server: Server) -> None:
    # Issued a day ago for one second, on the services' clock seam: the server finds it expired.
    yesterday = FakeClock(datetime.now(UTC) - timedelta(days=1))
    ctx = open_context(Settings(home=server.home, db_url=server.env["SHIPYARD_DB_URL"]), clock=yesterday)
    try:
        issued = accounts.issue_token(ctx, "admin", "web session", None, days=1 / 86400)
    finally:
        ctx.close()
    with httpx.Client(base_url=server.url, follow_redirects=False) as browser:
        browser.cookies.set("shipyard_session", issued.token)
        assert browser.get("/jobs?state=queued").headers["location"] == "/login?next=/jobs%3Fstate%3Dqueued"
        assert browser.get("/api/v1/jobs").status_code == 401


def test_the_api_takes_the_session_with_its_csrf_token_for_changes(server: Server) -> None:
    with Client.login(server.url, "admin", server.admin_password)[0] as root:
        job_id = root.submit_job(spec_dict("held", training={"steps": 2000})).id
    browser = browser_session(server)
    assert browser.get(f"/api/v1/jobs/{job_id}").json()["id"] == job_id  # reads need no token
    assert browser.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 403
    forged = browser.post(f"/api/v1/jobs/{job_id}/cancel", headers={"X-CSRF-Token": "f" * 64})
    assert forged.status_code == 403
    answer = browser.post(f"/api/v1/jobs/{job_id}/cancel", headers={"X-CSRF-Token": csrf_of(browser)})
    assert answer.status_code == 200
    # Signing out revokes the session: the same cookie and token no longer act.
    token, session = csrf_of(browser), session_cookie(browser)
    assert browser.post("/logout", data={"csrf": token}).headers["location"] == "/login"
    browser.close()
    with httpx.Client(base_url=server.url, cookies={"shipyard_session": session}) as stolen:
        assert (
            stolen.post(f"/api/v1/jobs/{job_id}/cancel", headers={"X-CSRF-Token": token}).status_code == 401
        )


def test_metric_series_are_downsampled_with_the_first_and_last_step(server: Server) -> None:
    [job_id] = seed_history(server, jobs=1, points=10_000)
    with Client.login(server.url, "admin", server.admin_password)[0] as root:
        whole = root.job_metrics(job_id, max_points=20_000)
        assert len(whole.step) == 10_000 and whole.stride == 10
        series = root.job_metrics(job_id, max_points=500)
        assert len(series.step) <= 500 and series.step[0] == 10 and series.step[-1] == 100_000
        assert series.step == sorted(series.step) and len(set(series.step)) == len(series.step)
        assert series.loss[0] == pytest.approx(1.0) and series.mem_gib[-1] == pytest.approx(10.0)
        newer = root.job_metrics(job_id, after_step=99_950)
        assert newer.step == [99_960, 99_970, 99_980, 99_990, 100_000]
        assert root.job_metrics(job_id, kind="eval").step == []
        summary = root.get_job(job_id).summary  # from an even sample of the 10,000 steps
        assert summary["train_loss_start"] == pytest.approx(1.0)
        assert summary["steps"] == 100_000


def test_the_job_list_filters_and_pages(server: Server) -> None:
    ids = seed_history(server, jobs=30, points=1)
    with Client.login(server.url, "admin", server.admin_password)[0] as root:
        newest_first = list(reversed(ids))
        pages = [root.list_jobs(limit=10, offset=offset) for offset in (0, 10, 20)]
        assert [j.id for page in pages for j in page] == newest_first
        research = root.list_jobs(limit=100, project="research", queue="batch")
        assert {j.id for j in research} == {i for n, i in enumerate(ids) if n % 2 == 0 and n % 3 == 0}
        h100 = root.list_jobs(limit=100, accelerator_type="h100-sxm")
        assert {j.id for j in h100} == {i for n, i in enumerate(ids) if n % 4 == 0}
        assert root.list_jobs(limit=100, owner="nobody") == []
    browser = browser_session(server)
    page = browser.get("/jobs", params={"project": "research", "page": 1}).text
    browser.close()
    assert "seeded-0000" in page and "seeded-0001" not in page


def test_shipyard_ui_serves_the_home_and_signs_in_by_a_link_that_works_once(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home")
    port = quiet_port()
    ui = subprocess.Popen(
        [*SHIPYARD, "ui", "--port", str(port), "--no-browser"], env=cli.env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert ui.stderr is not None
        line = ui.stderr.readline()  # printed once the server answers
        link = line.rsplit(": ", 1)[1].rstrip(")\n")
        with httpx.Client(follow_redirects=False) as browser:
            answer = browser.get(link)
            assert answer.status_code == 303 and answer.headers["location"] == "/"
            assert browser.get(f"http://127.0.0.1:{port}/jobs").status_code == 200
        with httpx.Client(follow_redirects=False) as copied:  # from the browser's history, say
            assert copied.get(link).status_code == 401
        for command in (["ui", "--no-browser"], ["server"]):  # a taken port: Error/Hint, no trace
            taken = cli.run(*command, "--port", str(port), check=False)
            assert taken.returncode == 1 and "Error: cannot listen" in taken.stderr, command
            assert "Hint:" in taken.stderr and "Errno" not in taken.stderr, command
    finally:
        ui.terminate()
        ui.wait(timeout=30)
        if ui.stderr:
            ui.stderr.close()
        cli.stop_agent()
