"""``shipyard storage``: the artifact store (replicated local roots or an S3-compatible store).

``put``, ``get``, ``ls``, ``stat`` and ``rm`` go through the server given by SHIPYARD_URL (or
``shipyard login``) when there is one; upkeep (roots, scrub, gc, status, keys, bench) runs where the
store's disks are, as a cluster admin."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich import filesize
from rich.progress import BarColumn, DownloadColumn, Progress, ProgressColumn, Task, TimeRemainingColumn
from rich.text import Text

from shipyard.cli._contexts import command_context
from shipyard.cli._output import JsonOpt, console, duration, err_console, print_json, rows_or_json, table
from shipyard.cli._remote import client, either, embedded_context, server_url
from shipyard.errors import InvalidSpec, NotFound
from shipyard.schemas.storage_views import StorageStatus
from shipyard.services.storage import storage as storage_service
from shipyard.services.storage import upkeep

sub_app = typer.Typer(
    help="Checkpoints, datasets and models as replicated, verified (optionally encrypted) artifacts. "
    "Configuration: $SHIPYARD_HOME/storage.yaml.",
    no_args_is_help=True,
)
roots_app = typer.Typer(help="Local disks or mounts that hold the blobs, tagged with failure domains.")
sub_app.add_typer(roots_app, name="roots")

ProjectOpt = Annotated[str, typer.Option("--project", "-p", help="The project the artifact belongs to.")]

ProgressFactory = Callable[[int], Callable[[int], None]]


class _BinarySpeed(ProgressColumn):
    """Bytes per second in KiB/MiB/GiB, the units of every other size Shipyard prints (rich's
    own speed column is decimal: 200.0 MB beside 190.7 MiB)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if speed is None:
            return Text("?", style="progress.data.speed")
        unit, suffix = filesize.pick_unit_and_suffix(int(speed), ["B", "KiB", "MiB", "GiB", "TiB"], 1024)
        return Text(f"{speed / unit:.1f} {suffix}/s", style="progress.data.speed")


@contextmanager
def _bar(label: str, *, quiet: bool, in_bytes: bool = True) -> Iterator[ProgressFactory | None]:
    """A progress bar on stderr (none with --json or when stderr is not a terminal)."""
    if quiet or not err_console.is_terminal:
        yield None
        return
    columns = [DownloadColumn(binary_units=True), _BinarySpeed()] if in_bytes else []
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        *columns,
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    ) as bar:

        def start(total: int) -> Callable[[int], None]:
            task = bar.add_task(label, total=total)
            return lambda done: bar.advance(task, done)

        yield start


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


@sub_app.command()
def put(
    local_path: Annotated[Path, typer.Argument(help="A file or a folder.")],
    name: Annotated[str, typer.Argument(help="Its name in the project, e.g. checkpoints/run-1/step-100.")],
    project: ProjectOpt = storage_service.DEFAULT_PROJECT,
    replicas: Annotated[
        int | None, typer.Option(min=1, max=16, help="Copies (default: the project's, else 2).")
    ] = None,
    encrypt: Annotated[
        bool | None,
        typer.Option("--encrypt/--no-encrypt", help="AES-256-GCM at rest (default: the project's)."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Store a file or folder; it becomes visible only when every copy is durable."""
    if server_url():
        if local_path.is_dir():
            raise InvalidSpec(
                f"{local_path} is a folder: the server takes one file per upload",
                hint="store folders on a node of the platform (jobs store theirs), or put their files "
                "one by one",
            )
        if not local_path.is_file():
            raise NotFound(f"{local_path} does not exist", hint="give the path of a file")
        with client() as remote:
            stored = remote.upload_artifact(local_path, project, name, replicas=replicas, encrypt=encrypt)
    else:
        with _bar(f"put {name}", quiet=json_out) as progress:
            stored = storage_service.put(
                embedded_context(),
                local_path,
                name,
                project=project,
                replicas=replicas,
                encrypt=encrypt,
                progress=progress,
            )
    if json_out:
        print_json(stored)
        return
    for warning in stored.warnings:
        err_console.print(f"[yellow]Warning:[/] {warning}")
    mode = "encrypted" if stored.encrypted else "plain"
    console.print(
        f"stored {stored.project}/{stored.name}: {stored.files} file(s), {_gib(stored.size_bytes)}, "
        f"{stored.replicas} replica(s), {mode}"
    )


@sub_app.command()
def get(
    name: Annotated[str, typer.Argument(help="The artifact's name.")],
    out_path: Annotated[
        Path, typer.Argument(help="Where to write it (a folder artifact becomes a new folder).")
    ],
    project: ProjectOpt = storage_service.DEFAULT_PROJECT,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the file at the path if there is one.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Fetch an artifact; every byte is verified, a bad replica is skipped for a good one."""
    if server_url():
        with client() as remote:
            fetched = remote.fetch_artifact(project, name, out_path, force=force)
    else:
        with _bar(f"get {name}", quiet=json_out) as progress:
            fetched = storage_service.get(
                embedded_context(), name, out_path, project=project, progress=progress, force=force
            )
    if json_out:
        print_json(fetched)
    else:
        console.print(f"wrote {fetched.project}/{fetched.name} to {out_path} ({_gib(fetched.size_bytes)})")


@sub_app.command("ls")
def ls(
    prefix: Annotated[str, typer.Argument(help="Only names starting with this.")] = "",
    project: Annotated[str | None, typer.Option("--project", "-p", help="Only this project.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Artifacts, by project and name."""
    found = either(
        lambda c: c.list_artifacts(project, prefix),
        lambda ctx: storage_service.list_artifacts(ctx, project, prefix),
    )
    if json_out:
        print_json(found)
        return
    table(
        None,
        ["project", "name", "kind", "files", "size", "replicas", "encrypted", "by", "created"],
        [
            (
                a.project,
                a.name,
                a.kind,
                a.files,
                _gib(a.size_bytes),
                a.replicas,
                "yes" if a.encrypted else "no",
                a.created_by,
                a.created_at,
            )
            for a in found
        ],
    )


@sub_app.command()
def stat(
    name: Annotated[str, typer.Argument(help="The artifact's name.")],
    project: ProjectOpt = storage_service.DEFAULT_PROJECT,
    json_out: JsonOpt = False,
) -> None:
    """One artifact with its files and their digests."""
    found = either(
        lambda c: c.stat_artifact(project, name), lambda ctx: storage_service.stat(ctx, name, project)
    )
    if json_out:
        print_json(found)
        return
    table(
        f"{found.project}/{found.name} ({found.kind}, {found.replicas} replicas, "
        f"{'encrypted' if found.encrypted else 'plain'})",
        ["path", "size", "digest (block SHA-256)"],
        [(e.path, _gib(e.size_bytes), e.digest) for e in found.entries],
    )


@sub_app.command("rm")
def rm(
    name: Annotated[str, typer.Argument(help="The artifact's name.")],
    project: ProjectOpt = storage_service.DEFAULT_PROJECT,
) -> None:
    """Delete an artifact (its blobs are freed by `storage gc` after the grace period)."""
    either(lambda c: c.delete_artifact(project, name), lambda ctx: storage_service.delete(ctx, name, project))
    console.print(f"deleted {project}/{name}")


@sub_app.command()
def scrub(
    repair: Annotated[
        bool, typer.Option("--repair", help="Rewrite missing and corrupt replicas from healthy ones.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Read and verify every replica of every blob; exit 1 if any blob is lost."""
    with _bar("scrub", quiet=json_out, in_bytes=False) as progress:
        report = upkeep.scrub(command_context(), repair=repair, progress=progress)
    if json_out:
        print_json(report)
    else:
        rate = report.bytes_verified / report.seconds / 1e9 if report.seconds else 0.0
        console.print(
            f"checked {report.checked} blobs ({_gib(report.bytes_verified)} verified, {rate:.2f} GB/s): "
            f"{report.corrupt} corrupt, {report.missing} missing, {report.repaired} repaired, "
            f"{report.lost} lost"
        )
        if report.manifests_missing:
            done = f", {report.manifests_repaired} written again" if repair else ""
            console.print(f"manifests: {report.manifests_missing} copies missing{done}")
        for name in report.lost_artifacts:
            err_console.print(f"[red]lost:[/] {name}")
    if report.lost:
        raise typer.Exit(1)


@sub_app.command()
def gc(
    grace_s: Annotated[
        float | None,
        typer.Option(
            "--grace-s", min=0, help="Keep unreferenced blobs younger than this (default: gc_grace_s)."
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Free blobs no artifact references and leftovers of interrupted writes."""
    report = upkeep.gc(command_context(), grace_s=grace_s)
    if json_out:
        print_json(report)
    else:
        console.print(
            f"removed {report.blobs_removed} blobs ({_gib(report.bytes_freed)}) "
            f"and {report.orphans_removed} leftover objects"
        )


@sub_app.command()
def recover(json_out: JsonOpt = False) -> None:
    """Rebuild the catalog from the manifests beside the blobs (after the database was lost).

    Every artifact whose manifest is in the store and not in the catalog is put back, its blobs
    with it; artifacts the catalog knows are left as they are. Run `shipyard storage scrub` after.
    """
    report = upkeep.recover(command_context())
    if json_out:
        print_json(report)
    else:
        console.print(
            f"{report.manifests} manifests: {report.recovered} artifacts recovered, "
            f"{report.already_known} already in the catalog"
        )
        for problem in report.unreadable:
            err_console.print(f"[red]unreadable:[/] {problem}")
    if report.unreadable:
        raise typer.Exit(1)


@sub_app.command()
def status(json_out: JsonOpt = False) -> None:
    """Roots with their failure domains and free space; artifacts, blobs and bytes."""
    found = upkeep.status(command_context())
    if json_out:
        print_json(found)
        return
    _roots_table(found)
    console.print(
        f"{found.artifacts} artifacts ({_gib(found.bytes)}), "
        f"{found.blobs} distinct blobs ({_gib(found.stored_bytes)}), "
        f"{found.encrypted_blobs} encrypted; master key: {found.active_key or 'none yet'}"
    )
    if found.missing_copies:
        whole = f"whole again in about {duration(found.time_to_whole_s)} once its repair runs"
        console.print(
            f"{found.short_blobs} blobs short of their replicas: {found.missing_copies} copies, "
            f"{_gib(found.bytes_to_copy)} to copy; {whole}"
        )
    elif found.blobs:
        console.print("every blob has all its replicas")
    if found.repair_owed_since:
        console.print(
            f"a repair is owed since {_when(found.repair_owed_since)} (a read or a root showed damage)"
        )
    scrub = found.background_scrub
    if scrub.get("light_at"):
        console.print(f"light pass last finished {_when(scrub['light_at'])}: {scrub['light']}")
    if scrub.get("started_at"):
        console.print(f"background scrub under way since {_when(scrub['started_at'])}: {scrub['tally']}")
    elif scrub.get("finished_at"):
        console.print(f"background scrub last finished {_when(scrub['finished_at'])}: {scrub['tally']}")


def _roots_table(found: StorageStatus) -> None:
    columns = sorted(
        {key for root in found.roots for key in root},
        key=["path", "endpoint", "bucket", "rack", "node", "disk", "free_bytes", "reachable"].index,
    )
    table(
        f"{found.backend} backend, {found.default_replicas} replicas by default",
        columns,
        [[_gib(root[c]) if c == "free_bytes" else root.get(c) for c in columns] for root in found.roots],
    )


def _when(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@sub_app.command("rotate-key")
def rotate_key(json_out: JsonOpt = False) -> None:
    """A new master key: every data key is re-wrapped, no data is rewritten."""
    result = upkeep.rotate_key(command_context())
    if json_out:
        print_json(result)
    else:
        console.print(
            f"master key {result['previous']} -> {result['key']}: {result['rewrapped']} data keys re-wrapped"
        )


@sub_app.command()
def bench(
    size_mib: Annotated[int, typer.Option(min=1, help="Bytes to write and read, in MiB.")] = 512,
    json_out: JsonOpt = False,
) -> None:
    """Store throughput beside a plain fsync'd file on the same disk (GB/s and ratios)."""
    results = upkeep.bench(command_context(), size_mib * 2**20)
    if json_out:
        print_json({"results": results})
        return
    table(
        None,
        ["case", "write GB/s", "read GB/s", "write ratio", "read ratio"],
        [(r["case"], r["write_gbps"], r["read_gbps"], r["write_ratio"], r["read_ratio"]) for r in results],
    )


@roots_app.command("ls")
def roots_ls(json_out: JsonOpt = False) -> None:
    """The roots: path (or bucket), failure domains, free space, whether they answer."""
    found = upkeep.status(command_context())
    if json_out:
        typer.echo(json.dumps(found.model_dump(mode="json")["roots"], indent=2))
    else:
        _roots_table(found)


@roots_app.command("add")
def roots_add(
    path: Annotated[Path, typer.Argument(help="A folder on the disk or mount to use.")],
    rack: Annotated[
        str | None, typer.Option(help="Rack of the root's machine (widest failure domain).")
    ] = None,
    node: Annotated[str | None, typer.Option(help="Machine the disk is in (default: this host).")] = None,
    disk: Annotated[str | None, typer.Option(help="The disk (default: the path).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Add a root and rebalance copies onto it where failure domains want them."""
    moved = upkeep.add_root(command_context(), path, rack=rack, node=node, disk=disk)
    if json_out:
        print_json(moved)
    else:
        console.print(
            f"added {path}; rebalanced: {moved.repaired} replicas written over {moved.checked} blobs"
        )


@roots_app.command("remove")
def roots_remove(
    path: Annotated[Path, typer.Argument(help="The root to take out of service.")], json_out: JsonOpt = False
) -> None:
    """Copy every blob off a root onto the others, then stop using it."""
    moved = upkeep.remove_root(command_context(), path)
    if json_out:
        print_json(moved)
    else:
        console.print(f"removed {path}: {moved.repaired} replicas moved to other roots")


def datasets(
    project: Annotated[str | None, typer.Option("--project", "-p", help="Only this project.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Stored datasets jobs trained on: the content each job read and the models that came of it."""
    from shipyard.services.storage import datasets as dataset_service

    found = either(
        lambda c: c.list_datasets(project), lambda ctx: dataset_service.list_datasets(ctx, project)
    )
    rows_or_json(
        found,
        json_out,
        ["project", "dataset", "digest", "size", "read by", "models"],
        lambda d: (
            d.project,
            d.name,
            (d.digest or "deleted")[:16],
            _gib(d.size_bytes) if d.size_bytes is not None else "-",
            ", ".join(sorted({r.job for r in d.read_by})),
            ", ".join(d.models) or "-",
        ),
    )


def register(app: typer.Typer) -> None:
    app.add_typer(sub_app, name="storage")
    app.command()(datasets)
