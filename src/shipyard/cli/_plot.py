"""The advisor's chart: time, cost and energy per accelerator type, side by side."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from shipyard.errors import DependencyMissing, InvalidSpec
from shipyard.planner.advisor import Comparison


def comparison_chart(rows: list[Comparison], path: Path, *, title: str) -> None:
    """Three horizontal bar panels, each bar with its 80 % range; types that do not fit are listed
    in grey with no bar."""
    if path.suffix.lower() != ".png":
        raise InvalidSpec(f"--plot {path} must end in .png", hint="e.g. --plot compare.png")
    if not path.parent.is_dir():
        raise InvalidSpec(
            f"--plot: folder {path.parent} does not exist", hint="create it or pick another path"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DependencyMissing(
            "--plot needs matplotlib", hint="pip install 'shipyard[plot]' (make setup installs it)"
        ) from None
    labels = [f"{r.count} x {r.accelerator}" for r in rows]
    panels = (("time", "time (h)"), ("cost", "cost ($)"), ("energy", "energy (kWh)"))
    figure, axes = plt.subplots(1, 3, figsize=(15, 0.38 * len(rows) + 1.6), sharey=True)
    positions = list(range(len(rows)))
    for axis, (figure_name, name) in zip(axes, panels, strict=True):
        values = [r.figure(figure_name) for r in rows]
        bars = [v if (v is not None and r.fits) else 0.0 for v, r in zip(values, rows, strict=True)]
        colors = ["tab:blue" if r.fits else "lightgrey" for r in rows]
        # Each bar's 80 % range as an error bar (none where the plan has no range or no bar).
        spans = [r.range_of(figure_name) if b > 0 else None for r, b in zip(rows, bars, strict=True)]
        below = [b - s["low"] if s else 0.0 for b, s in zip(bars, spans, strict=True)]
        above = [s["high"] - b if s else 0.0 for b, s in zip(bars, spans, strict=True)]
        axis.barh(positions, bars, color=colors, xerr=[below, above], ecolor="black", capsize=3)
        axis.set_xscale("log" if any(b > 0 for b in bars) else "linear")
        axis.set_title(name)
        axis.grid(axis="x", alpha=0.3)
        for y, (v, r) in enumerate(zip(values, rows, strict=True)):
            if not r.fits:
                axis.text(
                    0.01, y, "does not fit", transform=axis.get_yaxis_transform(), va="center", color="grey"
                )
            elif v is None:
                axis.text(
                    0.01, y, "no price", transform=axis.get_yaxis_transform(), va="center", color="grey"
                )
    axes[0].set_yticks(positions, labels)
    axes[0].invert_yaxis()
    figure.suptitle(title)
    figure.tight_layout()
    # Write beside the target and rename: a failed render never leaves half a file.
    fd, staging = tempfile.mkstemp(suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        figure.savefig(staging, dpi=110)
        os.replace(staging, path)
    finally:
        plt.close(figure)
        if os.path.exists(staging):
            os.unlink(staging)
