"""All command output goes through here: rich tables for people, JSON with ``--json``."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

from shipyard.domain.text import printable

View = TypeVar("View", bound=BaseModel)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

console = Console()
err_console = Console(stderr=True)


def print_json(payload: BaseModel | Sequence[BaseModel] | dict[str, Any]) -> None:
    if isinstance(payload, BaseModel):
        data: Any = payload.model_dump(mode="json")
    elif isinstance(payload, dict):
        data = payload
    else:
        data = [item.model_dump(mode="json") for item in payload]
    typer.echo(json.dumps(data, indent=2))


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    t = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        t.add_column(column, overflow="fold")
    for row in rows:
        # Text, not markup: a name holding "[red]" or an escape prints as what it is; a cell styled
        # by the caller comes as a Text already.
        t.add_row(*(cell if isinstance(cell, Text) else Text(printable(fmt(cell))) for cell in row))
    console.print(t)


def rows_or_json(
    records: Sequence[View],
    json_out: bool,
    columns: Sequence[str],
    row: Callable[[View], Sequence[object]],
) -> None:
    """``--json``: the records as JSON; otherwise a table with one ``row(record)`` each."""
    if json_out:
        print_json(records)
    else:
        table(None, columns, [row(record) for record in records])


def fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e5):
            return f"{value:,.3g}" if abs(value) < 1e5 else f"{value:,.0f}"
        return f"{value:,.4g}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, datetime):
        return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
