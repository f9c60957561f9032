"""The daemon in the test's own process: its app behind an ASGI client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from replan.daemon import create_app
from replan.daemon._service import Daemon


@asynccontextmanager
async def serving(daemon: Daemon) -> AsyncIterator[httpx.AsyncClient]:
    """Run ``daemon`` (journal, supervisor) and a client of its API that
    sends its token."""
    transport = httpx.ASGITransport(app=create_app(daemon))
    headers = {"Authorization": f"Bearer {daemon.token.value}"}
    async with (
        daemon.running(),
        httpx.AsyncClient(
            transport=transport, base_url="http://replan", headers=headers
        ) as client,
    ):
        yield client
