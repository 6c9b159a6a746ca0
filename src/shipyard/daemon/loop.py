"""The local agent process: ``python -m shipyard.daemon`` (started on demand by ``supervisor``).

Holds the home's agent lock for its lifetime and, while it leads (``leader``: one scheduling loop
per database), runs ``services.agent.tick`` every poll interval; it
exits after a while with nothing queued or running. Jobs run in their own sessions, so stopping the
agent does not stop them: the next agent adopts them.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
import traceback
from types import FrameType

from shipyard.daemon.leader import Leadership
from shipyard.daemon.supervisor import AGENT_LOCK
from shipyard.services import agent
from shipyard.services.context import local_actor, open_context
from shipyard.settings import Settings

BUSY_SHARE_INVERSE = 4.0
"""Sleep at least this many times as long as the last pass took."""


def run(settings: Settings) -> int:
    settings.home.mkdir(parents=True, exist_ok=True)
    lock = open(settings.home / AGENT_LOCK, "a")  # noqa: SIM115 - held for the process lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another agent serves this home
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    ctx = open_context(settings, actor=local_actor("agent"))
    agent_id = f"{os.uname().nodename}:{os.getpid()}"
    ctx.executor.nodes()  # discover devices before the first pass, so its time measures the queue
    leadership = Leadership(ctx.db)
    print(f"agent {agent_id} serving {settings.home}", flush=True)
    leading: bool | None = None  # unknown until the first pass asks
    idle_since = time.monotonic()
    delay, last_fingerprint = settings.agent_poll_s, None
    try:
        while not stopping:
            started = time.monotonic()
            if (leads := leadership.is_leader()) != leading:
                leading = leads
                print(f"agent {agent_id} {'schedules' if leading else 'stands by'}", flush=True)
            if not leading:  # another agent schedules; take over when it stops
                time.sleep(settings.agent_max_poll_s)
                continue
            try:
                seen = agent.tick(ctx, agent_id)
            except Exception:  # keep serving: one bad record must not strand every job
                traceback.print_exc()
                seen = agent.Pass(active=True, fingerprint=frozenset())
            spent = time.monotonic() - started
            if seen.active:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > settings.agent_idle_exit_s:
                break
            # Poll fast right after a change, then back off while jobs just run.
            changed = seen.fingerprint != last_fingerprint
            delay = settings.agent_poll_s if changed else min(delay * 2, settings.agent_max_poll_s)
            last_fingerprint = seen.fingerprint
            # A pass grows with the queue: with thousands of jobs waiting, passes back to back
            # would take a whole core from the jobs and the server; spend at most a fifth of it.
            time.sleep(max(delay, BUSY_SHARE_INVERSE * spent))
    finally:
        leadership.close()
        ctx.close()
        print(f"agent {agent_id} stopped", flush=True)
    return 0


def main() -> int:
    return run(Settings.from_env())
