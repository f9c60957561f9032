"""Connections of the PostgreSQL journal: a small pool driven from worker
threads.

psycopg's async connection runs on asyncio only; replan runs on trio too. So
the store uses psycopg's blocking connections, each from one worker thread
at a time (``anyio.to_thread.run_sync``), which works the same on both.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import psycopg
from anyio.lowlevel import RunVar
from psycopg import pq

_T = TypeVar("_T")

Connect = Callable[[], "psycopg.Connection[Any]"]

logger = logging.getLogger("replan.store")

FIRST_DELAY_S = 0.1
"""The wait before a call tries an unreachable server again..."""
LONGEST_DELAY_S = 2.0
"""...doubled after each try, up to this."""


class _Unreachable(Exception):
    """The server could not be reached, or dropped the connection under a
    call (a restart, a failover, an administrator ending the session)."""

    def __init__(self, error: psycopg.Error, *, tried: bool = True) -> None:
        super().__init__(str(error))
        self.error = error
        self.tried = tried
        """False for a call that did not try, waiting for the pool's next
        try (see :meth:`Pool.run`)."""


class Pool:
    """At most ``size`` connections, each used by one thread at a time.

    A call waits for one of ``size`` worker threads, which takes an idle
    connection (or opens one) and gives it back once the work is done. The
    call is not abandoned when its caller is cancelled: the thread finishes
    the work (a transaction commits or rolls back) and the cancellation
    takes effect after it, so no connection is ever left in a transaction.
    A connection that is broken, or somehow still in a transaction, is
    closed instead of given back.
    """

    def __init__(
        self, connect: Connect, size: int, *, journal: str = "", reconnect_s: float = 0
    ) -> None:
        self._connect = connect
        self._size = size
        self._journal = journal
        self._reconnect_s = reconnect_s
        self.outage: str | None = None
        """What went wrong, while the server cannot be reached (from the
        first call that could not reach it to the next that did)."""
        self.reachable_again_at: float | None = None
        """When (``time.monotonic()``) a call last reached the server after
        an outage."""
        self._error: psycopg.Error | None = None
        self._outage_since: float | None = None
        self._delay = FIRST_DELAY_S
        self._retry_at = 0.0
        """No call tries an unreachable server before this (monotonic)."""
        self._impatient = False
        """Set by :meth:`stop_waiting`: calls wait no more for the server."""
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        # One per event loop: a store may outlive the loop it was first used
        # in (one anyio.run after another, a fixture shared by tests), and
        # an anyio primitive is bound to one loop of one backend.
        self._limiters: RunVar[tuple[anyio.CapacityLimiter, anyio.CapacityLimiter]]
        self._limiters = RunVar("replan-pg-pool")
        self.closed = False

    def _closed_message(self) -> str:
        return f"the PostgreSQL journal {self._journal} is closed"

    def give(self, conn: psycopg.Connection[Any]) -> None:
        """Add an open connection (the one the store was set up with)."""
        self._put(conn)

    async def run(
        self, work: Callable[[psycopg.Connection[Any]], _T], *, read: bool = False
    ) -> _T:
        """``work(connection)`` in a worker thread; its result or error.

        Reads (``read``) take at most ``size - 1`` of the threads at once
        (the one, with a pool of one), so that however many read (a
        daemon's event streams following runs in the journal), a write (an
        append, a lease's renewal) waits for no more than one of them.

        A server that cannot be reached, or that drops the connection under
        the work (a restart, a failover), is tried again, ``work`` on a new
        connection, after 0.1 s, then twice as long each time up to 2 s,
        until the server has been out of reach for ``reconnect_s`` (from
        the first call that could not reach it; a call made later than that
        tries once, when a try is due, and fails): ``work`` must be safe to do again
        after a connection lost at any point of it (the store's are: each
        is one transaction, an upsert, or checks what it finds). The first
        such failure of a streak is logged as a warning, and so is the
        first call that reaches the server again.

        Raises:
            anyio.ClosedResourceError: the pool is closed.
            psycopg.OperationalError: the server could not be reached for
                ``reconnect_s``.
        """
        if self.closed:
            raise anyio.ClosedResourceError(self._closed_message())
        limiters = self._limiters.get(None)
        if limiters is None:
            limiters = (
                anyio.CapacityLimiter(self._size),
                anyio.CapacityLimiter(max(1, self._size - 1)),
            )
            self._limiters.set(limiters)
        limiter, readers = limiters
        while True:
            try:
                if read:
                    async with readers:
                        result = await anyio.to_thread.run_sync(
                            self._work, work, limiter=limiter
                        )
                else:
                    result = await anyio.to_thread.run_sync(
                        self._work, work, limiter=limiter
                    )
            except _Unreachable as lost:
                now = time.monotonic()
                if lost.tried:
                    self._unreachable(lost.error, now)
                # The outage's, not the call's: once the server has been
                # out of reach for reconnect_s, calls fail at once (after a
                # try, when one is due), and a supervisor stopping meanwhile
                # does not wait again for each of its last writes.
                since = now if self._outage_since is None else self._outage_since
                give_up_at = since + self._reconnect_s
                if now >= give_up_at or self.closed or self._impatient:
                    raise lost.error from None
                wait = self._retry_at - now if self._retry_at > now else FIRST_DELAY_S
                await anyio.sleep(min(wait, give_up_at - now))
                continue
            self._impatient = False
            if self.outage is not None:
                self.outage = None
                self._outage_since = None
                self.reachable_again_at = time.monotonic()
                self._delay, self._retry_at = FIRST_DELAY_S, 0.0
                logger.warning("the journal at %s is reachable again", self._journal)
            return result

    def stop_waiting(self) -> None:
        """Let the calls that wait for an unreachable server fail at their
        next try (within :data:`LONGEST_DELAY_S`), and those made later
        fail after one try, until a call reaches the server again."""
        self._impatient = True

    def _unreachable(self, error: psycopg.Error, now: float) -> None:
        """A call could not reach the server: the calls of every caller try
        again no sooner than the delay, which doubles each time, so a crowd
        of waiting calls tries a few times per delay, not once each."""
        if self.outage is None:
            logger.warning(
                "the journal at %s cannot be reached; calls wait for it for "
                "up to %gs, then fail: %s",
                self._journal,
                self._reconnect_s,
                " ".join(str(error).split()),
            )
        if self._outage_since is None:
            self._outage_since = now
        self.outage = f"{self._journal}: {' '.join(str(error).split())}"
        self._error = error
        self._retry_at = max(self._retry_at, now + self._delay)
        self._delay = min(2 * self._delay, LONGEST_DELAY_S)

    def _work(self, work: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        error = self._error
        if self.outage is not None and error and time.monotonic() < self._retry_at:
            # A new error each time: one instance raised in many tasks
            # would gather every one's traceback, and their frames.
            raise _Unreachable(type(error)(*error.args), tried=False)
        try:
            conn = self._take()
        except psycopg.OperationalError as exc:
            raise _Unreachable(exc) from exc
        try:
            return work(conn)
        except psycopg.OperationalError as exc:
            # Not a lock wait that timed out, nor a query the server
            # refused: the session itself is gone.
            if conn.broken:
                raise _Unreachable(exc) from exc
            raise
        finally:
            self._put(conn)

    def _take(self) -> psycopg.Connection[Any]:
        while True:
            with self._lock:
                if self.closed:
                    raise anyio.ClosedResourceError(self._closed_message())
                if not self._idle:
                    break
                conn = self._idle.pop()
            if not hung_up(conn):
                return conn
            conn.close()
        return self._connect()

    def _put(self, conn: psycopg.Connection[Any]) -> None:
        if (
            not conn.closed
            and conn.info.transaction_status != pq.TransactionStatus.IDLE
        ):
            try:
                conn.rollback()
            except psycopg.Error:
                conn.close()
        if conn.broken:
            # The server went away (a restart, say): the idle ones are
            # likely gone too, and are not tried one failed call each.
            self._close_idle()
        with self._lock:
            if not conn.closed and not self.closed:
                self._idle.append(conn)
                return
        conn.close()

    def _close_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def close(self) -> None:
        """Close the idle connections; those in use close when their work ends."""
        self.closed = True
        self._close_idle()


LOCK_TIMEOUT_MS = 5000
"""How long a statement waits for a lock another session holds (a run's row
in another process's long transaction, a table an administrator locked)
before it fails, as the SQLite journal's busy timeout: the worker thread,
and a caller cancelled meanwhile, would otherwise wait for as long as the
other session pleases. A ``lock_timeout`` the DSN or the server sets is
kept."""


def connect(info: str) -> psycopg.Connection[Any]:
    """A connection to ``info`` in autocommit mode: a transaction is begun
    where one is needed (``with conn.transaction()``), never implicitly.
    Its lock waits are bounded (see :data:`LOCK_TIMEOUT_MS`); it talks
    UTF-8 whatever the DSN or ``PGCLIENTENCODING`` say: in another client
    encoding, text it cannot encode (a goal in Japanese on LATIN1) would
    fail the append that carries it; and its transactions are READ
    COMMITTED whatever the database's default: the journal orders a run's
    writers by its row's lock, and a serializable default would fail
    appends of unrelated runs that merely ran at once."""
    conn = psycopg.connect(info, autocommit=True)
    try:
        conn.execute(
            "SELECT set_config('client_encoding', 'UTF8', false), "
            "set_config('default_transaction_isolation', 'read committed', false), "
            "CASE WHEN current_setting('lock_timeout') = '0' "
            "THEN set_config('lock_timeout', %s, false) END",
            (f"{LOCK_TIMEOUT_MS}ms",),
        )
    except BaseException:
        conn.close()
        raise
    return conn


def hung_up(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle connection has heard from the server: a session the
    server ended (a restart, an administrator) says so before it closes,
    and the next query on it would fail. One poll, no round trip."""
    try:
        fd = conn.fileno()
        if _poll is None:  # pragma: no cover - Windows
            readable, _, _ = select.select([fd], [], [], 0)
            return bool(readable)
        # poll, not select: select refuses a descriptor past 1023 (a daemon
        # with many clients), and every call would open a new connection.
        poller = _poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True


_poll = getattr(select, "poll", None)
