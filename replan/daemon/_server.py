"""``replan serve``: the API under uvicorn, with a graceful SIGTERM.

uvicorn's own signal handling re-raises the signal after shutting down (so
the process would end by SIGTERM, not exit 0) and knows nothing of the
supervisor; here the daemon handles SIGTERM and SIGINT itself: refuse new
runs and end the event streams, let uvicorn finish the requests in flight,
then drain the supervisor (the lifespan's exit) and return normally.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Generator
from contextlib import contextmanager

import anyio
import uvicorn

from ..telemetry import setup_if_asked
from ._app import create_app
from ._models import build_model
from ._service import Daemon
from ._settings import DaemonSettings
from ._token import resolve_token


class _Server(uvicorn.Server):
    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The daemon listens for the signals itself (see serve()).
        yield


def build_daemon(settings: DaemonSettings) -> Daemon:
    """Resolve the token and the model, announcing a newly generated token.

    Raises:
        ConfigurationError: a setting cannot be used (names the field).
    """
    token = resolve_token(settings)
    model = build_model(settings)
    if token.generated_into is not None:
        print(
            f"replan: generated an API token (kept in {token.generated_into}, "
            f"mode 0600; shown only now): {token.value}",
            file=sys.stderr,
            flush=True,
        )
    return Daemon(settings=settings, token=token, model=model)


def serve(settings: DaemonSettings) -> None:
    """Serve until SIGTERM or SIGINT, then drain and return.

    Raises:
        ConfigurationError: a setting cannot be used (names the field).
    """
    daemon = build_daemon(settings)
    level = settings.log_level.upper()
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    config = uvicorn.Config(
        create_app(daemon),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        timeout_graceful_shutdown=max(1, int(settings.drain_grace_s)),
    )
    server = _Server(config)

    async def main() -> None:
        async with anyio.create_task_group() as tg:

            async def on_signals() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                    async for _ in sigs:
                        daemon.begin_shutdown()
                        if server.should_exit:
                            server.force_exit = True
                        server.should_exit = True

            tg.start_soon(on_signals)
            await server.serve()
            tg.cancel_scope.cancel()
        if server.started is False and not server.should_exit:
            raise SystemExit(3)

    # Spans and metrics are flushed once the drain has journaled the runs.
    with setup_if_asked():
        # uvicorn runs on asyncio only.
        anyio.run(main, backend="asyncio")
