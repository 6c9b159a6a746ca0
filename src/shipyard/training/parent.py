"""The parent of an attempt's training processes: ``python -m shipyard.training.parent RUN_DIR --
COMMAND...``.

An agent that launched an attempt can ``wait()`` for it and learn how it ended; an agent that
adopted it after a restart cannot (only a parent can), and used to record every such ending as
``lost``. This small process is the attempt's parent instead, as conmon or containerd's shim are
a container's: it starts the command, outlives any agent, waits for it, and writes how it ended
(exit code or signal, and whether the kernel's OOM killer acted meanwhile) atomically into
``RUN_DIR/exit.json``, where the next agent reads it. Then it ends the same way (the same code,
or killed by the same signal), so that an agent waiting on it sees what it would have seen of
the command.

It leads the process group the agent signals (the command stays in it) and ignores what the
agent asks of the command (SIGTERM to checkpoint and stop, SIGUSR1 for stacks); SIGKILL of the
group takes it too, and then the agent knows it sent it. Standard library only: it lives as long
as the attempt and should cost nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

EXIT_FILE = "exit.json"
"""Also ``schemas.launch.EXIT_FILE`` (a test keeps the two the same; nothing is imported here)."""
_ASKED_OF_THE_COMMAND = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)


def oom_kills() -> int | None:
    """The OOM killer's kills in this process's cgroup so far (cgroup v2 ``memory.events``, or v1
    ``memory.oom_control``), or None where neither can be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        candidates = []
        if controllers == "":  # v2: one unified hierarchy
            candidates.append(Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events")
        if "memory" in controllers.split(","):
            candidates.append(Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control")
        for events in candidates:
            try:
                for entry in events.read_text().splitlines():
                    key, _, value = entry.partition(" ")
                    if key == "oom_kill":
                        return int(value)
            except (OSError, ValueError):
                continue
    return None


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m shipyard.training.parent RUN_DIR -- COMMAND...", file=sys.stderr)
        return 2
    run_dir, command = Path(argv[0]), argv[2:]
    for asked in _ASKED_OF_THE_COMMAND:
        signal.signal(asked, signal.SIG_IGN)
    before = oom_kills()
    # The command gets the default dispositions back (an ignored signal stays ignored across exec).
    child = subprocess.Popen(command, restore_signals=True, preexec_fn=_default_signals)
    code = child.wait()
    after = oom_kills()
    ended = {
        "parent_pid": os.getpid(),
        "pid": child.pid,
        "exit_code": code,
        "signal": _name(-code) if code < 0 else None,
        "oom_kills": after - before if before is not None and after is not None else None,
        "ended_at": time.time(),
    }
    tmp = run_dir / f".{EXIT_FILE}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(ended, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, run_dir / EXIT_FILE)
    if code < 0:  # end as the command did: killed by its signal
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's disposition is the default
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _default_signals() -> None:
    for asked in _ASKED_OF_THE_COMMAND:
        signal.signal(asked, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
