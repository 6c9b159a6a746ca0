"""What Linux's ``/proc`` says of a process: its state, parent and start time, whether it has
ended, its group and what it runs; and the signals sent to a group. Where ``/proc`` is absent
these answer "unknown" and callers fall back on waiting."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (its state first, then its
    parent, group, …), or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()  # the name may hold spaces and parentheses


def has_ended(pid: int) -> bool:
    """Whether the process is gone or a zombie nobody reaped (False where ``/proc`` is absent:
    nothing is known)."""
    if not Path("/proc/self").exists():
        return False
    fields = stat_fields(pid)
    return fields is None or fields[0] == "Z"


def descendants(pids: list[int]) -> list[int]:
    """``pids`` and every process below them, parents first."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(ValueError, IndexError, TypeError):
            fields = stat_fields(int(proc.name))
            children.setdefault(int(fields[1]), []).append(int(proc.name))  # type: ignore[index]
    found: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop(0)
        if pid not in found:
            found.append(pid)
            todo.extend(children.get(pid, []))
    return found


def launched_for(run_dir: str) -> tuple[int, int | None] | None:
    """The attempt's parent process (``python -m shipyard.training.parent RUN_DIR``, the leader
    of its own session) for a run folder, with its start time."""
    wanted = [b"-m", b"shipyard.training.parent", run_dir.encode()]
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # ended meanwhile
        fields = stat_fields(int(proc.name))
        if argv[1:4] == wanted and fields is not None and int(fields[3]) == int(proc.name):
            return int(proc.name), int(fields[19])
    return None


def start_time(pid: int) -> int | None:
    """When the process started, in clock ticks after boot (Linux ``/proc/PID/stat`` field 22)."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields else None


def group_members(pgid: int) -> list[int]:
    """The processes of a process group (Linux); just the leader where ``/proc`` is absent."""
    members = []
    for proc in Path("/proc").glob("[0-9]*"):
        fields = stat_fields(int(proc.name))
        if fields and int(fields[2]) == pgid:  # None: ended meanwhile
            members.append(int(proc.name))
    return members or [pgid]


def is_training_rank(pid: int) -> bool:
    """Whether the process runs the training runtime itself (``python [-u] -m shipyard.training``),
    not its parent or a launcher that names it further down its command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    modules = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == b"-m"]
    return bool(modules) and modules[0] == b"shipyard.training"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(pid, sig)
