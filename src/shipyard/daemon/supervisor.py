"""One agent per ``$SHIPYARD_HOME``: a file lock tells whether one runs, and a ``Supervisor``
starts one (a background ``python -m shipyard.daemon``) when jobs are queued and none does."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

from shipyard.settings import Settings

AGENT_LOCK = "agent.lock"
AGENT_LOG = "agent.log"
AGENT_WAKE = "agent.wake"
"""Touched when work arrives for a running agent: it ends its wait between passes (a backed-off
agent would otherwise leave a new job waiting up to ``agent_max_poll_s``)."""
SPAWN_GRACE_S = 15.0
"""An agent takes a few seconds to start and take its lock; a busy server must not start
another one on every submission meanwhile (each costs a Python start on a loaded machine)."""


def is_running(settings: Settings) -> bool:
    """Whether an agent holds this home's lock."""
    path = settings.home / AGENT_LOCK
    if not path.exists():
        return False
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def wake(settings: Settings) -> None:
    """Tell this home's agent that work arrived (best effort: it polls anyway)."""
    with contextlib.suppress(OSError):
        (settings.home / AGENT_WAKE).touch()


def woken_within(settings: Settings, seconds: float, since: float) -> float:
    """Wait up to ``seconds``, less if ``wake`` is called meanwhile; the wake file's time, which
    the next wait passes as ``since`` (a stat every 50 ms costs nothing a pass would notice)."""
    path = settings.home / AGENT_WAKE
    deadline = time.monotonic() + seconds
    while True:
        try:
            touched = path.stat().st_mtime
        except OSError:
            touched = since
        if touched != since or time.monotonic() >= deadline:
            return touched
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


class Supervisor:
    """Starts a home's agent on demand; the process that submits work holds one (the server, or
    the CLI). It is the ``start_agent`` a ``ServiceContext`` calls once jobs are queued."""

    def __init__(self) -> None:
        self._spawned: dict[Path, float] = {}
        """When this process last started an agent, per home."""

    def __call__(self, settings: Settings) -> None:
        """Start a background agent for this home unless one runs (a second one exits at once)."""
        if is_running(settings):
            # It started: if it is gone at a later call, it died, and no grace is owed to it.
            self._spawned.pop(settings.home, None)
            wake(settings)
            return
        now = time.monotonic()
        if now - self._spawned.get(settings.home, -SPAWN_GRACE_S) < SPAWN_GRACE_S:
            return
        self._spawned[settings.home] = now
        settings.home.mkdir(parents=True, exist_ok=True)
        with open(settings.home / AGENT_LOG, "ab") as log:
            subprocess.Popen(
                [sys.executable, "-m", "shipyard.daemon"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "SHIPYARD_HOME": str(settings.home), "SHIPYARD_DB_URL": settings.db_url},
                start_new_session=True,
            )
