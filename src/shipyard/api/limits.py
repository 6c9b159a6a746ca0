"""Request bodies bounded before anything parses them, refusals that reach the client, and
per-user caps on what a server process does at once for one user (uploads, log streams)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from threading import Lock

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shipyard.api.errors import problem
from shipyard.errors import PayloadTooLarge, Throttled
from shipyard.schemas.documents import MAX_DOCUMENT_BYTES

DRAIN_BYTES = 64 << 20
DRAIN_S = 2.0
"""How much of a refused body is read and dropped, and for how long, before the answer."""


class LimitBodies:
    """Refuses a request body past ``limit`` bytes with 413 before anything parses it: the
    declared length is checked first, a body without one is read up to the limit and handed on
    whole. Artifact uploads stream to disk under their own limit and pass through.

    Any refusal (4xx, 5xx) sent while the client is still sending its body first reads and
    drops what it sends, up to ``DRAIN_BYTES`` for ``DRAIN_S``: most clients (Python's
    ``http.client``, ``requests``, most SDKs) send the whole body before they read, and a server
    that closes on unread bytes resets the connection, so that they never see the answer. A
    client that asked ``Expect: 100-continue`` is answered at once instead: it sends nothing."""

    def __init__(self, app: ASGIApp, limit: int = MAX_DOCUMENT_BYTES) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        body = _Body(receive, waits_to_send=(b"expect", b"100-continue") in scope["headers"])
        send = body.refusing_after_drain(send)
        if _is_upload(scope):
            await self.app(scope, body.receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(int(declared), scope, body.receive, send)
            return
        whole, more = bytearray(), True
        while more:
            message = await body.receive()
            if message["type"] == "http.disconnect":
                return
            whole += message.get("body", b"")
            more = message.get("more_body", False)
            if len(whole) > self.limit:
                await self._refuse(len(whole), scope, body.receive, send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # a disconnect, while the app streams its answer
            replayed = True
            return {"type": "http.request", "body": bytes(whole), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, size: int, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem(
            413,
            PayloadTooLarge.code,
            f"the request body is {size:,} bytes or more; this server reads at most {self.limit:,}",
            "a request carries settings, not data: store files with `shipyard storage put`",
        )
        await response(scope, receive, send)


class _Body:
    """A request's body as the app reads it, and what is left of it to drop before a refusal."""

    def __init__(self, receive: Receive, *, waits_to_send: bool) -> None:
        self._receive, self.waits_to_send = receive, waits_to_send
        self.complete = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            self.complete = True
        return message

    def refusing_after_drain(self, send: Send) -> Send:
        async def answer(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400 and not self.complete:
                if not self.waits_to_send:
                    await self._drain()
                if not self.complete:  # bytes are left unread: the connection cannot be reused
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        return answer

    async def _drain(self) -> None:
        left, deadline = DRAIN_BYTES, time.monotonic() + DRAIN_S
        while left > 0 and not self.complete and (remaining := deadline - time.monotonic()) > 0:
            try:
                message = await asyncio.wait_for(self.receive(), remaining)
            except TimeoutError:
                return
            left -= len(message.get("body", b""))


def _has_body(scope: Scope) -> bool:
    headers = dict(scope["headers"])
    length = headers.get(b"content-length", b"")
    return (length.isdigit() and int(length) > 0) or b"transfer-encoding" in headers


def _is_upload(scope: Scope) -> bool:
    return scope["method"] == "PUT" and str(scope["path"]).startswith("/api/v1/artifacts/")


class PerUser:
    """At most ``limit`` of one kind of long request (an upload, a log stream) at once per user
    in a server process; one more is answered 429 at once."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit, self.what = limit, what
        self._held: Counter[str] = Counter()
        self._lock = Lock()

    @contextmanager
    def hold(self, user: str) -> Iterator[None]:
        release = self.acquire(user)
        try:
            yield
        finally:
            release()

    def acquire(self, user: str) -> Callable[[], None]:
        """Take one of ``user``'s places (``Throttled`` if none is left); returns what gives it back."""
        with self._lock:
            if self._held[user] >= self.limit:
                raise Throttled(
                    f"{user} has {self.limit} {self.what} open at once already on this server",
                    retry_after_s=1.0,
                    hint=f"wait for one of them to end; at most {self.limit} at a time",
                )
            self._held[user] += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._held[user] -= 1
                if not self._held[user]:
                    del self._held[user]

        return release
