"""The PostgreSQL journal's drivers' lease: an advisory lock on a session
of its own (see :class:`~replan.store.DriverLease`)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import psycopg

from .._errors import ConfigurationError
from ._postgres_pool import Connect, connect, hung_up
from ._rows import lease_refused

LEASE_SETTINGS = {
    # The lease's session sits idle for as long as the supervisor serves: a
    # server's idle-session timeout must not end it (and the lease with it).
    "idle_session_timeout": "0",
    # On TCP, the server notices a peer that vanished (a machine cut off)
    # within about a minute and a half, and lets go of its lease.
    "tcp_keepalives_idle": "60",
    "tcp_keepalives_interval": "10",
    "tcp_keepalives_count": "3",
}


def lease_connection(info: str) -> psycopg.Connection[Any]:
    """A connection for the lease, its session set up to live as long as
    the process (see :data:`LEASE_SETTINGS`)."""
    conn = connect(info)
    try:
        for name, value in LEASE_SETTINGS.items():
            if name == "idle_session_timeout" and conn.info.server_version < 140000:
                continue  # no such setting before PostgreSQL 14
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    except BaseException:
        conn.close()
        raise
    return conn


class AdvisoryLease:
    """The drivers' lease: a session-level advisory lock, held shared or
    exclusive, never waited for, on a connection of its own.

    The server lets go of a session's advisory locks when the session ends,
    however its process ends: killed, crashed, or its machine cut off (once
    TCP keepalives notice; see the README). Letting go of the lease closes
    the connection.
    """

    def __init__(self, connect: Connect, key: tuple[int, int], journal: str) -> None:
        self._connect = connect
        self._key = key
        self._journal = journal
        self._conn: psycopg.Connection[Any] | None = None
        self._shared = False
        self._exclusive = False
        self._lock = threading.Lock()

    def hold(self, *, exclusive: bool) -> None:
        """Hold the lease shared, or exclusive, or convert a shared one; held
        already, make sure its session still lives, or take it again.

        Raises:
            ConfigurationError: another session holds it so that this one
                cannot, or the server cannot be reached (field ``store``).
        """
        with self._lock:
            if self._exclusive or (self._shared and not exclusive):
                if self._alive():
                    return  # held as strongly already
                # Its session ended (the server restarted, say), and the
                # lock with it: another daemon may hold it now. Taken
                # again below, or refused.
                self._drop()
            try:
                got = self._try(exclusive=exclusive)
            except psycopg.OperationalError:
                # The lease's session is gone (the server restarted, say),
                # and its locks with it: start again on a new one.
                self._drop()
                try:
                    got = self._try(exclusive=exclusive)
                except psycopg.OperationalError as exc:
                    self._drop()
                    raise ConfigurationError(
                        "store", f"cannot hold the lease of {self._journal}: {exc}"
                    ) from None
            if not got:
                if not self._shared:
                    self._drop()
                raise lease_refused(self._journal, exclusive=exclusive)

    def _alive(self) -> bool:
        """Whether the lease's session still lives: while it does, it holds
        the lock it took. No round trip unless the server has said something
        (a session it ended says so before it closes)."""
        conn = self._conn
        if conn is None or conn.broken or conn.closed:
            return False
        if not hung_up(conn):
            return True
        try:
            conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def _try(self, *, exclusive: bool) -> bool:
        if self._conn is None:
            self._conn = self._connect()
            self._shared = self._exclusive = False
        conn = self._conn
        row = conn.execute(
            "SELECT pg_try_advisory_lock(%s::int4, %s::int4)"
            if exclusive
            else "SELECT pg_try_advisory_lock_shared(%s::int4, %s::int4)",
            self._key,
        ).fetchone()
        if row is None or not row[0]:
            return False
        if exclusive:
            if self._shared:
                # A session's own shared lock does not stand in its way;
                # held both ways, it keeps only the exclusive one.
                conn.execute(
                    "SELECT pg_advisory_unlock_shared(%s::int4, %s::int4)", self._key
                )
            self._shared, self._exclusive = False, True
        else:
            self._shared = True
        return True

    def release(self) -> None:
        """Let go of the lease (idempotent)."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        held = self._shared or self._exclusive
        self._shared = self._exclusive = False
        if conn is None:
            return
        if held and not conn.broken:
            # Let go first: a closed session's locks go with it, but once
            # its server process has ended, a moment after the close
            # returns. Another store asking at once must find it free.
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock_all()")
        conn.close()
