from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import STDLIB
from tests.support.ports import quiet_port

SHIPYARD = [sys.executable, "-m", "shipyard.cli.main"]
SHOW_EVERY_S = 15.0
"""How often ``Cli.wait_for`` runs ``jobs show`` while it reads the job in-process meanwhile."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``pytest -n`` the Ray tests share one worker: two Ray heads on one machine would
    contend for the head's fixed ports and the session folder. A test that measures speed is
    skipped there: the other workers' load would be measured too."""
    parallel = "PYTEST_XDIST_WORKER" in os.environ
    alone = pytest.mark.skip(reason="measures speed: runs alone (`make test` runs it after the parallel run)")
    for item in items:
        if item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.xdist_group("ray"))
        if parallel and item.get_closest_marker("serial"):
            item.add_marker(alone)


class Cli:
    """Runs the real ``shipyard`` command in a child process against one home."""

    def __init__(self, home: Path, *, processes: bool = False) -> None:
        self.home = home
        self.processes = processes
        """Every call a process of its own, where the test counts or times the processes."""
        self.env = {
            **os.environ,
            "SHIPYARD_HOME": str(home),
            "SHIPYARD_AGENT_POLL_S": "0.2",
            "SHIPYARD_AGENT_IDLE_EXIT_S": "3",
            "SHIPYARD_CANCEL_GRACE_S": "30",
            "COLUMNS": "200",
        }
        self.env.pop("SHIPYARD_DEBUG", None)
        self.env.pop("SHIPYARD_DB_URL", None)

    def run(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        if not self.processes and _in_process(args, self.env):
            done = _run_in_process(args, self.env)
        else:
            done = subprocess.run(
                [*SHIPYARD, *args], capture_output=True, text=True, env=self.env, timeout=timeout
            )
        if check and done.returncode != 0:
            raise AssertionError(
                f"shipyard {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json").stdout)

    def wait_for(self, job_id: str, predicate: Any, timeout: float = 240) -> dict[str, Any]:
        """What ``jobs show --json`` printed once it met ``predicate``. Between those calls (a
        second of CPU each, which the jobs under test would otherwise lose) the job is read here
        from the same database; the CLI still runs every ``SHOW_EVERY_S``, reviving the agent as
        a user watching the job would (an agent outlives its live jobs by itself)."""
        deadline = time.monotonic() + timeout
        next_show = 0.0
        served_here = "SHIPYARD_URL" not in self.env  # else only the CLI can see the job
        while True:
            if not served_here or time.monotonic() >= next_show or predicate(self._read(job_id)):
                job = self.json("jobs", "show", job_id)
                if predicate(job):
                    return job  # type: ignore[no-any-return]
                next_show = time.monotonic() + SHOW_EVERY_S
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} never reached the condition; last: {job}")
            time.sleep(0.3)

    def _read(self, job_id: str) -> dict[str, Any]:
        # A context per read: a Cli made inside a test has no teardown to close one it kept.
        from shipyard.services.context import open_context
        from shipyard.services.jobs import jobs as job_service
        from shipyard.settings import Settings

        context = open_context(Settings.from_env(self.env))
        try:
            return job_service.get(context, job_id).model_dump(mode="json")
        finally:
            context.close()

    def stop_agent(self) -> None:
        """SIGTERM every agent of this home: found by its environment, not by ``agent.lock``, which
        an agent started a moment ago has not written yet."""
        for pid in agents_of(self.home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


OWN_PROCESS = frozenset({"server", "node", "ui", "agent"})
"""Commands that start long-lived processes, run in a process of their own as a user runs them."""


def _in_process(args: tuple[str, ...], env: dict[str, str]) -> bool:
    """Whether ``shipyard ARGS`` runs in this process: the same ``main`` a user's command runs,
    without a second of interpreter start a call. Not from a thread (the environment and the
    standard streams are swapped for the call), not where the command would join a Ray cluster
    in this process, and never with ``SHIPYARD_TEST_CLI_PROCESSES=1`` (every call a process)."""
    return (
        threading.current_thread() is threading.main_thread()
        and os.environ.get("SHIPYARD_TEST_CLI_PROCESSES") != "1"
        and not (args and args[0] in OWN_PROCESS)
        and env.get("SHIPYARD_EXECUTOR", "local") == "local"
    )


def _run_in_process(args: tuple[str, ...], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``shipyard ARGS`` through the CLI's ``main`` here, under ``env``, its output captured and
    its exit code returned as a process's would be (an escaped exception is exit 1, as there)."""
    from shipyard.cli import _output, main

    streams = [io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in range(3)]
    saved = dict(os.environ), sys.argv, (sys.stdin, sys.stdout, sys.stderr)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["shipyard", *args]
    sys.stdin, sys.stdout, sys.stderr = streams
    width = int(env.get("COLUMNS", "80"))
    consoles = (_output.console, _output.err_console)
    widths = [console.width for console in consoles]
    for console in consoles:  # made at import, under another environment
        console.width = width
    code = 0
    try:
        with warnings.catch_warnings():
            # The agent a command starts outlives the call, as it outlives a command's process;
            # the database connections a command leaves open a process's exit would close.
            warnings.filterwarnings("ignore", "subprocess .* is still running", ResourceWarning)
            warnings.filterwarnings("ignore", ".* was deleted while still open", ResourceWarning)
            warnings.filterwarnings("ignore", "unclosed", ResourceWarning)
            try:
                main.main()
            finally:
                gc.collect()  # here, not in a later test that would take the warning for its own
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    except Exception:  # what a process would print, exiting 1
        traceback.print_exc()
        code = 1
    finally:
        os.environ.clear()
        os.environ.update(saved[0])
        sys.argv = saved[1]
        sys.stdin, sys.stdout, sys.stderr = saved[2]
        for console, before in zip(consoles, widths, strict=True):
            console.width = before
    out, err = (stream.buffer.getvalue().decode("utf-8", "replace") for stream in streams[1:])  # type: ignore[attr-defined]
    return subprocess.CompletedProcess([*SHIPYARD, *args], code, out, err)


def agents_of(home: Path) -> list[int]:
    """The ``shipyard.daemon`` processes serving ``home``."""
    wanted = f"SHIPYARD_HOME={home}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if b"shipyard.daemon" in (proc / "cmdline").read_bytes() and wanted in (
                proc / "environ"
            ).read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    runner = Cli(tmp_path / "home")
    yield runner
    runner.stop_agent()


POSTGRES_ADMIN_URL = os.environ.get(
    "SHIPYARD_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
"""The development and CI machines run PostgreSQL 15 on loopback with trust authentication."""


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    import secrets

    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    name = f"shipyard_test_{secrets.token_hex(4)}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL}: {exc.orig}")
    try:
        yield POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each database test runs on the embedded SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shipyard.db'}"
    return str(request.getfixturevalue("postgres_url"))


class Server:
    """A real ``shipyard server`` (uvicorn) on a free loopback port, with its own home."""

    def __init__(
        self,
        home: Path,
        db_url: str,
        admin_password: str,
        queues_yaml: str | None = None,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
    ) -> None:

        home.mkdir(parents=True, exist_ok=True)
        if queues_yaml is not None:
            (home / "queues.yaml").write_text(queues_yaml)
        if not (home / "server.yaml").exists():  # jobs through the server read the test corpus
            (home / "server.yaml").write_text(f'data_roots: {{"*": ["{STDLIB}"]}}\n')

        self.home = home
        self.admin_password = admin_password
        self.env = {
            **Cli(home).env,
            "SHIPYARD_DB_URL": db_url,
            "SHIPYARD_INIT_ADMIN": f"admin:{admin_password}",
            **(env or {}),
        }
        # A free port is only free until someone else binds it: another test's process can take
        # it between the probe and the server's listen, so a lost race picks another port.
        for _ in range(5):
            self.port = quiet_port()
            self.url = f"http://127.0.0.1:{self.port}"
            # Into a file, not a pipe nobody reads: a server that logs more than a pipe holds
            # would block on its next line (a run of logged errors once hung every request).
            self.log = home.parent / f"server-{self.port}.log"
            with open(self.log, "w") as log:
                self.process = subprocess.Popen(
                    [*SHIPYARD, "server", "--port", str(self.port), *(args or [])],
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            if self._wait_ready():
                return
        raise AssertionError(f"no free port held: {self.log.read_text()}")

    def _wait_ready(self, timeout: float = 60) -> bool:
        """True once the server answers; False when its port was taken before it listened."""
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output = self.log.read_text()
                if "Address already in use" in output:
                    return False
                raise AssertionError(f"server exited: {output}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return True
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError("server did not start in time")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        Cli(self.home).stop_agent()


@pytest.fixture
def server(tmp_path: Path, db_url: str) -> Iterator[Server]:
    running = Server(tmp_path / "server-home", db_url, "correct horse battery staple")
    yield running
    running.stop()


def seed_finished_job(server: Server, name: str, project: str, owner: str) -> tuple[str, int]:
    """A job that succeeded with an export (a folder with a config.json), written straight into
    the server's database: no training run needed. -> (job id, export artifact id)."""
    import secrets

    from shipyard.db import Artifact, Job
    from shipyard.services.context import open_context
    from shipyard.settings import Settings
    from tests.builders import spec_dict

    tag = secrets.token_hex(3)
    export = server.home / "exports" / tag
    export.mkdir(parents=True)
    (export / "config.json").write_text('{"model_type": "llama"}')
    ctx = open_context(Settings(home=server.home, db_url=server.env["SHIPYARD_DB_URL"]))
    try:
        with ctx.db.transaction() as session:
            job_id = f"{name}-{tag}"
            session.add(
                Job(id=job_id, name=name, project=project, queue="default", state="succeeded",
                    spec=spec_dict(name, project=project), devices=1, accelerator_types=["cpu"],
                    run_dir=str(export), owner=owner)
            )  # fmt: skip
            session.flush()
            artifact = Artifact(job_id=job_id, kind="export", path=str(export), step=1, size_bytes=23)
            session.add(artifact)
            session.flush()
            return job_id, artifact.id
    finally:
        ctx.close()


def seed_model_version(server: Server, name: str, project: str, owner: str) -> int:
    """A model version as a finished job of ``owner``'s leaves one."""
    from sqlalchemy import func, select

    from shipyard.db import ModelVersion
    from shipyard.services.context import open_context
    from shipyard.settings import Settings

    job_id, artifact_id = seed_finished_job(server, name, project, owner)
    ctx = open_context(Settings(home=server.home, db_url=server.env["SHIPYARD_DB_URL"]))
    try:
        with ctx.db.transaction() as session:
            latest = session.scalar(
                select(func.max(ModelVersion.version)).where(
                    ModelVersion.project == project, ModelVersion.name == name
                )
            )
            version = (latest or 0) + 1
            session.add(
                ModelVersion(name=name, version=version, project=project, job_id=job_id,
                             artifact_id=artifact_id, step=1, metrics={})
            )  # fmt: skip
            return version
    finally:
        ctx.close()
