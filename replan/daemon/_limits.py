"""What a request may carry: bodies larger than the configured size get 413,
unread; query parameters no endpoint takes are dropped before anything sees
them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote_plus

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    """ASGI middleware: refuse bodies over ``max_bytes``.

    A declared ``Content-Length`` over the limit is refused before anything
    is read; a body streamed without one is counted as it arrives, and the
    app sees a disconnect once it passes the limit.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send)
            return
        seen = 0
        refused = False

        async def counting_receive() -> Message:
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes and not refused:
                    refused = True
                    await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, counting_receive, guarded_send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "detail": f"the request body is larger than {self.max_bytes} bytes",
                "field": "body",
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    headers: Any = scope.get("headers", [])
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class KnownQuery:
    """ASGI wrapper: keep only the query parameters some endpoint takes.

    The endpoints ignore the others anyway; dropped before the app (and the
    web framework's own HTTP spans, which record ``url.query``) sees the
    request, a token pasted into a URL by mistake is never recorded. The
    parameters kept are passed on byte for byte.
    """

    def __init__(self, app: ASGIApp, names: Iterable[str]) -> None:
        self.app = app
        self.names = frozenset(names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw: bytes = scope.get("query_string", b"") if scope["type"] == "http" else b""
        if raw:
            parts = [p for p in raw.split(b"&") if p]
            kept = [p for p in parts if self._known(p)]
            if len(kept) != len(parts):
                scope = {**scope, "query_string": b"&".join(kept)}
        await self.app(scope, receive, send)

    def _known(self, part: bytes) -> bool:
        name = part.split(b"=", 1)[0].decode("latin-1")
        return unquote_plus(name) in self.names


class KnownQueryInAccessLog(logging.Filter):
    """The access log's request line with the query :class:`KnownQuery`
    passes on: the server logs the request as it came, before the app (and
    its filter) sees it, which would write a token pasted into a URL into
    the log."""

    def __init__(self, names: Iterable[str]) -> None:
        super().__init__()
        self.names = frozenset(names)

    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn logs '%s - "%s %s HTTP/%s" %d': client, method, the path
        # with its query string, version, status.
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            path, sep, query = args[2].partition("?")
            if sep:
                kept = [p for p in query.split("&") if self._known(p)]
                shown = f"{path}?{'&'.join(kept)}" if kept else path
                record.args = (*args[:2], shown, *args[3:])
        return True

    def _known(self, part: str) -> bool:
        return unquote_plus(part.split("=", 1)[0]) in self.names
