"""The daemon in the test's own process: its app behind an ASGI client, or
served over HTTP on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx

from replan.daemon import create_app
from replan.daemon._listen import listen
from replan.daemon._server import Shutdown, run_server, uvicorn_server
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


@asynccontextmanager
async def listening(daemon: Daemon) -> AsyncIterator[str]:
    """Serve ``daemon`` as ``replan serve`` does (uvicorn, asyncio only) on a
    free port of 127.0.0.1 and give its URL once it is ready; the block's
    end stops it as a second SIGTERM does (nothing drained)."""
    server = uvicorn_server(daemon)
    sockets = listen("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    try:
        async with anyio.create_task_group() as tg:
            shutdown: Shutdown = await tg.start(run_server, daemon, server, sockets)
            try:
                async with httpx.AsyncClient(base_url=url) as client:
                    for _ in range(2000):
                        if (await client.get("/readyz")).status_code == 200:
                            break
                        await anyio.sleep(0.01)
                    else:
                        raise AssertionError("the daemon did not start in 20 s")
                yield url
            finally:
                shutdown.request()
                shutdown.request()
    finally:
        for sock in sockets:
            sock.close()
