"""The local agent process: ``python -m shipyard.daemon`` (started on demand by ``supervisor``).

Holds the home's agent lock for its lifetime and, while it leads (``leader``: one scheduling loop
per database), runs ``agent.tick`` every poll interval. Beside it, a committer thread
copies checkpoints and exports into the artifact store as they are written (a multi-GB copy never
stalls scheduling) and the background scrubber verifies and repairs the store. It exits after a
while with nothing queued or running. Jobs run in their own sessions, so stopping the agent (even
kill -9) does not stop them: the next agent adopts those still running and the restart policy
requeues the others.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType

from shipyard import agent
from shipyard.agent.outputs import commit_outputs
from shipyard.daemon.leader import Leadership
from shipyard.daemon.supervisor import AGENT_LOCK, woken_within
from shipyard.domain.paths import PRIVATE_UMASK
from shipyard.executors.registry import engine_named
from shipyard.services.context import ServiceContext, local_actor, open_context
from shipyard.services.storage import health as store_health
from shipyard.services.storage.scrubber import scrub_in_background
from shipyard.settings import Settings

BUSY_SHARE_INVERSE = 4.0
"""Sleep at least this many times as long as the last pass took."""
COMMIT_POLL_S = 0.5
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
"""The agent's log (``agent.log`` in the home): each line with its time, so that what a fault
did can be read against when it happened."""

_log = logging.getLogger(__name__)


def commit_continuously(ctx: ServiceContext, stopping: threading.Event) -> None:
    """The committer: whatever the passes recorded goes to the store, until asked to stop and
    nothing is left."""
    while True:
        try:
            while commit_outputs(ctx):
                pass
        except Exception:  # a store that fails now may work at the next look
            _log.exception("could not commit outputs to the store; trying again")
        if stopping.wait(COMMIT_POLL_S):
            try:
                while commit_outputs(ctx):  # what the last pass recorded
                    pass
            except Exception:  # the next start commits it: outputs stay recorded until committed
                _log.exception("could not commit the last outputs to the store before stopping")
            return


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
    # A cluster's agent keeps the nodes' record current for the server: it never leaves idle.
    keeps_record = engine_named(settings.executor).shared_store
    leadership = Leadership(ctx.db)
    stopping_helpers = threading.Event()
    helpers = [
        threading.Thread(target=commit_continuously, args=(ctx, stopping_helpers), name="committer"),
        threading.Thread(target=scrub_in_background, args=(ctx, stopping_helpers), name="scrubber"),
    ]
    for helper in helpers:
        helper.start()
    _log.info("agent %s serving %s", agent_id, settings.home)
    leading: bool | None = None  # unknown until the first pass asks
    idle_since = time.monotonic()
    delay, last_fingerprint = settings.agent_poll_s, None
    woke = woken_within(settings, 0, -1.0)  # the wake file's time as this agent starts
    try:
        while not stopping:
            started = time.monotonic()
            if (leads := leadership.is_leader()) != leading:
                leading = leads
                _log.info("agent %s %s", agent_id, "schedules" if leading else "stands by")
            if not leading:  # another agent schedules; take over as soon as it stops
                time.sleep(settings.agent_poll_s)
                continue
            try:
                seen = agent.tick(ctx, agent_id)
            except Exception:  # keep serving: one bad record must not strand every job
                _log.exception("the agent's pass failed; the next one runs as usual")
                seen = agent.Pass(active=True, fingerprint=frozenset())
            spent = time.monotonic() - started
            if seen.active or store_health.owed(settings.home) is not None:  # jobs, or a repair owed
                idle_since = time.monotonic()
            elif not keeps_record and time.monotonic() - idle_since > settings.agent_idle_exit_s:
                break
            # Poll fast right after a change, then back off while jobs just run.
            changed = seen.fingerprint != last_fingerprint
            delay = settings.agent_poll_s if changed else min(delay * 2, settings.agent_max_poll_s)
            last_fingerprint = seen.fingerprint
            # A pass grows with the queue: with thousands of jobs waiting, passes back to back
            # would take a whole core from the jobs and the server; spend at most a fifth of it.
            touched = woken_within(settings, max(delay, BUSY_SHARE_INVERSE * spent), woke)
            if touched != woke:  # work arrived: pass now, and poll fast again
                delay, woke = settings.agent_poll_s, touched
    finally:
        stopping_helpers.set()
        for helper in helpers:
            helper.join()
        leadership.close()
        ctx.close()
        _log.info("agent %s stopped", agent_id)
    return 0


def main() -> int:
    os.umask(PRIVATE_UMASK)  # run folders, checkpoints and stored blobs: this user's alone
    logging.basicConfig(format=LOG_FORMAT, level=logging.WARNING, stream=sys.stdout, force=True)
    logging.getLogger("shipyard").setLevel(logging.INFO)
    return run(Settings.from_env())
