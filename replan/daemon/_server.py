"""``replan serve``: the API under uvicorn, with a graceful SIGTERM.

Before anything opens the journal, ``serve`` takes the data directory's
lock (one daemon per journal) and binds the port, so a second daemon or a
busy port is a one-line error while no run has been resumed.

uvicorn's own signal handling re-raises the signal after shutting down (so
the process would end by SIGTERM, not exit 0), stops listening at once and
knows nothing of the supervisor; here the daemon handles SIGTERM, SIGINT
and SIGHUP itself (see :class:`Shutdown`): it drains the runs while uvicorn still
answers, then lets uvicorn finish the requests in flight and return.
Before it serves and after, ``replan serve``'s own handlers stop it at
once (exit 0); the event loop's receiver puts them back as it closes.

The daemon (its journal, and the runs it resumes from it) starts beside
uvicorn, not in the app's lifespan, which uvicorn finishes before it
answers anything: a journal of thousands of unfinished runs takes a while
to resume, and meanwhile ``/healthz`` answers 200 and the rest 503 with
``Retry-After`` (a liveness probe that timed out would restart the daemon
over and over, and clients would wait without an answer).
"""

from __future__ import annotations

import gc
import logging
import signal
import socket
import sys
from collections.abc import Generator
from contextlib import contextmanager

import anyio
import uvicorn
from anyio.abc import TaskStatus

from .._cli_signals import stop_signals
from ..store import DriverLease
from ..telemetry import setup_if_asked
from ._accept import AcceptPausingLoop
from ._app import QUERY_PARAMETERS, create_app
from ._files import AcceptErrors, raise_open_files_limit
from ._limits import KnownQuery, KnownQueryInAccessLog
from ._listen import listen, remove_port_file, url_of, write_port_file
from ._lock import data_dir_lock
from ._models import build_model, build_tools
from ._service import Daemon, open_journal
from ._settings import DaemonSettings
from ._token import resolve_token

logger = logging.getLogger("replan.daemon")

TELEMETRY_FLUSH_S = 5.0
"""How long a stopping daemon waits to send its last spans and metrics."""
GC_YOUNG_THRESHOLD = 10_000
"""Allocations between the collector's young passes in the daemon (CPython's
default is 700)."""


def tune_gc() -> None:
    """Spare the daemon most of the garbage collector's work.

    The daemon owns its process, so it may set what a library must not.
    What exists before the server starts (modules, settings, the app) lives
    until the process ends: frozen, no later collection walks it again. The
    supervisor, its pools and resumed runs are made later, when the app
    starts, so nothing that may die in a reference cycle is frozen (a frozen
    object is never collected). A run allocates thousands of short-lived
    objects that reference counting frees and that form no cycles; the
    default young threshold of 700 makes the collector walk them (and
    promote survivors, which the full passes then walk too) every few
    hundred allocations. With both, 1,000 runs over HTTP complete ~20 %
    sooner (``benchmarks/w5_daemon.py``) for ~1.5 MiB more peak memory; the
    rare cyclic garbage is still collected, a little later.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


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
    # The model and tools first: a first start that fails on them must not
    # leave behind a generated token it never showed.
    model = build_model(settings)
    tools = build_tools(settings)
    token = resolve_token(settings)
    if token.generated_into is not None:
        print(
            f"replan: generated an API token (kept in {token.generated_into}, "
            f"mode 0600; shown only now): {token.value}",
            file=sys.stderr,
            flush=True,
        )
    return Daemon(settings=settings, token=token, model=model, tools=tools)


class Shutdown:
    """The course of SIGTERM, SIGINT and SIGHUP: drain while serving, then stop uvicorn.

    The first :meth:`request` refuses new runs (503) and ends the event
    streams at once; :meth:`run` then drains the supervisor while uvicorn
    keeps answering (``/readyz`` says 503, runs can still be read), and
    only then tells uvicorn to exit. A second request stops at once: the
    drain is cut short and uvicorn does not wait for open connections.
    """

    def __init__(self, daemon: Daemon, server: uvicorn.Server) -> None:
        self._daemon = daemon
        self._server = server
        self._requested = anyio.Event()

    def request(self) -> None:
        """Begin the shutdown, or force it if it has begun (a signal handler)."""
        if not self._requested.is_set():
            self._daemon.begin_shutdown()
            self._requested.set()
            return
        self._daemon.hurry()
        self._server.force_exit = True
        self._server.should_exit = True

    async def run(self) -> None:
        """Wait for the first request, drain, then tell uvicorn to exit."""
        await self._requested.wait()
        logger.info("shutting down: draining the runs in flight")
        await self._daemon.drain()
        self._server.should_exit = True


def uvicorn_server(daemon: Daemon) -> uvicorn.Server:
    """uvicorn serving the daemon's app, with the daemon's signal handling."""
    settings = daemon.settings
    config = uvicorn.Config(
        # run_server starts the daemon itself, beside uvicorn.
        KnownQuery(create_app(daemon, start=False), QUERY_PARAMETERS),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        timeout_graceful_shutdown=max(1, int(settings.drain_grace_s)),
    )
    # After the config, which sets up uvicorn's loggers.
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, KnownQueryInAccessLog) for f in access.filters):
        access.addFilter(KnownQueryInAccessLog(QUERY_PARAMETERS))
    return _Server(config)


async def run_server(
    daemon: Daemon,
    server: uvicorn.Server,
    sockets: list[socket.socket],
    *,
    task_status: TaskStatus[Shutdown] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve on ``sockets`` until a :class:`Shutdown` has run, and return.

    The daemon starts (resuming the journal's runs) while uvicorn already
    answers. SIGTERM, SIGINT and SIGHUP request the shutdown; so can whoever starts
    this with ``tg.start``, which hands them the :class:`Shutdown`.

    Raises:
        SystemExit: the daemon could not start (logged why).
    """
    shutdown = Shutdown(daemon, server)
    running = _Running(daemon, server)
    failed = False
    async with anyio.create_task_group() as tg:
        # Before the server and the daemon start: from here on a signal
        # drains them.
        await tg.start(_on_signals, shutdown)
        tg.start_soon(shutdown.run)
        tg.start_soon(running.run)
        task_status.started(shutdown)
        try:
            await server.serve(sockets=sockets)
        except SystemExit:
            # Raised inside this task group it would come out wrapped.
            failed = True
        await _finish_lifespan(server)
        # Drains what is left (quick after the Shutdown's drain) and closes
        # the journal; a start still resuming runs is cut short.
        await running.stop()
        tg.cancel_scope.cancel()
    if failed or running.failed:
        raise SystemExit(3)


LIFESPAN_SHUTDOWN_S = 1.0
"""How long a forced stop waits for the app's lifespan to finish."""


async def _finish_lifespan(server: uvicorn.Server) -> None:
    """End the app's lifespan if uvicorn stopped without ending it.

    A forced stop (a second signal) or a stop during uvicorn's start skips
    the lifespan's shutdown: its task was left waiting for it, and the
    event loop cancelled it as it closed, which uvicorn logged as an error
    with a traceback. The app's lifespan does nothing here (the daemon
    runs beside uvicorn), so its shutdown is quick.
    """
    lifespan = getattr(server, "lifespan", None)
    done = getattr(lifespan, "shutdown_event", None)
    if lifespan is None or done is None or done.is_set():
        return
    with anyio.move_on_after(LIFESPAN_SHUTDOWN_S):
        await lifespan.shutdown()


class _Running:
    """The daemon's ``running()``, entered beside uvicorn and left once it
    has stopped."""

    def __init__(self, daemon: Daemon, server: uvicorn.Server) -> None:
        self._daemon = daemon
        self._server = server
        self._scope = anyio.CancelScope()
        self._started = False
        self._stopped = anyio.Event()
        self._done = anyio.Event()
        self.failed = False

    async def run(self) -> None:
        try:
            with self._scope:
                async with self._daemon.running():
                    self._started = True
                    await self._stopped.wait()
        except Exception as exc:
            what = "stopped on an error" if self._started else "could not start"
            logger.error("the daemon %s: %s", what, exc, exc_info=exc)
            self.failed = True
            self._daemon.begin_shutdown()
            self._server.should_exit = True
        finally:
            self._done.set()

    async def stop(self) -> None:
        """Leave ``running()``, or stop the start where it is; wait for it."""
        self._stopped.set()
        if not self._started and not self._done.is_set():
            logger.info(
                "stopped while starting: the runs not resumed yet wait in the "
                "journal for the next start"
            )
            self._scope.cancel()
        await self._done.wait()


async def _on_signals(
    shutdown: Shutdown, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Request the shutdown on SIGTERM, SIGINT and SIGHUP.

    The handlers installed before (``replan serve`` stops at once on a
    signal before the daemon serves, and after) are put back as this ends:
    the event loop would leave the default ones, and a signal as the
    daemon sends its last spans would kill it.
    """
    handled = stop_signals()
    previous = {s: signal.getsignal(s) for s in handled}
    try:
        with anyio.open_signal_receiver(*handled) as signals:
            task_status.started()
            async for _ in signals:
                shutdown.request()
    finally:
        for s, handler in previous.items():
            if handler is not None:
                signal.signal(s, handler)


def check_journal(settings: DaemonSettings) -> None:
    """Refuse, before serving, a journal the daemon could not serve from.

    The app opens it as it starts; refused there, uvicorn would log a
    traceback and exit 3. Here the refusal is the command's one line.

    Raises:
        ConfigurationError: the file cannot hold a journal (``path``), the
            PostgreSQL journal cannot be opened (``journal_dsn``,
            ``schema``), or another supervisor drives runs in a SQLite
            journal (``store``).
    """

    async def probe() -> None:
        async with open_journal(settings) as store:
            # A journal that leases runs one by one (PostgreSQL) is shared
            # by daemons that each resume the runs they can claim.
            if isinstance(store, DriverLease):
                store.hold_lease(store, exclusive=True)

    anyio.run(probe)


def serve(settings: DaemonSettings) -> None:
    """Serve until SIGTERM, SIGINT or SIGHUP, then drain and return.

    Raises:
        ConfigurationError: a setting cannot be used (names the field),
            another daemon uses the data directory (``data_dir``), or the
            port is in use (``port``).
    """
    # Before the token is resolved: its warnings (a token file others may
    # read) go to the log, not to the library's NullHandler.
    logging.basicConfig(
        level=settings.log_level.upper(),
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
    with data_dir_lock(settings):
        daemon = build_daemon(settings)
        # Before the port is bound: a bad OTEL_* value is a one-line error
        # with nothing started.
        telemetry = setup_if_asked()
        try:
            _listen_and_serve(settings, daemon)
        finally:
            # Spans and metrics are flushed once the drain has journaled
            # the runs; a collector that is down holds the exit briefly.
            if not telemetry.shutdown(timeout_s=TELEMETRY_FLUSH_S):
                logger.warning(
                    "telemetry not sent within %gs (is the OTLP collector running?)",
                    TELEMETRY_FLUSH_S,
                )
            # Nothing is left to collect that matters: the interpreter's
            # last collections at exit would walk every object the runs
            # left (seconds for thousands of runs) after the daemon stopped.
            gc.freeze()


def _listen_and_serve(settings: DaemonSettings, daemon: Daemon) -> None:
    open_files = raise_open_files_limit()
    sockets = listen(settings.host, settings.port)
    # Now: uvicorn closes the sockets as it stops.
    url = url_of(sockets[0])
    try:
        check_journal(settings)
        loop_log = logging.getLogger("asyncio")
        for old in [f for f in loop_log.filters if isinstance(f, AcceptErrors)]:
            loop_log.removeFilter(old)
        loop_log.addFilter(AcceptErrors(open_files))
        if settings.port_file is not None:
            # After the journal's check: a file there means connections
            # are answered (they wait in the backlog as the daemon starts).
            write_port_file(settings.port_file, url)
        # Once nothing is left to refuse the start.
        for sock in sockets:
            logger.info("listening on %s", url_of(sock))
        server = uvicorn_server(daemon)
        tune_gc()
        # uvicorn runs on asyncio only.
        anyio.run(
            run_server,
            daemon,
            server,
            sockets,
            backend="asyncio",
            backend_options={"loop_factory": AcceptPausingLoop},
        )
    finally:
        if settings.port_file is not None:
            remove_port_file(settings.port_file, url)
        for sock in sockets:
            sock.close()
