"""What Linux's ``/proc`` says of a process: its state, parent and start time, and whether it
has ended. Where ``/proc`` is absent these answer "unknown" and callers fall back on waiting."""

from __future__ import annotations

import contextlib
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
