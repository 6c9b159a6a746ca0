"""``shipyard usage``: device-hours and cost per project, queue, user or accelerator type, per day
(the showback whoever owns the cluster asks for first)."""

from __future__ import annotations

import csv
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from shipyard.cli._output import JsonOpt, err_console, print_json, table
from shipyard.cli._remote import either
from shipyard.errors import InvalidSpec
from shipyard.schemas.views import UsageView


def usage(
    by: Annotated[str, typer.Option(help="Group by project, queue, user or type.")] = "project",
    since: Annotated[
        str, typer.Option(help="From this long ago (7d, 36h) or this date or time (UTC: 2026-12-01).")
    ] = "7d",
    json_out: JsonOpt = False,
    csv_out: Annotated[bool, typer.Option("--csv", help="One row per key and day, as CSV.")] = False,
) -> None:
    """Device-hours and cost of the projects you can see (admins: all), from the attempts' real start
    and end; running jobs count up to now. Prices come from the catalog and hardware.yaml."""
    from shipyard.services.cluster.usage import usage as local_usage

    moment = parse_since(since)
    view: UsageView = either(
        lambda c: c.usage(by, since=moment), lambda ctx: local_usage(ctx, by=by, since=moment)
    )
    if json_out:
        print_json(view)
    elif csv_out:
        out = csv.writer(sys.stdout)
        out.writerow([by, "day", "device_hours"])
        for row in view.rows:
            out.writerows([row.key, day, hours] for day, hours in zip(view.days, row.by_day, strict=True))
    else:
        table(
            f"Usage by {by}, {view.since:%Y-%m-%d %H:%M} to {view.until:%Y-%m-%d %H:%M} UTC",
            [by, "device-hours", "share", "cost (USD)", "attempts"],
            [
                (row.key, f"{row.device_hours:,.2f}", f"{row.device_hours / (view.device_hours or 1):.0%}",
                 "no price" if row.cost_usd is None else f"{row.cost_usd:,.2f}", row.attempts)
                for row in view.rows
            ]
            + [("total", f"{view.device_hours:,.2f}", "", f"{view.cost_usd:,.2f}", "")],
        )  # fmt: skip
        if view.unpriced_types:
            err_console.print(
                f"No price for {', '.join(view.unpriced_types)}: their hours cost nothing above; set "
                "price_usd_per_h for them in hardware.yaml."
            )


def parse_since(text: str) -> datetime:
    """``7d``, ``36h`` before now, or an ISO date or time (UTC unless a zone is given)."""
    if match := re.fullmatch(r"(\d{1,4})([dh])", text.strip()):
        amount, unit = int(match[1]), match[2]
        return datetime.now(UTC) - (timedelta(days=amount) if unit == "d" else timedelta(hours=amount))
    from shipyard import audit

    try:
        return audit.parse_since(text)
    except InvalidSpec:
        raise InvalidSpec(
            f"--since {text!r} is neither a span nor a date",
            hint="give a span like 7d or 36h, or a date like 2026-12-01",
        ) from None


def register(app: typer.Typer) -> None:
    app.command()(usage)
