"""``shipyard server`` (the API) and ``shipyard login`` (use one from this CLI)."""

from __future__ import annotations

import getpass
import os
import socket
from typing import Annotated

import typer

from shipyard.cli._remote import save_credentials
from shipyard.domain.paths import PRIVATE_UMASK
from shipyard.errors import DependencyMissing, InvalidSpec

TRUSTED_PROXIES_ENV = "SHIPYARD_TRUSTED_PROXIES"


def server(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 8765,
    init_admin: Annotated[
        str | None,
        typer.Option(
            help="NAME:PASSWORD of the first admin, created only when no user exists "
            "(or SHIPYARD_INIT_ADMIN). There is no default password."
        ),
    ] = None,
    workers: Annotated[int, typer.Option(help="Server processes.", min=1)] = 1,
    no_agent: Annotated[
        bool,
        typer.Option(
            "--no-agent",
            help="Control plane only: queue submitted jobs but start no agent on this host "
            "(agents run elsewhere against the same database).",
        ),
    ] = False,
    trusted_proxy: Annotated[
        list[str] | None,
        typer.Option(
            metavar="ADDRESS",
            help="Address (or CIDR) of a reverse proxy whose X-Forwarded-For names the client; "
            f"repeat for several (or {TRUSTED_PROXIES_ENV}=A,B). Default: none, the TCP peer is the client.",
        ),
    ] = None,
) -> None:
    """Serve the REST API under /api/v1, over SHIPYARD_DB_URL or the embedded database of
    SHIPYARD_HOME. The OpenAPI document is /openapi.json, browsable at /docs.

    Jobs submitted to the server train on this host: the first submission starts the home's
    agent, which runs them as the server's operating-system user (--no-agent leaves that to
    agents elsewhere). Paths in their specs must lie inside the project's data roots
    (`data_roots` in $SHIPYARD_HOME/server.yaml) or name store: datasets."""
    try:
        import uvicorn
    except ImportError:  # pragma: no cover - uvicorn is a core dependency
        raise DependencyMissing("uvicorn is not installed", hint="pip install 'shipyard'") from None
    from shipyard.api.protocol import TimedHttpProtocol

    os.umask(PRIVATE_UMASK)  # the database, run folders and stored blobs: this user's alone
    listener = _tcp_listener(host, port)  # a taken port is an Error: now, not uvicorn's trace
    admin = init_admin or os.environ.get("SHIPYARD_INIT_ADMIN")
    if admin:
        from shipyard.services.accounts import accounts
        from shipyard.services.context import local_actor, open_context

        ctx = open_context(actor=local_actor("server"))
        if accounts.ensure_initial_admin(ctx, admin):
            typer.echo(f"created the first admin {admin.partition(':')[0]!r}", err=True)
        ctx.close()
    if no_agent:
        from shipyard.api.app import NO_AGENT_ENV

        os.environ[NO_AGENT_ENV] = "1"  # read by the app in this process and in each worker
    proxies = trusted_proxy or [p for p in os.environ.get(TRUSTED_PROXIES_ENV, "").split(",") if p.strip()]
    config = uvicorn.Config(
        "shipyard.api.main:app",
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
        access_log=False,
        http=TimedHttpProtocol,  # headers and bodies sent too slowly end the connection
        # The client's address (the login throttle's, the audit log's) is the TCP peer, unless
        # the peer is a proxy the admin named: only then is its X-Forwarded-For believed.
        proxy_headers=bool(proxies),
        forwarded_allow_ips=[p.strip() for p in proxies] or None,
    )
    if workers == 1:
        uvicorn.Server(config).run(sockets=[listener])
        return
    from uvicorn.supervisors import Multiprocess

    Multiprocess(config, sockets=[listener]).run()


def ui(
    port: Annotated[int, typer.Option(help="Port to serve on (127.0.0.1 only).", min=1, max=65535)] = 8765,
    browser: Annotated[bool, typer.Option(help="Open a browser (else print the link).")] = True,
) -> None:
    """Open the web dashboard over this machine's home: serves it on 127.0.0.1 and signs you in
    with a link that works once, for two minutes (your account on the home is made the first
    time, an admin without a password). Stop it with Ctrl-C."""
    import getpass
    import threading
    import webbrowser

    import httpx

    from shipyard.services.accounts import accounts
    from shipyard.services.context import local_actor, open_context

    ctx = open_context(actor=local_actor("ui"))
    try:
        user = accounts.local_account(ctx, getpass.getuser())
        link = accounts.sign_in_link(ctx, user)
    finally:
        ctx.close()
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/login/link?token={link.token}"
    _tcp_listener("127.0.0.1", port).close()  # a taken port is an Error: now, not uvicorn's trace

    def announce() -> None:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                threading.Event().wait(0.1)
        typer.echo(f"Shipyard dashboard: {base} (sign-in link, once, two minutes: {url})", err=True)
        if browser:
            webbrowser.open(url)

    threading.Thread(target=announce, daemon=True).start()
    server(host="127.0.0.1", port=port, init_admin=None, workers=1, no_agent=False, trusted_proxy=None)


def _tcp_listener(host: str, port: int) -> socket.socket:
    """The workers' shared listening socket, made with ``IPPROTO_TCP`` named: accepted sockets
    inherit the protocol, and asyncio sets TCP_NODELAY only when it sees it. uvicorn's own
    (protocol 0) leaves Nagle on, and every keep-alive request then waits ~40 ms on the client's
    delayed ACK (uvicorn issue 3149)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise InvalidSpec(
            f"cannot listen on {host}:{port}: {exc.strerror}", hint="choose another --port"
        ) from exc
    listener.set_inheritable(True)
    return listener


def login(
    url: Annotated[str, typer.Argument(help="The server, e.g. http://127.0.0.1:8765")],
    user: Annotated[str | None, typer.Option(help="User name (default: your login name).")] = None,
) -> None:
    """Sign in to a server; later commands use it (SHIPYARD_URL overrides)."""
    from shipyard.client import Client

    name = user or getpass.getuser()
    password = os.environ.get("SHIPYARD_PASSWORD") or getpass.getpass(f"password for {name} at {url}: ")
    remote, issued = Client.login(url, name, password)
    remote.close()
    path = save_credentials(url, name, issued.token)
    typer.echo(f"signed in to {url} as {name}; token kept in {path} until {issued.expires_at}")


def register(app: typer.Typer) -> None:
    app.command()(server)
    app.command()(login)
    app.command()(ui)
