"""The journal in a PostgreSQL database: for processes or machines that share it.

Needs the ``postgres`` extra (``pip install 'replan[postgres]'``: psycopg 3).
"""

from __future__ import annotations

import functools
import math
import re
import time
import warnings
from collections.abc import Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio

try:
    import psycopg
except ModuleNotFoundError as exc:  # pragma: no cover - without the extra
    raise ModuleNotFoundError(
        "PostgresStore needs the 'postgres' extra: pip install 'replan[postgres]'",
        name=exc.name,
    ) from exc
from psycopg import conninfo
from pydantic import BaseModel

from .._errors import ConfigurationError
from ..messages import (
    Event,
    GateResolution,
    RunCompacted,
    RunStatus,
    event_json,
    read_event,
)
from ._port import (
    EffectRecord,
    JournalConflict,
    JournalCorrupt,
    LeaseLost,
    RequestOutcome,
    RunLease,
    RunOwner,
    RunRequest,
    RunSummary,
    ToolEffectRecord,
)
from ._postgres_pool import Pool, connect
from ._postgres_rows import summary_of_row, summary_values
from ._postgres_schema import Queries, set_up
from ._rows import check_follows, check_page, corrupt, event_row, to_text

_Record = TypeVar("_Record", bound=BaseModel)
_Conn = psycopg.Connection[Any]

_FINAL = [str(s) for s in RunStatus if s.final]
_UNFINISHED = [str(s) for s in RunStatus if not s.final]
LEASE_S_RANGE = (1.0, 3600.0)
"""The shortest and longest ``lease_s`` a store takes."""
RECONNECT_S_MAX = 3600.0
"""The longest ``reconnect_s`` a store takes."""
_MAX_NAME = 63
"""The longest identifier PostgreSQL keeps whole, in bytes."""


class PostgresStore:
    """A journal in a PostgreSQL database, shared by processes and machines.

    The same rows as :class:`~replan.store.SQLiteStore` (events as the JSON
    of :data:`~replan.messages.EVENT_ADAPTER`, times as ISO-8601 text in
    UTC), in the tables of one schema, created on first use and checked for
    their version on every open. Several stores, in as many processes, may
    share a schema: an append is one transaction that moves the run's head
    on from the seq its first event follows, under the run row's lock, so
    two writers of one run are ordered and the later gets a
    :class:`~replan.store.JournalConflict`. Runs are leased one by one
    (:class:`~replan.store.RunLeases`), so that each is driven by one
    supervisor, and taken over by another once its supervisor's process
    died and its lease expired.

    Calls run psycopg's blocking connections in worker threads, at most
    ``pool_size`` at a time, so the store works on asyncio and trio alike.
    A call whose caller is cancelled still finishes (its transaction
    commits or rolls back) before the cancellation takes effect.

    Opening connects at once, as :class:`~replan.store.SQLiteStore` opens
    its file: it blocks the calling thread for up to ``connect_timeout_s``.

    Args:
        dsn: a libpq connection string (``postgresql://user@host/db`` or
            ``host=... dbname=...``). It must reach PostgreSQL itself, or a
            pooler in session mode: a connection's settings live in its
            session.
        schema: the schema that holds the journal's tables (created if
            missing). Several journals can share a database under several
            schemas.
        pool_size: the most connections (and concurrent calls) the store
            uses.
        connect_timeout_s: how long a connection attempt may take.
        lease_s: how long a run stays leased to its supervisor after the
            last renewal (1 to 3600 s; the supervisor renews every third of
            it): how soon another supervisor takes over the runs of one
            whose process died.
        reconnect_s: how long a call waits for a server it cannot reach,
            or that dropped its connection (a restart, a failover, a
            proxy's idle timeout), trying again after 0.1 s, then twice as
            long each time up to 2 s, before it fails with psycopg's
            ``OperationalError`` (0 to 3600 s; 0 fails at once). A run
            whose append waits so pauses, and goes on once the server is
            back; ``outage`` says what is wrong meanwhile.

    Raises:
        ConfigurationError: (field ``dsn``) the string is not a connection
            string, the server cannot be reached or refuses the login, the
            database is not UTF-8, or the tables cannot be created,
            checked or written to (no privilege, a read-only server);
            (field ``schema``) the name is empty, too long or PostgreSQL's
            own (``pg_...``), or the schema holds another application's
            tables or a newer replan's journal; (``pool_size``) not a whole
            number, 1 or more; (``connect_timeout_s``) not positive and
            finite; (``lease_s``) not a number of seconds from 1 to 3600;
            (``reconnect_s``) not a number of seconds from 0 to 3600.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "replan",
        pool_size: int = 4,
        connect_timeout_s: float = 10.0,
        lease_s: float = 30.0,
        reconnect_s: float = 30.0,
    ) -> None:
        self._pool: Pool | None = None
        if not schema or len(schema.encode()) > _MAX_NAME or "\x00" in schema:
            raise ConfigurationError(
                "schema", f"expected a name of 1 to {_MAX_NAME} bytes, got {schema!r}"
            )
        if schema.startswith("pg_"):
            raise ConfigurationError(
                "schema",
                f"names that start with 'pg_' are PostgreSQL's own, got {schema!r}",
            )
        if (
            not isinstance(pool_size, int)
            or isinstance(pool_size, bool)
            or pool_size < 1
        ):
            raise ConfigurationError(
                "pool_size", f"expected a whole number, 1 or more, got {pool_size!r}"
            )
        if not 0 < connect_timeout_s < math.inf:
            raise ConfigurationError(
                "connect_timeout_s",
                f"expected a positive, finite time, got {connect_timeout_s}",
            )
        low, high = LEASE_S_RANGE
        if (
            isinstance(lease_s, bool)
            or not isinstance(lease_s, int | float)
            or not low <= lease_s <= high
        ):
            raise ConfigurationError(
                "lease_s",
                f"expected a number of seconds from {low:g} to {high:g}, "
                f"got {lease_s!r}",
            )
        if (
            isinstance(reconnect_s, bool)
            or not isinstance(reconnect_s, int | float)
            or not 0 <= reconnect_s <= RECONNECT_S_MAX
        ):
            raise ConfigurationError(
                "reconnect_s",
                f"expected a number of seconds from 0 to {RECONNECT_S_MAX:g}, "
                f"got {reconnect_s!r}",
            )
        self._lease_s = float(lease_s)
        self._lease_for = timedelta(seconds=lease_s)
        try:
            params = conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            raise ConfigurationError(
                "dsn",
                f"not a connection string: {_without_password(_one_line(exc), dsn)}",
            ) from None
        params.setdefault("application_name", "replan")
        # libpq takes whole seconds; 1 s is its shortest wait.
        params["connect_timeout"] = str(max(1, round(connect_timeout_s)))
        self._conninfo = conninfo.make_conninfo("", **params)
        self.schema = schema
        self.journal = f"{_where(params)} (schema {schema})"
        """Where the journal is, for messages: the DSN without its password."""
        self._queries = Queries.of(schema)
        try:
            first = connect(self._conninfo)
        except psycopg.Error as exc:
            raise ConfigurationError(
                "dsn",
                f"cannot connect to {self.journal}: "
                f"{_without_password(_one_line(exc), dsn)}",
            ) from None
        # Where it connected, libpq's defaults (PGHOST, PGUSER...) resolved.
        info = first.info
        where = {"user": info.user, "host": info.host, "port": info.port}
        self.journal = f"{_where({**where, 'dbname': info.dbname})} (schema {schema})"
        try:
            set_up(first, schema, self.journal)
            # From when, by the server's clock, this store could reach it:
            # leases that lapsed before are left to their owners for a
            # lease (see claim_run).
            opened = first.execute("SELECT now()").fetchone()
            assert opened is not None
            self._since: datetime = opened[0]
        except psycopg.Error as exc:
            # A read-only server or database, a lost connection...
            first.close()
            raise ConfigurationError(
                "dsn", f"{self.journal}: cannot set up the journal: {_one_line(exc)}"
            ) from None
        except BaseException:
            first.close()
            raise
        # Plain functions, not bound methods: the store is in no reference
        # cycle, and an unclosed one is finalized (and warned of) at once.
        self._pool = Pool(
            functools.partial(connect, self._conninfo),
            pool_size,
            journal=self.journal,
            reconnect_s=reconnect_s,
        )
        self._pool.give(first)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.journal!r})"

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` ran: every call is then refused."""
        return self._pool is None or self._pool.closed

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None and not pool.closed:
            warnings.warn(
                f"unclosed {self!r}", ResourceWarning, stacklevel=2, source=self
            )
            pool.close()

    @property
    def outage(self) -> str | None:
        """Where the journal is and why its server cannot be reached, from
        the first call that could not reach it until one does again; None
        while it works."""
        return None if self._pool is None else self._pool.outage

    def stop_waiting(self) -> None:
        """Stop waiting for a server that cannot be reached: the calls that
        wait for it fail (within 2 s, with psycopg's ``OperationalError``)
        instead of waiting out ``reconnect_s``, and so do later ones, after
        one try, until a call reaches the server again. For a process that
        stops at once (a daemon's second signal) during an outage."""
        if self._pool is not None:
            self._pool.stop_waiting()

    def _connections(self) -> Pool:
        if self._pool is None or self._pool.closed:
            raise anyio.ClosedResourceError(f"{self!r} is closed")
        return self._pool

    # The journal ------------------------------------------------------------------

    async def append(
        self,
        run_id: str,
        events: Sequence[Event],
        summary: RunSummary,
        *,
        owner: RunOwner | None = None,
    ) -> None:
        """Append ``events`` to the run's journal (see :class:`Store`).

        With ``owner``, only while it holds the run's lease (see
        :class:`~replan.store.RunLeases`): the run's first append takes the
        lease, every other renews it, and one of a final status lets go of
        it. Without, only while nobody holds it.

        Raises:
            LeaseLost: another owner holds the run's lease.
            JournalConflict: an event's ``seq`` is not the next in the run,
                or (without ``owner``) a supervisor holds the run's lease.
        """
        pool = self._connections()
        # Serialized and checked first: an event that cannot be stored, or a
        # batch with a gap, fails before anything is sent.
        rows = [event_row(run_id, e) for e in events]
        if events:
            check_follows(run_id, events, events[0].seq - 1)
        values = summary_values(run_id, summary)
        release = summary.status.final
        values |= {
            "owner": None if owner is None else owner.id,
            "new_owner": None if owner is None or release else owner.id,
            "holder": None if owner is None else owner.holder,
            "release": release,
            "lease": self._lease_for,
        }
        queries = self._queries
        tries = 0

        def write(conn: _Conn) -> None:
            nonlocal tries
            tries += 1
            with conn.transaction():
                if not events:
                    conn.execute(
                        queries.summarize, {**values, "head": 0, "head_at": None}
                    )
                    return
                first, last = events[0].seq, events[-1]
                moved = {
                    **values,
                    "before": first - 1,
                    "head": last.seq,
                    "head_at": to_text(last.at),
                }
                if conn.execute(queries.advance, moved).rowcount == 0 and (
                    first != 1 or conn.execute(queries.new_run, moved).rowcount == 0
                ):
                    if tries > 1 and _written(conn, queries, run_id, rows):
                        # Committed as the connection dropped: tried again
                        # (see Pool.run), it finds its own events.
                        return
                    row = conn.execute(queries.head, (run_id,)).fetchone()
                    head, holds, holder = (0, None, None) if row is None else row
                    if owner is not None and holds != owner.id:
                        raise _lease_lost(run_id, holder)
                    if owner is None and holds is not None:
                        raise JournalConflict(
                            f"run {run_id}: {holder} holds its lease and "
                            "drives it; append with its owner"
                        )
                    raise JournalConflict(
                        f"run {run_id}: expected seq {head + 1}, got {first}"
                    )
                try:
                    with conn.cursor() as cursor:
                        cursor.executemany(queries.insert_event, rows)
                except psycopg.errors.UniqueViolation as exc:
                    # Rows the head does not account for (written by hand?).
                    raise JournalConflict(f"run {run_id}: {_one_line(exc)}") from None

        # Shielded, as SQLiteStore's: once called, the append journals its
        # events (or fails) before its caller's cancellation takes effect. A
        # call cancelled while it waited for a thread would have written
        # nothing, and its caller (a run cancelled as it journals a step)
        # would stage its end after events the journal never got.
        with anyio.CancelScope(shield=True):
            await pool.run(write)

    async def read(self, run_id: str, after: int = 0) -> list[Event]:
        query = self._queries.read
        rows = await self._connections().run(
            lambda conn: conn.execute(query, (run_id, after)).fetchall(), read=True
        )
        events: list[Event] = []
        for seq, payload in rows:
            try:
                events.append(read_event(payload))
            except (ValueError, TypeError) as exc:
                raise self._corrupt(run_id, f"event {seq}", exc, seq=seq) from None
        return events

    async def get_run(self, run_id: str) -> RunSummary | None:
        query = self._queries.get_run
        row = await self._connections().run(
            lambda conn: conn.execute(query, (run_id,)).fetchone(), read=True
        )
        return None if row is None else self._summary(row)

    async def list_runs(
        self,
        *,
        statuses: Sequence[RunStatus] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RunSummary]:
        check_page(limit, offset)
        params: tuple[object, ...]
        if statuses is None:
            query, params = self._queries.list_runs, (limit, offset)
        else:
            query = self._queries.list_runs_with
            params = ([str(s) for s in statuses], limit, offset)
        rows = await self._connections().run(
            lambda conn: conn.execute(query, params).fetchall(), read=True
        )
        return [self._summary(row) for row in rows]

    async def aclose(self) -> None:
        pool = self._pool
        if pool is not None and not pool.closed:
            pool.close()

    # Effect ledger --------------------------------------------------------------

    async def record_effect(
        self, run_id: str, record: EffectRecord, *, owner: RunOwner | None = None
    ) -> None:
        """Keep ``record`` (see :class:`~replan.store.EffectLedger`); with
        ``owner``, only while it holds the run's lease, as an append.

        Raises:
            LeaseLost: another owner holds the run's lease, or nobody does.
        """
        params = {
            "run_id": run_id,
            "task_id": record.task_id,
            "attempt": record.attempt,
            "payload": record.model_dump_json(),
        }
        await self._record(
            self._queries.record_effect,
            self._queries.owned_effect,
            params | {"ended": False},
            owner,
        )

    async def read_effects(self, run_id: str) -> list[EffectRecord]:
        return await self._records(
            EffectRecord, "effect record", self._queries.read_effects, run_id
        )

    async def record_tool_effect(
        self, run_id: str, record: ToolEffectRecord, *, owner: RunOwner | None = None
    ) -> None:
        """Keep ``record`` (see :class:`~replan.store.ToolEffectLedger`);
        with ``owner``, only while it holds the run's lease, as an append.

        Raises:
            LeaseLost: another owner holds the run's lease, or nobody does.
        """
        params: dict[str, object] = {
            "run_id": run_id,
            "task_id": record.task_id,
            "key": record.key,
            "payload": record.model_dump_json(),
            # What a call under way as its run ended returned: kept.
            "ended": record.content is not None,
        }
        queries = self._queries
        await self._record(
            queries.record_tool_effect, queries.owned_tool_effect, params, owner
        )

    async def _record(
        self,
        query: Any,
        owned: Any,
        params: dict[str, object],
        owner: RunOwner | None,
    ) -> None:
        """Write a ledger's record; with ``owner``, in the statement that
        checks it holds the run's lease."""
        pool = self._connections()
        if owner is None:
            await pool.run(lambda conn: conn.execute(query, params))
            return
        run_id = str(params["run_id"])
        head = self._queries.head

        def write(conn: _Conn) -> None:
            checked = {**params, "owner": owner.id, "unfinished": _UNFINISHED}
            if conn.execute(owned, checked).rowcount:
                return
            row = conn.execute(head, (run_id,)).fetchone()
            raise _lease_lost(run_id, None if row is None else row[2])

        await pool.run(write)

    async def read_tool_effects(
        self, run_id: str, task_id: str | None = None
    ) -> list[ToolEffectRecord]:
        what = "tool effect record"
        if task_id is None:
            query = self._queries.read_run_tool_effects
            return await self._records(ToolEffectRecord, what, query, run_id)
        query = self._queries.read_tool_effects
        return await self._records(ToolEffectRecord, what, query, run_id, task_id)

    async def _records(
        self, model: type[_Record], what: str, query: Any, run_id: str, *more: str
    ) -> list[_Record]:
        """The payloads ``query`` selects for the run, validated as ``model``.

        Raises:
            JournalCorrupt: a payload is not a valid ``model``.
        """
        rows = await self._connections().run(
            lambda conn: conn.execute(query, (run_id, *more)).fetchall(), read=True
        )
        try:
            return [model.model_validate_json(payload) for (payload,) in rows]
        except (ValueError, TypeError) as exc:
            raise self._corrupt(run_id, what, exc) from None

    # Retention ------------------------------------------------------------------

    async def finished_before(
        self, before: datetime, *, include_compacted: bool, limit: int
    ) -> list[str]:
        query = self._queries.finished_before
        params = (to_text(before), _FINAL, include_compacted, limit)
        rows = await self._connections().run(
            lambda conn: conn.execute(query, params).fetchall()
        )
        return [run_id for (run_id,) in rows]

    async def compact_run(self, run_id: str, snapshot: RunCompacted) -> None:
        pool = self._connections()
        row = (
            run_id,
            snapshot.seq,
            snapshot.kind,
            event_json(snapshot).decode(),
            to_text(snapshot.at),
        )
        queries = self._queries

        def compact(conn: _Conn) -> None:
            with conn.transaction():
                found = conn.execute(queries.lock_head, (run_id,)).fetchone()
                last = 0 if found is None else found[0]
                if snapshot.seq != last:
                    raise JournalConflict(
                        f"run {run_id}: the snapshot ends at seq {snapshot.seq}, "
                        f"the journal at {last}"
                    )
                for statement in queries.compact:
                    conn.execute(statement, (run_id,))
                conn.execute(queries.insert_event, row)
                conn.execute(queries.set_head_at, (row[-1], run_id))

        await pool.run(compact)

    async def delete_run(self, run_id: str) -> None:
        queries = self._queries

        def delete(conn: _Conn) -> None:
            with conn.transaction():
                for statement in queries.delete:
                    conn.execute(statement, (run_id,))

        await self._connections().run(delete)

    # Run leases (see RunLeases) ------------------------------------------------

    @property
    def lease_s(self) -> float:
        """How long a run stays leased after its last renewal, in seconds."""
        return self._lease_s

    def _recovering(self) -> bool:
        """Whether this store reached its server again less than a lease
        ago, after it could not: the leases that expired meanwhile are
        likely those of live supervisors that could not renew them either,
        and are left for them to renew until a lease has passed."""
        pool = self._pool
        if pool is None:
            return False
        back = pool.reachable_again_at
        return pool.outage is not None or (
            back is not None and time.monotonic() - back < self._lease_s
        )

    async def claim_run(self, run_id: str, owner: RunOwner) -> RunLease | None:
        """Take the run's lease (see :class:`~replan.store.RunLeases`).

        A lease another owner let lapse before the server was reachable
        for this store still holds for a lease after that: a lapse before
        the server started (``pg_postmaster_start_time()``) or before this
        store opened may be an outage's (the server, or the way to it, was
        down for everyone), and its owner may live and renew it once it
        reaches the server again. So does every lease another owner let
        lapse, for a lease after this store reached its server again
        following an outage it saw. A run whose owner died is taken over
        once that lease has passed; one whose lease lapses later, while the
        server is reachable, is taken over at its expiry.
        """
        queries = self._queries
        params = {
            "run_id": run_id,
            "owner": owner.id,
            "holder": owner.holder,
            "lease": self._lease_for,
            "unfinished": _UNFINISHED,
            "since": self._since,
        }

        def claim(conn: _Conn) -> RunLease | None:
            # Judged as the call reaches the server (it may have waited).
            params["recovering"] = self._recovering()
            # Taken, or held by another: asked again should the other let
            # go of it between the two statements.
            for _ in range(3):
                row = conn.execute(queries.claim, params).fetchone()
                if row is None:
                    row = conn.execute(queries.lease_of, params).fetchone()
                    if row is None:
                        # Finished, unknown, or let go of meanwhile: the
                        # run's row says which.
                        if conn.execute(queries.unfinished, params).fetchone():
                            continue
                        return None
                    if not row[3]:
                        return None  # finished, its lease not yet let go of
                return RunLease(
                    run_id=run_id, owner=row[0], holder=row[1], expires_at=row[2]
                )
            return None

        return await self._connections().run(claim)

    async def renew_leases(self, owner: RunOwner, run_ids: Sequence[str]) -> set[str]:
        if not run_ids:
            return set()
        query = self._queries.renew
        params = {"owner": owner.id, "lease": self._lease_for, "run_ids": list(run_ids)}
        rows = await self._connections().run(
            lambda conn: conn.execute(query, params).fetchall()
        )
        return {run_id for (run_id,) in rows}

    async def release_leases(
        self, owner: RunOwner, run_ids: Sequence[str] | None = None
    ) -> None:
        query = self._queries.release
        params = {
            "owner": owner.id,
            "every": run_ids is None,
            "run_ids": list(run_ids or ()),
        }
        await self._connections().run(lambda conn: conn.execute(query, params))

    async def claimable_runs(self, owner: RunOwner) -> list[str]:
        query = self._queries.claimable
        params = {
            "owner": owner.id,
            "unfinished": _UNFINISHED,
            "lease": self._lease_for,
            "since": self._since,
        }

        def claimable(conn: _Conn) -> list[Any]:
            # Judged as the call reaches the server (it may have waited).
            recovering = self._recovering()
            return conn.execute(query, {**params, "recovering": recovering}).fetchall()

        rows = await self._connections().run(claimable)
        return [run_id for (run_id,) in rows]

    async def run_lease(self, run_id: str) -> RunLease | None:
        query = self._queries.lease_of
        params = {
            "run_id": run_id,
            "unfinished": _UNFINISHED,
            "recovering": False,
            "lease": self._lease_for,
            "since": None,
        }
        row = await self._connections().run(
            lambda conn: conn.execute(query, params).fetchone()
        )
        if row is None:
            return None
        return RunLease(run_id=run_id, owner=row[0], holder=row[1], expires_at=row[2])

    # Requests for runs another supervisor drives (see RunRequests) ---------

    async def add_request(
        self,
        run_id: str,
        sender: str,
        *,
        gate_id: str | None = None,
        resolution: GateResolution | None = None,
    ) -> tuple[RunRequest, bool]:
        queries = self._queries
        payload = None if resolution is None else resolution.model_dump_json()
        params = (run_id, gate_id, payload, sender)

        def add(conn: _Conn) -> tuple[Any, bool]:
            # Another request's may be settled (a cancel) between the two
            # statements: tried again then.
            for _ in range(3):
                with conn.transaction():
                    if gate_id is not None:
                        # A refused answer left the gate open: this one
                        # takes its place.
                        conn.execute(queries.drop_refused, (gate_id,))
                    added = conn.execute(queries.add_request, params).fetchone()
                    if added is not None:
                        found = conn.execute(queries.get_request, added).fetchone()
                        return found, True
                    if gate_id is not None:
                        found = conn.execute(queries.answer_of, (gate_id,)).fetchone()
                    else:
                        found = conn.execute(
                            queries.waiting_cancel, (run_id,)
                        ).fetchone()
                    if found is not None:
                        return found, False
            raise JournalConflict(f"run {run_id}: its request could not be kept")

        row, added = await self._connections().run(add)
        return self._request(row), added

    async def get_request(self, request_id: int) -> RunRequest | None:
        query = self._queries.get_request
        row = await self._connections().run(
            lambda conn: conn.execute(query, (request_id,)).fetchone(), read=True
        )
        return None if row is None else self._request(row)

    async def waiting_requests(self, owner: RunOwner) -> list[RunRequest]:
        query = self._queries.waiting_requests
        params = {"owner": owner.id, "unfinished": _UNFINISHED}
        rows = await self._connections().run(
            lambda conn: conn.execute(query, params).fetchall()
        )
        return [self._request(row) for row in rows]

    async def settle_request(
        self, request_id: int, outcome: RequestOutcome, detail: str | None = None
    ) -> bool:
        query = self._queries.settle_request
        params = (outcome, detail, request_id)
        settled = await self._connections().run(
            lambda conn: conn.execute(query, params).rowcount
        )
        return bool(settled)

    def _request(self, row: Any) -> RunRequest:
        request_id, run_id, gate_id, payload, sender, outcome, detail = row
        try:
            resolution = (
                None if payload is None else GateResolution.model_validate_json(payload)
            )
            return RunRequest(
                id=request_id,
                run_id=run_id,
                gate_id=gate_id,
                resolution=resolution,
                sender=sender,
                outcome=outcome,
                detail=detail,
            )
        except (ValueError, TypeError) as exc:
            raise self._corrupt(run_id, f"request {request_id}", exc) from None

    def checkpoint_soon(self) -> None:
        """Nothing to do: PostgreSQL checkpoints by itself (for callers
        written for :class:`~replan.store.SQLiteStore`)."""

    def _summary(self, row: Any) -> RunSummary:
        try:
            return summary_of_row(row)
        except (ValueError, TypeError) as exc:
            raise self._corrupt(row[0], "summary row", exc) from None

    def _corrupt(
        self, run_id: str, what: str, exc: Exception, *, seq: int | None = None
    ) -> JournalCorrupt:
        return corrupt(self.journal, run_id, what, exc, seq=seq)


def _written(
    conn: _Conn, queries: Queries, run_id: str, rows: Sequence[tuple[object, ...]]
) -> bool:
    """Whether the journal holds exactly these rows (an append's, committed
    before its connection dropped)."""
    first, last = rows[0][1], rows[-1][1]
    found = conn.execute(queries.read_range, (run_id, first, last)).fetchall()
    return [tuple(r) for r in found] == [(row[1], row[3]) for row in rows]


def _lease_lost(run_id: str, holder: str | None) -> LeaseLost:
    """The error of a write by a supervisor whose lease of the run is lost."""
    return LeaseLost(
        f"run {run_id}: its lease is "
        + (f"{holder}'s" if holder else "nobody's")
        + " now; this supervisor no longer drives it",
        run_id=run_id,
        holder=holder,
    )


def _where(params: dict[str, Any]) -> str:
    """``postgresql://user@host:port/dbname`` from the connection's
    parameters, never its password; libpq's defaults where they are unset."""
    user = params.get("user") or "(default user)"
    host = params.get("host") or params.get("hostaddr") or "(default host)"
    port = params.get("port") or "5432"
    dbname = params.get("dbname") or user
    return f"postgresql://{user}@{host}:{port}/{dbname}"


_PASSWORDS = re.compile(
    # A URI's user info (scheme://user:PASSWORD@), or a keyword/value pair
    # (password=PASSWORD, password = 'PASS WORD').
    r"^\s*[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*?:(?P<uri>[^/?#]*)@"
    r"|\bpassword\s*=\s*(?P<kv>'(?:[^'\\]|\\.)*'?|\S+)"
)


def _without_password(message: str, dsn: str) -> str:
    """``message`` (libpq's, which may quote the DSN it could not read)
    with every password the DSN holds, as it is written there, left out."""
    for found in _PASSWORDS.finditer(dsn):
        secret = found.group("uri") or found.group("kv")
        if secret:
            message = message.replace(secret, "***")
    return message


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
