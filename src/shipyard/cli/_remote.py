"""Where a command sends its work: the server at ``SHIPYARD_URL`` (after ``shipyard login``), or
the embedded platform under ``$SHIPYARD_HOME`` when no server is configured."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from shipyard.durable import write_atomically
from shipyard.errors import Unauthenticated
from shipyard.settings import Settings

if TYPE_CHECKING:
    from shipyard.client import Client
    from shipyard.services.context import ServiceContext

CREDENTIALS = "credentials.json"
T = TypeVar("T")


def credentials_path() -> Path:
    return Settings.from_env().home / CREDENTIALS


def server_url() -> str | None:
    """``SHIPYARD_URL``, else the server of the last ``shipyard login``."""
    if os.environ.get("SHIPYARD_URL"):
        return os.environ["SHIPYARD_URL"]
    saved = _saved()
    return saved.get("url") if saved else None


def _saved() -> dict[str, Any] | None:
    path = credentials_path()
    return json.loads(path.read_text()) if path.exists() else None


def save_credentials(url: str, user: str, token: str) -> Path:
    """Kept with mode 0600, written atomically."""
    path = credentials_path()
    write_atomically(path, json.dumps({"url": url, "user": user, "token": token}).encode(), mode=0o600)
    return path


def client() -> Client:
    """A ``shipyard.client.Client`` for the configured server (imported only when one is)."""
    from shipyard.client import Client

    url = server_url()
    assert url is not None
    token = os.environ.get("SHIPYARD_TOKEN") or (_saved() or {}).get("token")
    if not token:
        raise Unauthenticated(f"no token for {url}", hint=f"run `shipyard login {url}` or set SHIPYARD_TOKEN")
    return Client(url, token)


def either(remote: Callable[[Client], T], embedded: Callable[[ServiceContext], T]) -> T:
    """Run on the configured server, else on the embedded platform as the local admin."""
    if server_url():
        with client() as remote_client:
            return remote(remote_client)
    ctx = embedded_context()
    try:
        return embedded(ctx)
    finally:
        ctx.close()


def embedded_context() -> ServiceContext:
    """The embedded platform as the local admin, which starts the home's agent when there is
    work for it (jobs queued, a repair of the store owed)."""
    from shipyard.cli._contexts import command_context
    from shipyard.daemon.supervisor import Supervisor

    return command_context(start_agent=Supervisor())
