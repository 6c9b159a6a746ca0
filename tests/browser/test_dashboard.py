"""The web dashboard in a real browser: headless Chromium (Debian's, driven by Playwright) against
a real ``shipyard server`` training real jobs on this machine's CPU.

Every page is screenshotted into ``$SHIPYARD_TEST_ARTIFACTS`` (default ``tests/.artifacts``) and
checked with axe-core (no serious or critical violation). The tests skip, saying why, only where
Chromium or axe-core is absent (``make test`` installs both).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shipyard.api.ui.rendering import NAV
from shipyard.client import Client
from tests.builders import SMALL_CORPUS, spec_dict
from tests.conftest import Server

pytestmark = [pytest.mark.integration, pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
AXE = Path(__file__).resolve().parents[2] / ".venv" / "axe.min.js"
ARTIFACTS = Path(
    os.environ.get("SHIPYARD_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / ".artifacts")
)
PASSWORD = "a long enough passphrase"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip

if CHROMIUM is None:
    pytest.skip("Chromium is not installed (`make test` installs Debian's chromium)", allow_module_level=True)
if not AXE.exists():
    pytest.skip(f"axe-core is not at {AXE} (`make test` fetches it)", allow_module_level=True)
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")


def long_job(name: str, steps: int = 400) -> dict[str, Any]:
    """A CPU job that trains long enough to be watched (a step every few milliseconds, each
    logged) and holds both of this machine's cores, so a second job waits."""
    return spec_dict(
        name,
        training={"steps": steps, "eval_interval": 20, "log_interval": 1},
        resources={"accelerator": "cpu", "devices": 1, "cpus_per_device": os.cpu_count() or 2},
        checkpoint={"interval": 100, "keep": 1},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("dashboard") / "home"
    running = Server(home, f"sqlite:///{home.parent / 'shipyard.db'}", "correct horse battery staple")
    with Client.login(running.url, "admin", running.admin_password)[0] as root:
        root.create_user("vera", PASSWORD)
        root.set_role("default", "vera", "viewer")
        root.create_user("otto", PASSWORD)
        root.set_role("elsewhere", "otto", "member")
    yield running
    with Client.login(running.url, "admin", running.admin_password)[0] as root:
        for job in root.list_jobs(limit=1000):  # nothing trains on after the tests
            if job.state in ("queued", "running"):
                root.cancel_job(job.id)
        deadline = time.monotonic() + 120
        while any(j.state == "running" for j in root.list_jobs(limit=1000)) and time.monotonic() < deadline:
            time.sleep(0.5)
    running.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def admin_page(site: Server, browser: Any) -> Iterator[Any]:
    # axe-core is injected as an inline script, which the pages' CSP refuses: this context lets
    # it in (the tests of user text run under the CSP).
    context = browser.new_context(viewport={"width": 1366, "height": 900}, bypass_csp=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    sign_in(page, site, "admin", site.admin_password)
    yield page
    context.close()
    assert errors == [], errors  # no script failed on any page


def sign_in(page: Any, site: Server, user: str, password: str, then: str = "/") -> None:
    page.goto(f"{site.url}{then}")
    assert "/login" in page.url
    page.fill("#username", user)
    page.fill("#password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{site.url}{then}")


def checked(page: Any, name: str) -> None:
    """Screenshot the page and check it with axe-core: no serious or critical violation."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)
    page.add_script_tag(path=str(AXE))
    found = page.evaluate("async () => (await axe.run(document)).violations")
    serious = [
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}"
        for v in found
        if v["impact"] in ("serious", "critical")
    ]
    assert not serious, f"{name}: {serious}"


def points_drawn(page: Any, job_id: str) -> int:
    text = page.text_content(f"[data-points='{job_id}']") or ""
    return int(text.split()[0]) if text[:1].isdigit() else 0


def test_a_job_submitted_watched_and_cancelled_from_the_dashboard(site: Server, admin_page: Any) -> None:
    page = admin_page
    checked(page, "overview")
    page.goto(f"{site.url}/jobs")
    page.click("text=Submit a job")
    page.fill("#spec", json.dumps(long_job("watched")))  # JSON is YAML
    checked(page, "submit")
    page.click("form.submit button[type=submit]")
    page.wait_for_url(f"{site.url}/jobs/watched-*")
    job_id = page.url.rsplit("/", 1)[1]

    # The loss curve gains points while the job trains, without a reload.
    deadline = time.monotonic() + 180
    while points_drawn(page, job_id) < 5 and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    first = points_drawn(page, job_id)
    assert first >= 5, page.text_content("main")
    while points_drawn(page, job_id) <= first and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    assert points_drawn(page, job_id) > first
    assert page.locator(".charts canvas").count() >= 4  # loss, tokens/s, MFU, memory drawn by uPlot
    charts = "document.querySelector('.charts[data-job]').jobCharts"
    steps, train, evals = page.evaluate(f"{charts}.charts.loss.data")
    assert steps[0] == 0 and train[0] is None and evals[0] is not None  # the step-0 eval, no train point
    drawn, logged = page.evaluate(f"[{charts}.charts.mfu.data[1].at(-1), {charts}.train.mfu.at(-1)]")
    assert drawn == pytest.approx(100 * logged)  # MFU drawn in %, as its caption says
    page.wait_for_function("document.querySelector('#job-log').textContent.includes('step ')")
    checked(page, "job-running")

    # A second job waits for the cores the first holds; both pages say why.
    with Client.login(site.url, "admin", site.admin_password)[0] as root:
        waiting = root.submit_job(long_job("waiting", steps=20)).id
        deadline = time.monotonic() + 60
        # The scheduler's reason, once the agent has looked (not the placeholder of a new job).
        while (
            "insufficient" not in (root.get_job(waiting).pending_reason or "") and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        reason = root.get_job(waiting).pending_reason
    assert reason and "cpu" in reason
    page.goto(f"{site.url}/queues")
    assert reason in (page.text_content("main") or "")
    checked(page, "queues")
    page.goto(f"{site.url}/jobs?state=queued")
    assert waiting in (page.text_content("table.jobs") or "")
    checked(page, "jobs")
    page.goto(f"{site.url}/jobs/{waiting}")
    assert reason in (page.text_content("#job-live") or "")

    page.goto(f"{site.url}/jobs/{job_id}")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click("button.danger")  # Cancel, then thought better of it: nothing is sent
    page.wait_for_timeout(500)
    assert page.text_content("#job-live .state").strip() == "running"
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button.danger")  # Cancel, confirmed
    page.wait_for_function(
        "document.querySelector('#job-live .state').textContent.trim() === 'cancelled'", timeout=120_000
    )
    assert page.locator("#job-live .problem").count() == 0  # one's own cancel is no error
    page.reload()  # the checkpoint the cancel wrote offers a resume
    page.check("input[name=resume]")
    page.click("button:has-text('Resubmit')")
    page.wait_for_url(f"{site.url}/jobs/watched-*")
    resumed = page.url.rsplit("/", 1)[1]
    with Client.login(site.url, "admin", site.admin_password)[0] as root:
        resume_from = root.get_job(resumed).resume_from or ""
        assert resumed != job_id and f"/{job_id}/checkpoints/step_" in resume_from  # its newest checkpoint
        root.cancel_job(resumed)
        root.cancel_job(waiting)

    page.goto(f"{site.url}/audit?action=job.")
    log = page.text_content("table.audit") or ""
    assert f"job/{job_id}" in log and "job.cancel" in log and "job.submit" in log
    checked(page, "audit")


def test_a_model_version_is_promoted_and_compared(site: Server, admin_page: Any) -> None:
    with Client.login(site.url, "admin", site.admin_password)[0] as root:
        done = []
        for seed in (0, 1):
            spec = spec_dict(f"model-run-{seed}", training={"steps": 8, "seed": seed, "eval_interval": 4})
            done.append(root.submit_job(spec).id)
        deadline = time.monotonic() + 300
        while any(root.get_job(j).state != "succeeded" for j in done) and time.monotonic() < deadline:
            assert all(root.get_job(j).state in ("queued", "running", "succeeded") for j in done)
            time.sleep(1)
        for job_id in done:
            root.register_model(job_id, "tiny-coder")
        eval_loss = root.get_job(done[0]).eval_loss
    # Each job published its export by itself, as model-run-N: its final loss is its eval loss.
    admin_page.goto(f"{site.url}/models/model-run-0?project=default")
    assert eval_loss is not None
    assert (
        admin_page.text_content("tbody tr:has-text('v1') td:nth-of-type(4)") or ""
    ).strip() == f"{eval_loss:,.4f}"
    # Its job's page links the versions it produced, and every attempt's log to download.
    admin_page.goto(f"{site.url}/jobs/{done[0]}")
    outputs = admin_page.text_content("section:has(h2:text('Outputs'))") or ""
    assert "model-run-0 v1" in outputs and "tiny-coder v1" in outputs, outputs
    log = admin_page.request.get(f"{site.url}/jobs/{done[0]}/attempts/1/log")
    assert log.ok and "step 8/8" in log.text() and "attachment" in log.headers["content-disposition"]
    assert admin_page.request.get(f"{site.url}/jobs/{done[0]}/attempts/9/log").status == 404
    chunk = admin_page.request.get(f"{site.url}/api/v1/jobs/{done[0]}/logs?attempt=1").json()
    assert "step 8/8" in chunk["data"]  # the API reads any attempt's log too
    page = admin_page
    page.goto(f"{site.url}/models")
    checked(page, "models")
    page.click("a:has-text('tiny-coder')")
    page.wait_for_url(f"{site.url}/models/tiny-coder?project=default")
    assert page.locator("tbody th:has-text('v2')").count() == 1, page.text_content("main")
    page.select_option("#stage-2", "staging")
    page.click("#stage-2 ~ button")
    page.wait_for_url(f"{site.url}/models/tiny-coder?project=default")
    assert "staging" in (page.text_content("tbody tr:has-text('v2') .stage") or "")
    page.select_option("select[name=a]", "1")
    page.select_option("select[name=b]", "2")
    page.click("button:has-text('Compare')")
    page.wait_for_url(f"{site.url}/models/tiny-coder?project=default&a=1&b=2")
    page.wait_for_selector(".explorer canvas")
    differences = page.text_content("table.compare") or ""
    assert "Final training loss" in differences and "staging" in differences  # two seeds, two stages
    assert "metrics." not in differences and "estimate" not in differences  # words, not raw keys
    checked(page, "model")
    page.goto(f"{site.url}/audit?action=model.promote")
    assert "model/default/tiny-coder" in (page.text_content("table.audit") or "")
    for name in ("nodes", "storage", "planner"):
        page.goto(f"{site.url}/{name}")
        checked(page, name)
        if name == "nodes":  # the host's measured cost of an operation, which estimates plan with
            assert "an operation, as it measured itself" in (page.text_content("section.node") or "")
    page.goto(f"{site.url}/planner?params_b=70&tokens_b=100&devices=8")
    assert page.locator("li.unfit").count() > 0  # 70B on 8 devices does not fit every type: greyed out
    assert "needs" in (page.text_content("tr.unfit") or "")  # and says why
    prices = page.text_content("ul.prices") or ""  # what each cost rests on, and unlike prices named
    assert "h100-sxm: $2.5/h rental (" in prices and "built-in catalog" in prices
    assert "not like for like" in " ".join(page.locator("p.note").all_text_contents())
    # Every fitting bar carries its 80% range as an error bar, and overlapping ranges share a rank.
    chart = page.locator("figure.bars").first
    fitting = chart.locator("li.fits")
    assert fitting.count() > 0 and chart.locator(".whisker").count() == fitting.count()
    assert "80%:" in (fitting.first.text_content() or "")
    page.goto(f"{site.url}/planner?params_b=8&tokens_b=100&devices=8")  # where Hopper types tie on cost
    ranks = [cell.strip() for cell in page.locator("tbody tr.fits td:first-child").all_text_contents()]
    assert "2=" in ranks and "none is called better" in (page.text_content("main") or "")


def test_runs_overlaid_with_their_differing_settings_telemetry_and_usage(
    site: Server, admin_page: Any
) -> None:
    with Client.login(site.url, "admin", site.admin_password)[0] as root:
        runs = []
        for lr in (3e-3, 1e-3):
            spec = spec_dict("sweep", training={"steps": 12, "eval_interval": 6, "log_interval": 1})
            spec["training"]["optimizer"] = {"lr": lr}
            runs.append(root.submit_job(spec).id)
        deadline = time.monotonic() + 300
        while any(root.get_job(j).state != "succeeded" for j in runs) and time.monotonic() < deadline:
            time.sleep(1)
        attempt = root.get_job(runs[0]).attempts[0]
        usage = root.usage("user")
    page = admin_page
    page.goto(f"{site.url}/jobs?state=succeeded")
    for job_id in runs:  # ticked in the list, then compared
        page.check(f"input[value='{job_id}']")
    page.click("text=Compare ticked jobs")
    page.wait_for_url(f"{site.url}/compare?job=*")
    settings = page.text_content("table.settings-diff") or ""
    assert "Learning rate" in settings and "0.003" in settings and "0.001" in settings, settings
    assert "Steps" not in settings and "Sequence length" not in settings  # only what differs
    page.wait_for_function("(document.querySelector('.explorer').explored || {}).loss")
    loss = page.evaluate("document.querySelector('.explorer').explored.loss")
    assert len(loss) == 3 and all(v is not None for v in loss[1][1:]) and loss[1] != loss[2]  # two runs
    eval_loss = page.evaluate("document.querySelector('.explorer').explored.eval_loss")
    assert eval_loss[0][0] == 0  # the step-0 eval on its own step
    page.fill("input[name=smoothing]", "0.6")
    page.dispatch_event("input[name=smoothing]", "input")
    smoothed = page.evaluate("document.querySelector('.explorer').explored.loss")
    assert len(smoothed) == 5 and smoothed[1] == loss[1] and smoothed[2] != loss[1]  # raw behind smoothed
    checked(page, "compare")

    # A GPU's telemetry as NVML would report it (this machine has none: written at the seam, the
    # database, as an agent on a GPU node writes it) is drawn on the job page, throttling named.
    started = attempt.started_at.timestamp()
    with sqlite3.connect(site.home.parent / "shipyard.db") as db:
        db.executemany(
            "INSERT INTO device_samples (node, device, at, utilization, memory_gib, power_w, temperature_c,"
            " clock_mhz, throttle) VALUES (?, '0', ?, ?, 61.0, 690.0, ?, 1980.0, ?)",
            [(attempt.node, started + 0.1 * i, 0.9, 70.0 + i, "thermal (hardware)" if i == 3 else None)
             for i in range(5)],
        )  # fmt: skip
        db.execute(
            "UPDATE attempts SET accelerator_type = 'h100-sxm', device_ids = '[0]' WHERE job_id = ?",
            (runs[0],),
        )
    page.goto(f"{site.url}/jobs/{runs[0]}")
    page.wait_for_selector("[data-telemetry] canvas")
    drawn = page.evaluate("document.querySelector('[data-telemetry]').drawnTelemetry")
    assert drawn[0]["device"] == "0" and drawn[0]["power_w"][0] == 690.0
    assert "thermal (hardware)" in (page.text_content("[data-telemetry] .reason") or "")
    page.wait_for_function("document.querySelector('#job-log').textContent.includes('step 12/12')")
    page.fill("input[data-log-search]", "eval step")
    assert (page.text_content("#log-count") or "") == "3 matching lines"  # steps 0, 6 and 12
    checked(page, "job-telemetry")

    # Usage: the page's total is what the API says (tested against a hand-computed case in the unit
    # tests), and it opens without error for every grouping.
    page.goto(f"{site.url}/usage?by=user&days=7")
    total = float(page.get_attribute("[data-total-hours]", "data-total-hours") or "nan")
    assert total >= usage.device_hours > 0
    assert "admin" in (page.text_content("table.usage") or "")
    checked(page, "usage")
    page.goto(f"{site.url}/nodes")
    page.click("details.telemetry summary")
    page.wait_for_selector("details.telemetry canvas")  # the agent's own /proc samples of this machine
    checked(page, "nodes-telemetry")


def test_a_viewer_sees_no_cancel_and_a_forged_cancel_is_refused(site: Server, browser: Any) -> None:
    with Client.login(site.url, "admin", site.admin_password)[0] as root:
        job_id = root.submit_job(long_job("guarded", steps=2000)).id
    context = browser.new_context()
    page = context.new_page()
    sign_in(page, site, "vera", PASSWORD, then=f"/jobs/{job_id}")
    assert page.locator("button.danger").count() == 0  # no Cancel for a viewer
    csrf = page.get_attribute("body", "data-csrf")
    # Forged: the viewer's own session and CSRF token, posting what the page does not offer.
    answer = page.request.post(f"{site.url}/jobs/{job_id}/cancel", form={"csrf": csrf})
    assert answer.status == 403
    # Without the token (another site's form), and with another session's token.
    assert page.request.post(f"{site.url}/jobs/{job_id}/cancel", form={}).status == 403
    assert page.request.post(f"{site.url}/jobs/{job_id}/cancel", form={"csrf": "0" * 64}).status == 403
    # The API under the session cookie wants the token in a header too.
    assert page.request.post(f"{site.url}/api/v1/jobs/{job_id}/cancel").status == 403
    with Client.login(site.url, "admin", site.admin_password)[0] as root:
        assert root.get_job(job_id).state in ("queued", "running")
        root.cancel_job(job_id)

    # A job of a project one has no role in is not found, not forbidden.
    other = browser.new_context()
    stranger = other.new_page()
    sign_in(stranger, site, "otto", PASSWORD)
    assert stranger.goto(f"{site.url}/jobs/{job_id}").status == 404
    assert stranger.goto(f"{site.url}/jobs/no-such-job").status == 404
    other.close()

    # Signing out ends the session: its cookie, replayed, is sent to the login form.
    cookie = next(c for c in context.cookies() if c["name"] == "shipyard_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    page.click("text=Sign out")
    page.wait_for_url(f"{site.url}/login")
    replay = browser.new_context()
    replay.add_cookies([cookie])
    again = replay.new_page()
    again.goto(f"{site.url}/jobs/{job_id}")
    assert "/login" in again.url
    replay.close()
    context.close()


def test_user_text_is_shown_as_text_everywhere(site: Server, browser: Any) -> None:
    script = "<script>window.__owned = 1</script><img src=x onerror='window.__owned=2'>"
    context = browser.new_context()
    page = context.new_page()
    refused: list[str] = []  # what the CSP blocked: nothing, as nothing was markup
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    # A user name is audited as typed, even when the login fails.
    page.goto(f"{site.url}/login")
    page.fill("#username", script[:64])
    page.fill("#password", "wrong")
    page.click("button[type=submit]")
    assert page.evaluate("window.__owned") is None
    sign_in(page, site, "admin", site.admin_password, then="/submit")
    # A spec whose every text field carries markup: refused, the message shown as text.
    bad = spec_dict(script, project=script, queue=script, data={"paths": [script, *SMALL_CORPUS]})
    page.fill("#spec", json.dumps(bad))
    page.click("form.submit button[type=submit]")
    assert "<script>" in (page.text_content("[role=alert]") or "")
    # A log line with markup (whatever a training process prints reaches the page).
    with Client.login(site.url, "admin", site.admin_password)[0] as root:
        job_id = root.submit_job(spec_dict("echo", training={"steps": 4})).id
        deadline = time.monotonic() + 120
        while not root.get_job(job_id).attempts and time.monotonic() < deadline:
            time.sleep(0.5)
        log = Path(root.get_job(job_id).attempts[-1].log_path)
    with log.open("a") as handle:
        handle.write(script + "\n")
    page.goto(f"{site.url}/jobs/{job_id}")
    # A locator waits in Playwright's own world; a string predicate would be polled with eval,
    # which this page's CSP (rightly) refuses.
    page.locator("pre.log", has_text="window.__owned").wait_for()
    page.goto(f"{site.url}/audit")
    assert "<script>" in (page.text_content("table.audit") or "")
    for path in ("/", "/jobs", f"/jobs/{job_id}", "/audit", "/queues"):
        page.goto(f"{site.url}{path}")
        page.wait_for_timeout(300)
        assert page.evaluate("window.__owned") is None, path
    assert refused == []
    response = page.goto(f"{site.url}/jobs")
    assert response is not None and "script-src 'self'" in response.headers["content-security-policy"]
    context.close()


def test_offline_api_docs_and_no_asset_from_elsewhere(site: Server, admin_page: Any) -> None:
    page = admin_page
    foreign: list[str] = []
    local = (site.url, "blob:", "data:")  # a page's own generated objects are not fetched
    page.on("request", lambda r: foreign.append(r.url) if not r.url.startswith(local) else None)
    page.goto(f"{site.url}/docs")
    page.wait_for_selector(".swagger-ui .opblock", timeout=30_000)
    for path in ("/", "/jobs", "/planner"):
        page.goto(f"{site.url}{path}")
    assert foreign == [], foreign


def test_another_site_cannot_sign_a_browser_in_as_its_attacker(site: Server, browser: Any) -> None:
    """Login CSRF: a page elsewhere posts the attacker's own name and password to /login from the
    victim's browser (which has seen the login form before). The browser stays signed out: the
    form's token rode in a SameSite=Strict cookie the cross-site post does not carry, and the
    post's Origin names the other site."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    trap = (
        f'<!doctype html><form id="f" method="post" action="{site.url}/login">'
        f'<input name="username" value="otto"><input name="password" value="{PASSWORD}">'
        '<input name="next" value="/jobs"><input name="csrf" value=""></form>'
        "<script>document.getElementById('f').submit()</script>"
    ).encode()

    class Attacker(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(trap)))
            self.end_headers()
            self.wfile.write(trap)

        def log_message(self, *_: Any) -> None:
            pass

    elsewhere = HTTPServer(("127.0.0.2", 0), Attacker)  # another site: another host
    threading.Thread(target=elsewhere.serve_forever, daemon=True).start()
    context = browser.new_context()
    try:
        victim = context.new_page()
        victim.goto(f"{site.url}/login")  # the victim has a login form's cookie already
        with victim.expect_navigation(url=f"{site.url}/login"):
            victim.goto(f"http://127.0.0.2:{elsewhere.server_address[1]}/")
        assert "came from another site" in (victim.text_content("[role=alert]") or "")
        assert not [c for c in context.cookies() if c["name"] == "shipyard_session"]
        victim.goto(f"{site.url}/jobs")
        assert "/login" in victim.url  # still nobody's session
    finally:
        context.close()
        elsewhere.shutdown()
        elsewhere.server_close()


def test_every_page_fits_a_phone_and_follows_a_dark_system_theme(site: Server, browser: Any) -> None:
    with Client.login(site.url, "admin", site.admin_password)[0] as root:
        job_id = root.submit_job(spec_dict("phone", training={"steps": 4})).id
        other = root.submit_job(spec_dict("phone-b", training={"steps": 6, "seq_len": 32})).id
        models = root.list_models()
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, color_scheme="dark", bypass_csp=True
    )
    page = context.new_page()
    try:
        sign_in(page, site, "admin", site.admin_password)
        paths = [path for _, path, _ in NAV] + [
            f"/jobs/{job_id}",
            "/submit",
            f"/compare?job={job_id}&job={other}",
        ]
        paths += [f"/models/{m.name}?project={m.project}" for m in models[:1]]
        for path in paths:
            page.goto(f"{site.url}{path}")
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= 390, f"{path} scrolls sideways at 390 px: {wide} px wide"
        assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(18, 21, 25)"
        page.goto(f"{site.url}/jobs")
        checked(page, "jobs-dark-phone")  # contrast holds in the dark theme too
        page.goto(f"{site.url}/jobs/{job_id}")
        checked(page, "job-dark-phone")
    finally:
        context.close()
