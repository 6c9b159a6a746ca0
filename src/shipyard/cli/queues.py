"""``shipyard queue`` (what waits and why) and ``shipyard queues`` (quota, usage, borrowing; and
changing quotas, which cluster admins do and the audit log records). On the server given by
SHIPYARD_URL (or ``shipyard login``), or on the embedded platform."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from shipyard.cli._output import JsonOpt, err_console, print_json, rows_or_json
from shipyard.cli._remote import either
from shipyard.errors import InvalidSpec
from shipyard.schemas.views import QueueChangeView, QueueStatusView

queues_app = typer.Typer(
    help="Cluster queues: quota, usage and borrowing per accelerator type; change quotas (admins).",
    invoke_without_command=True,
)


def _status() -> QueueStatusView:
    from shipyard.agent.scheduler import queue_status

    return either(lambda c: c.queues(), queue_status)


def queue(json_out: JsonOpt = False) -> None:
    """Status jobs, oldest first, each with why the scheduler keeps it waiting."""
    rows_or_json(
        _status().pending,
        json_out,
        ["job", "queue", "priority", "devices", "types", "waiting because"],
        lambda p: (p.id, p.queue, p.priority, p.devices, ",".join(p.accelerator_types), p.reason),
    )


def _pairs(values: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items())) or "-"


@queues_app.callback()
def queues(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Cluster queues: nominal quota, devices in use and borrowed, per accelerator type."""
    if ctx.invoked_subcommand is not None:
        return
    rows_or_json(
        _status().queues,
        json_out,
        ["queue", "cohort", "nominal", "in use", "borrowed", "local queues"],
        lambda q: (q.name, q.cohort or "-", _pairs(q.nominal) if q.nominal else "no limit",
                   _pairs(q.used), _pairs(q.borrowed), ",".join(q.local_queues) or "-"),
    )  # fmt: skip


@queues_app.command("config")
def show_config(json_out: JsonOpt = False) -> None:
    """The queue configuration in force, as YAML that `shipyard queues apply` takes back."""
    from shipyard.services.cluster import queues as queue_settings

    current = either(lambda c: c.queue_config(), queue_settings.show)
    if json_out:
        print_json(current)
        return
    if current.config is None:
        err_console.print(f"no queue configuration ({current.source})")
        return
    import yaml

    where = f"version {current.version}" if current.version else f"from {current.source}"
    typer.echo(f"# queue configuration in force: {where}")
    typer.echo(yaml.safe_dump(current.config, sort_keys=False), nl=False)


@queues_app.command("apply")
def apply(file: Annotated[Path, typer.Argument(help="A queues YAML file (see `queues config`).")]) -> None:
    """Replace the whole queue configuration with FILE (cluster admins; audited)."""
    from shipyard.schemas.documents import read_document_file
    from shipyard.schemas.queues import parse_queue_config
    from shipyard.services.cluster import queues as queue_settings

    config = parse_queue_config(read_document_file(file, what="queue file"), source=str(file))
    _report(either(lambda c: c.apply_queue_config(config), lambda ctx: queue_settings.apply(ctx, config)))


@queues_app.command("set")
def set_queue(
    name: str,
    nominal: Annotated[
        list[str] | None,
        typer.Option(help="TYPE=DEVICES guaranteed (repeat, or comma-separate); cpu counts cores."),
    ] = None,
    borrowing_limit: Annotated[
        list[str] | None, typer.Option(help="TYPE=DEVICES it may borrow from its cohort (default: no limit).")
    ] = None,
    cohort: Annotated[str | None, typer.Option(help="Queues of a cohort lend each other idle quota.")] = None,
    local_queue: Annotated[
        list[str] | None, typer.Option(help="A queue name jobs give (`queue:` in a spec) to point here.")
    ] = None,
) -> None:
    """Add the cluster queue NAME or replace its quota (cluster admins; audited)."""
    from shipyard.schemas.documents import validate_document
    from shipyard.schemas.queues import HINT, ClusterQueueSpec
    from shipyard.services.cluster import queues as queue_settings

    document: dict[str, Any] = {
        "name": name,
        "nominal": _counts(nominal or [], "--nominal"),
        "cohort": cohort,
    }
    if borrowing_limit is not None:
        document["borrowingLimit"] = _counts(borrowing_limit, "--borrowing-limit")
    queue = validate_document(ClusterQueueSpec, document, source=f"cluster queue {name!r}", hint=HINT)
    locals_ = local_queue or []
    _report(
        either(
            lambda c: c.set_queue(queue, locals_), lambda ctx: queue_settings.set_queue(ctx, queue, locals_)
        )
    )


@queues_app.command("remove")
def remove(name: str) -> None:
    """Remove the cluster queue NAME and the local queues naming it (cluster admins; audited).
    Its waiting jobs then wait with a reason until a queue takes them."""
    from shipyard.services.cluster import queues as queue_settings

    _report(either(lambda c: c.remove_queue(name), lambda ctx: queue_settings.remove_queue(ctx, name)))


def _counts(values: list[str], flag: str) -> dict[str, int]:
    """``["cpu=4,h100-sxm=8", "a100=2"]`` -> ``{"cpu": 4, "h100-sxm": 8, "a100": 2}``."""
    counts: dict[str, int] = {}
    for item in (part.strip() for value in values for part in value.split(",")):
        key, sep, number = item.partition("=")
        if not sep or not key or not number.strip().isdigit():
            raise InvalidSpec(f"{flag} {item!r} is not TYPE=DEVICES", hint=f"e.g. {flag} cpu=4,h100-sxm=8")
        counts[key.strip()] = int(number)
    return counts


def _report(result: QueueChangeView) -> None:
    from shipyard.services.cluster.queues import NO_CONFIG

    changes = result.changes
    kinds = {"added": changes["added"], "changed": list(changes["changed"]), "removed": changes["removed"]}
    parts = [f"{kind} {', '.join(names)}" for kind, names in kinds.items() if names]
    if "local_queues" in changes:
        parts.append("local queues " + _pairs(changes["local_queues"]["after"]))
    typer.echo(f"queue configuration version {result.version} in force: {'; '.join(parts) or 'no change'}")
    if result.replaced not in ("database", NO_CONFIG):
        err_console.print(f"{result.replaced} is no longer read: the applied configuration replaces it")


def register(app: typer.Typer) -> None:
    app.command()(queue)
    app.add_typer(queues_app, name="queues")
