"""``shipyard``: train and fine-tune LLMs on your own accelerators."""

from __future__ import annotations

import typer

from shipyard import __version__
from shipyard.cli import jobs, models, quickstart
from shipyard.cli._errors import exit_code_of
from shipyard.cli._output import JsonOpt, print_json, table
from shipyard.services import open_context
from shipyard.services.devices import list_devices

app = typer.Typer(
    name="shipyard",
    help=__doc__,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(jobs.app, name="jobs")
app.add_typer(models.app, name="models")
app.command()(models.generate)
app.command()(quickstart.quickstart)


@app.command()
def devices(json_out: JsonOpt = False) -> None:
    """Devices of this node, each with its accelerator type (the catalog key jobs ask for)."""
    found = list_devices(open_context())
    if json_out:
        print_json(found)
        return
    table(
        None,
        [
            "type",
            "index",
            "name",
            "memory GiB",
            "peak bf16 TFLOPS",
            "peak fp32 TFLOPS",
            "cores",
            "NVLink peers",
        ],
        [
            (
                d.accelerator_type,
                d.index,
                d.name,
                d.memory_gib,
                d.peak_bf16_tflops,
                d.peak_fp32_tflops,
                d.cores or "-",
                ",".join(map(str, d.nvlink_peers)) or "-",
            )
            for d in found
        ],
    )


@app.command()
def version() -> None:
    """Print Shipyard's version."""
    typer.echo(__version__)


def main() -> None:
    exit_code_of(app)


if __name__ == "__main__":
    main()
