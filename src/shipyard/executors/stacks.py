"""A process's Python stacks, read from outside it.

A hung process is often one that can run no handler: stopped (SIGSTOP, a debugger), or frozen
in a deadlock that holds the interpreter. ``faulthandler`` on SIGUSR1 writes nothing for those.
py-spy reads the interpreter's memory from outside (``dump --nonblocking``: without pausing it,
so a stopped process is read as it stands), every thread, Python frames with their lines.
Where it cannot (not installed, no right to trace the process), the caller falls back to the
signal, which a live process answers into its own log.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

DUMP_S = 20.0
"""Longest a dump may take (py-spy reads a few pages of memory; a huge process takes longer)."""


def python_stacks(pid: int) -> str | None:
    """Every thread's stack of process ``pid``, or None where py-spy cannot read it."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return None
    try:
        done = subprocess.run(
            [spy, "dump", "--pid", str(pid), "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=DUMP_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and "Thread" in done.stdout else None
