"""Connections of the PostgreSQL journal: a small pool driven from worker
threads.

psycopg's async connection runs on asyncio only; replan runs on trio too. So
the store uses psycopg's blocking connections, each from one worker thread
at a time (``anyio.to_thread.run_sync``), which works the same on both.
"""

from __future__ import annotations

import select
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import psycopg
from anyio.lowlevel import RunVar
from psycopg import pq

_T = TypeVar("_T")

Connect = Callable[[], "psycopg.Connection[Any]"]


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

    def __init__(self, connect: Connect, size: int) -> None:
        self._connect = connect
        self._size = size
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        # One per event loop: a store may outlive the loop it was first used
        # in (one anyio.run after another, a fixture shared by tests), and
        # an anyio primitive is bound to one loop of one backend.
        self._limiters: RunVar[anyio.CapacityLimiter] = RunVar("replan-pg-pool")
        self.closed = False

    def give(self, conn: psycopg.Connection[Any]) -> None:
        """Add an open connection (the one the store was set up with)."""
        self._put(conn)

    async def run(self, work: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        """``work(connection)`` in a worker thread; its result or error.

        Raises:
            anyio.ClosedResourceError: the pool is closed.
        """
        if self.closed:
            raise anyio.ClosedResourceError
        limiter = self._limiters.get(None)
        if limiter is None:
            limiter = anyio.CapacityLimiter(self._size)
            self._limiters.set(limiter)
        return await anyio.to_thread.run_sync(self._work, work, limiter=limiter)

    def _work(self, work: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        conn = self._take()
        try:
            return work(conn)
        finally:
            self._put(conn)

    def _take(self) -> psycopg.Connection[Any]:
        while True:
            with self._lock:
                if self.closed:
                    raise anyio.ClosedResourceError
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
