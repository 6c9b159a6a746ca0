"""``shipyard queue`` (what waits and why) and ``shipyard queues`` (quota, usage, borrowing)."""

from __future__ import annotations

import json

import typer

from shipyard.cli._output import JsonOpt, table
from shipyard.services.context import open_context
from shipyard.services.scheduler import queue_status


def queue(json_out: JsonOpt = False) -> None:
    """Pending jobs, oldest first, each with why the scheduler keeps it waiting."""
    pending = queue_status(open_context(autostart_agent=False))["pending"]
    if json_out:
        typer.echo(json.dumps(pending, indent=2))
        return
    table(
        None,
        ["job", "queue", "priority", "devices", "types", "waiting because"],
        [(p["id"], p["queue"], p["priority"], p["devices"], ",".join(p["accelerator_types"]), p["reason"])
         for p in pending],
    )  # fmt: skip


def queues(json_out: JsonOpt = False) -> None:
    """Cluster queues: nominal quota, devices in use and borrowed, per accelerator type."""
    rows = queue_status(open_context(autostart_agent=False))["queues"]
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return

    def pairs(values: dict[str, int]) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(values.items())) or "-"

    table(
        None,
        ["queue", "cohort", "nominal", "in use", "borrowed", "local queues"],
        [(q["name"], q["cohort"] or "-", pairs(q["nominal"]) if q["nominal"] else "no limit",
          pairs(q["used"]), pairs(q["borrowed"]), ",".join(q["local_queues"]) or "-") for q in rows],
    )  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command()(queue)
    app.command()(queues)
