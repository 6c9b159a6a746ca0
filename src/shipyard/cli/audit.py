"""``shipyard audit verify | export``: check the tamper-evident audit log, or hand it to a SIEM."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from shipyard import audit
from shipyard.cli._contexts import command_context
from shipyard.cli._output import JsonOpt, print_json
from shipyard.domain.paths import refuse_overwrite
from shipyard.errors import AuditChainBroken

app = typer.Typer(help="The audit log: who trained, downloaded or published what.", no_args_is_help=True)


@app.command()
def verify(json_out: JsonOpt = False) -> None:
    """Walk the hash chain; exit 1 naming the first record that was modified, deleted, inserted
    or reordered (on the embedded database, or the server's with SHIPYARD_DB_URL)."""
    ctx = command_context()
    verdict = audit.verify_log(ctx.db, ctx.audit_key)
    if json_out:
        print_json(verdict.view())
        if not verdict.ok:
            raise typer.Exit(1)
        return
    if not verdict.ok:
        raise AuditChainBroken(
            f"audit log broken at record {verdict.first_bad}: {verdict.problem}",
            hint="records before it are intact; restore the database from a backup and keep this one "
            "for the investigation",
        )
    typer.echo(f"audit log intact: {verdict.records} records, chain head at {verdict.head_seq}")


@app.command()
def export(
    since: Annotated[str | None, typer.Option(help="Only records from this date or time (UTC).")] = None,
    out: Annotated[Path | None, typer.Option(help="Write here instead of standard output.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False,
) -> None:
    """Write the records as JSON lines (with their hashes), after checking the chain."""
    if out is not None:
        refuse_overwrite(out, force=force)
    ctx = command_context()
    moment = audit.parse_since(since) if since else None
    if out is None:
        audit.export_log(ctx.db, ctx.audit_key, sys.stdout, moment)
        return
    staged = out.with_name(f".{out.name}.partial")
    try:
        with open(staged, "w", encoding="utf-8") as handle:
            count = audit.export_log(ctx.db, ctx.audit_key, handle, moment)
        staged.replace(out)
    finally:
        staged.unlink(missing_ok=True)
    typer.echo(f"wrote {count} records to {out}", err=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="audit")
