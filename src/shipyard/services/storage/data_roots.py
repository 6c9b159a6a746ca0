"""Confining the paths of work that arrives through the server to the project's data roots.

The machine's own user (the embedded CLI, admin of their home) reads wherever the operating
system lets them. Anyone else — every caller of the API, the SDK, a remote CLI or a web page,
cluster admins included — names server-side paths only inside the data roots configured for the
job's project in ``$SHIPYARD_HOME/server.yaml``, or ``store:`` datasets their role may read. A
path outside is refused with 403 before anything looks at it, so the answer is the same whether
it exists or not.
"""

from __future__ import annotations

import threading
from pathlib import Path

from shipyard import audit
from shipyard.domain.paths import is_inside
from shipyard.errors import Forbidden
from shipyard.schemas.data_roots import (
    ServerConfig,
    files_outside,
    literal_part,
    parse_server_config,
    spec_folders,
    spec_paths,
)
from shipyard.schemas.documents import read_document_file
from shipyard.schemas.jobspec import JobSpec
from shipyard.services.context import LOCAL_PREFIX, ServiceContext

SERVER_FILE = "server.yaml"

_cache_lock = threading.Lock()
_cache: dict[Path, tuple[int, ServerConfig]] = {}
"""server.yaml by path -> (mtime_ns, parsed): read again only when it changes."""


def server_config(ctx: ServiceContext) -> ServerConfig:
    path = ctx.settings.home / SERVER_FILE
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        return ServerConfig()
    with _cache_lock:
        cached = _cache.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
    config = parse_server_config(read_document_file(path, what="server configuration"), str(path))
    with _cache_lock:
        _cache[path] = (mtime, config)
    return config


def roots_for(ctx: ServiceContext, project: str) -> list[Path] | None:
    """The folders a job of ``project`` submitted by the caller may read; None: anywhere."""
    if ctx.trusts_paths:
        return None
    return server_config(ctx).roots_for(project)


def roots_of_owner(ctx: ServiceContext, owner: str, project: str) -> list[Path] | None:
    """At launch: the roots of a job its owner submitted (None: the machine's own user's)."""
    if owner.startswith(LOCAL_PREFIX):
        return None
    return server_config(ctx).roots_for(project)


def confine(ctx: ServiceContext, spec: JobSpec) -> None:
    """Refuse (403, audited) a spec naming a server-side path outside its project's roots."""
    roots = roots_for(ctx, spec.project)
    if roots is None:
        return
    for field, path in spec_paths(spec):
        # A glob is judged by its folders before the first wildcard: every match lies below them.
        judged = literal_part(path) if field.startswith("data.paths") else path
        require_inside(ctx, roots, spec.project, field, path, judged=judged)
    for field, folder in spec_folders(spec):
        escaped = next(files_outside(folder, roots), None)
        if escaped is not None:
            require_inside(ctx, roots, spec.project, field, str(escaped))


def require_inside(
    ctx: ServiceContext, roots: list[Path], project: str, field: str, path: str, judged: str | None = None
) -> None:
    """Refuse ``path`` (what the caller gave for ``field``) unless ``judged`` (default: the path
    itself) resolves inside ``roots``."""
    if is_inside(path if judged is None else judged, roots):
        return
    with ctx.db.transaction() as session:
        audit.append(
            session, ctx.audit_key, ctx.actor, "job.submit", f"project/{project}", outcome="denied",
            detail={"field": field, "reason": "path outside the data roots"},
        )  # fmt: skip
    allowed = ", ".join(map(str, roots)) or "none are configured"
    raise Forbidden(
        f"{field} {path!r} is not inside a data root of project {project!r}",
        hint=f"jobs submitted through the server read only below the project's data roots ({allowed}; "
        f"`data_roots` in the server's {SERVER_FILE}, set by a cluster admin) or store: datasets "
        "(`shipyard storage put`); give an absolute path inside one",
    )
