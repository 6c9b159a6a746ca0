"""Templates and the filters they format numbers with. Autoescaping is on for every template:
job names, queue names and log lines are user text and reach the page as text, never markup."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from shipyard import __version__

HERE = Path(__file__).parent

NAV = (
    ("overview", "/", "Overview"),
    ("jobs", "/jobs", "Jobs"),
    ("queues", "/queues", "Queues"),
    ("nodes", "/nodes", "Nodes"),
    ("usage", "/usage", "Usage"),
    ("models", "/models", "Models"),
    ("storage", "/storage", "Storage"),
    ("audit", "/audit", "Audit"),
    ("planner", "/planner", "Planner"),
)


def _ago(value: datetime | str | float | None) -> str:
    """How long ago: a datetime (naive ones are UTC, as the database keeps them), an ISO text
    or seconds since the epoch."""
    if value is None:
        return "–"
    if isinstance(value, int | float):
        when = datetime.fromtimestamp(value, UTC)
    else:
        when = datetime.fromisoformat(value) if isinstance(value, str) else value
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return _duration((datetime.now(UTC) - when).total_seconds()) + " ago"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _bytes(value: float | None) -> str:
    if value is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _number(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _hours(value: float | None) -> str:
    """Device-hours: two decimals, or three significant digits below one (a short job's share)."""
    if value is None:
        return "–"
    return f"{value:,.2f}" if value >= 1 or value == 0 else f"{value:.3g}"


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def _final_loss(metrics: dict[str, float]) -> float | None:
    """A model version's final loss, eval where it was evaluated: a version a finished job
    published keeps its result's ``eval_loss``/``train_loss``, one published from a job's summary
    its ``eval_loss_end``/``train_loss_end``."""
    for key in ("eval_loss_end", "eval_loss", "train_loss_end", "train_loss"):
        if metrics.get(key) is not None:
            return metrics[key]
    return None


environment = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(["html"], default=True),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
environment.filters.update(
    ago=_ago, duration=_duration, bytes=_bytes, number=_number, percent=_percent, hours=_hours
)
environment.globals.update(nav=NAV, version=__version__, final_loss=_final_loss)


def render(request: Request, template: str, *, status_code: int = 200, **context: Any) -> HTMLResponse:
    """The page, with what every page shows: the caller, the navigation, the CSRF token."""
    page = environment.get_template(template).render(
        request=request,
        user=getattr(request.state, "user", None),
        csrf=getattr(request.state, "csrf", ""),
        **{"active": None, **context},
    )
    return HTMLResponse(page, status_code=status_code)
