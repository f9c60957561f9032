"""The bearer token check, made before a ``/v1`` request is routed or read.

Checking in the app's dependencies would come too late: FastAPI reads and
parses the body first, so a caller without a token could learn that its
body was malformed. This ASGI middleware answers 401 (no token) or 403 (a
wrong one) before anything else looks at the request.
"""

from __future__ import annotations

import json

from fastapi.security.utils import get_authorization_scheme_param
from starlette.types import ASGIApp, Receive, Scope, Send

from ._token import Token

PREFIX = "/v1"


def authorization_problem(
    token: Token, authorization: str | None
) -> tuple[int, str] | None:
    """Why an ``Authorization`` header value is refused, or None if it is not.

    Returns:
        ``(401, detail)`` without a bearer token, ``(403, detail)`` with a
        wrong one, None with the right one.
    """
    scheme, credentials = get_authorization_scheme_param(authorization)
    if scheme.lower() != "bearer" or not credentials:
        return 401, "a bearer token is required"
    if not token.matches(credentials):
        return 403, "the bearer token is not valid"
    return None


class BearerAuth:
    """ASGI middleware: every request under ``/v1`` needs the bearer token."""

    def __init__(self, app: ASGIApp, token: Token) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        problem = authorization_problem(self.token, _header(scope, b"authorization"))
        if problem is None:
            await self.app(scope, receive, send)
            return
        status, detail = problem
        body = json.dumps({"detail": detail, "field": "authorization"}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send(
            {"type": "http.response.start", "status": status, "headers": headers}
        )
        await send({"type": "http.response.body", "body": body})


def _guarded(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            # Starlette decodes header values as Latin-1 too.
            return bytes(value).decode("latin-1")
    return None
