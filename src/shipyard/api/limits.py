"""Request bodies bounded before anything parses them."""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shipyard.api.errors import problem
from shipyard.errors import PayloadTooLarge
from shipyard.schemas.documents import MAX_DOCUMENT_BYTES

DRAIN_BYTES = 64 << 20
DRAIN_S = 2.0
"""How much of a refused body is read and dropped, and for how long, before the connection closes."""


class LimitBodies:
    """Refuses a request body past ``limit`` bytes with 413 before anything parses it: the
    declared length is checked first, a body without one is read up to the limit and handed on
    whole. Artifact uploads stream to disk under their own limit and pass through."""

    def __init__(self, app: ASGIApp, limit: int = MAX_DOCUMENT_BYTES) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD") or _is_upload(scope):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(int(declared), scope, receive, send)
            return
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                if more:
                    await self._drain(receive)
                await self._refuse(len(body), scope, receive, send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # a disconnect, while the app streams its answer
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, size: int, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem(
            413,
            PayloadTooLarge.code,
            f"the request body is {size:,} bytes or more; this server reads at most {self.limit:,}",
            "a request carries settings, not data: store files with `shipyard storage put`",
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)

    async def _drain(self, receive: Receive) -> None:
        """Read and drop the rest of a body sent without a declared length, for a moment and up
        to a bound, before answering: the connection closes after the answer, and closing on
        unread bytes resets it, so that the client would lose the 413 (a lingering close, as
        web servers do). A body declared too large is refused before it is sent."""
        left, deadline = DRAIN_BYTES, time.monotonic() + DRAIN_S
        while left > 0 and (remaining := deadline - time.monotonic()) > 0:
            try:
                message = await asyncio.wait_for(receive(), remaining)
            except TimeoutError:
                return
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                return
            left -= len(message.get("body", b""))


def _is_upload(scope: Scope) -> bool:
    return scope["method"] == "PUT" and str(scope["path"]).startswith("/api/v1/artifacts/")
