"""The advisor's chart: time, cost and energy per accelerator type, side by side."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from shipyard.errors import DependencyMissing, InvalidSpec
from shipyard.planner.advisor import Comparison


def comparison_chart(rows: list[Comparison], path: Path, *, title: str) -> None:
    """Three horizontal bar panels; types that do not fit are listed in grey with no bar."""
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
    panels: tuple[tuple[str, list[float | None]], ...] = (
        ("time (h)", [r.time_h for r in rows]),
        ("cost ($)", [r.cost_usd for r in rows]),
        ("energy (kWh)", [r.energy_kwh for r in rows]),
    )
    figure, axes = plt.subplots(1, 3, figsize=(15, 0.38 * len(rows) + 1.6), sharey=True)
    positions = list(range(len(rows)))
    for axis, (name, values) in zip(axes, panels, strict=True):
        bars = [v if (v is not None and r.fits) else 0.0 for v, r in zip(values, rows, strict=True)]
        colors = ["tab:blue" if r.fits else "lightgrey" for r in rows]
        axis.barh(positions, bars, color=colors)
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
