"""The journal in one SQLite file: the embedded default store."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import sqlite3
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import anyio
import anyio.lowlevel
from pydantic import BaseModel

from .._errors import ConfigurationError
from ..messages import Event, RunCompacted, RunStatus, event_json, read_event
from ._port import (
    EffectRecord,
    JournalConflict,
    JournalCorrupt,
    RunSummary,
    ToolEffectRecord,
)
from ._rows import LeaseHolders, check_page, corrupt
from ._rows import check_follows as _check_follows
from ._rows import event_row as _event_row
from ._rows import lease_refused as _lease_refused
from ._rows import summary_from_row as _summary_from_row
from ._rows import to_text as _to_text

_Record = TypeVar("_Record", bound=BaseModel)

SCHEMA_VERSION = 3
"""The layout this module writes, kept in ``PRAGMA user_version``."""

_SCHEMA_V1 = (
    """
    CREATE TABLE events (
        run_id  TEXT    NOT NULL,
        seq     INTEGER NOT NULL,
        type    TEXT    NOT NULL,
        payload TEXT    NOT NULL,
        at      TEXT    NOT NULL,
        PRIMARY KEY (run_id, seq)
    )
    """,
    """
    CREATE TABLE runs (
        run_id      TEXT    NOT NULL PRIMARY KEY,
        goal        TEXT    NOT NULL,
        kind        TEXT    NOT NULL,
        pattern     TEXT    NOT NULL,
        status      TEXT    NOT NULL,
        created_at  TEXT    NOT NULL,
        updated_at  TEXT    NOT NULL,
        last_seq    INTEGER NOT NULL,
        stop_reason TEXT
    )
    """,
    "CREATE INDEX runs_by_status ON runs (status, created_at)",
)

# Version 2: the effect ledger (finished task attempts not yet journaled are
# found here after a crash) and an index for retention's age query.
_SCHEMA_V2 = (
    """
    CREATE TABLE effects (
        run_id  TEXT    NOT NULL,
        task_id TEXT    NOT NULL,
        attempt INTEGER NOT NULL,
        payload TEXT    NOT NULL,
        PRIMARY KEY (run_id, task_id, attempt)
    )
    """,
    "CREATE INDEX runs_by_update ON runs (updated_at)",
)

# Version 3: the side-effect tool calls that ran, by idempotency key (a task
# retried or run again after a crash reuses their results).
_SCHEMA_V3 = (
    """
    CREATE TABLE tool_effects (
        run_id  TEXT NOT NULL,
        task_id TEXT NOT NULL,
        key     TEXT NOT NULL,
        payload TEXT NOT NULL,
        PRIMARY KEY (run_id, task_id, key)
    )
    """,
)

_LAST_SEQ = "SELECT coalesce(max(seq), 0) FROM events WHERE run_id = ?"
_INSERT_EVENT = (
    "INSERT INTO events (run_id, seq, type, payload, at) VALUES (?, ?, ?, ?, ?)"
)
_ONE_STATEMENT_ROWS = 64
"""The most events an append writes with one multi-row INSERT."""


@functools.cache
def _insert_rows(count: int) -> str:
    """An INSERT of ``count`` events in one statement."""
    rows = ", ".join(["(?, ?, ?, ?, ?)"] * count)
    return f"INSERT INTO events (run_id, seq, type, payload, at) VALUES {rows}"


# The row is rewritten only when the status or stop reason changes (or the
# run is new to this store object); between those, a read takes ``last_seq``
# and ``updated_at`` from the run's newest event. Updating only the other
# columns leaves the status index untouched.
_UPDATE_RUN = """
    UPDATE runs SET goal = :goal, kind = :kind, pattern = :pattern,
        updated_at = :updated_at, last_seq = :last_seq, stop_reason = :stop_reason
    WHERE run_id = :run_id AND status = :status AND created_at = :created_at
"""
_REPLACE_RUN = """
    INSERT OR REPLACE INTO runs VALUES (:run_id, :goal, :kind, :pattern, :status,
        :created_at, :updated_at, :last_seq, :stop_reason)
"""
_READ = "SELECT seq, payload FROM events WHERE run_id = ? AND seq > ? ORDER BY seq"
_SELECT_RUNS = """
    SELECT r.run_id, r.goal, r.kind, r.pattern, r.status, r.created_at,
        coalesce(e.at, r.updated_at), coalesce(e.seq, r.last_seq), r.stop_reason
    FROM runs r LEFT JOIN events e ON e.run_id = r.run_id
        AND e.seq = (SELECT max(seq) FROM events WHERE run_id = r.run_id)
"""
_GET_RUN = f"{_SELECT_RUNS} WHERE r.run_id = ?"
_ORDER = "ORDER BY r.created_at DESC, r.run_id DESC LIMIT ? OFFSET ?"
_RECORD_EFFECT = (
    "INSERT OR REPLACE INTO effects (run_id, task_id, attempt, payload) "
    "VALUES (?, ?, ?, ?)"
)
_READ_EFFECTS = "SELECT payload FROM effects WHERE run_id = ? ORDER BY rowid"
# An upsert, not INSERT OR REPLACE: the row keeps its rowid, so records
# read back in the order their calls were first recorded.
_RECORD_TOOL_EFFECT = """
    INSERT INTO tool_effects (run_id, task_id, key, payload) VALUES (?, ?, ?, ?)
    ON CONFLICT (run_id, task_id, key) DO UPDATE SET payload = excluded.payload
"""
_READ_TOOL_EFFECTS = (
    "SELECT payload FROM tool_effects WHERE run_id = ? AND task_id = ? ORDER BY rowid"
)
_READ_RUN_TOOL_EFFECTS = (
    "SELECT payload FROM tool_effects WHERE run_id = ? ORDER BY rowid"
)
_RUN_TABLES = ("events", "effects", "tool_effects", "runs")
_FINAL = tuple(str(s) for s in RunStatus if s.final)
_FINISHED_BEFORE = f"""
    SELECT run_id FROM runs
    WHERE updated_at < ? AND status IN ({", ".join("?" * len(_FINAL))})
      AND (? OR EXISTS (SELECT 1 FROM events e WHERE e.run_id = runs.run_id
                        AND e.type != 'run_compacted'))
    ORDER BY updated_at, run_id LIMIT ?
"""


class SQLiteStore:
    """A journal in one SQLite file, in WAL mode.

    Every call runs sqlite3 synchronously on the caller's thread: an append is
    a few tens of microseconds, far less than handing it to a worker thread
    would cost. The price is that a call never yields to the event loop, and
    blocks it while another process holds the write lock (up to the 5 s busy
    timeout). Checkpoints (copying the WAL into the database file, with its
    fsyncs) are the one slow part of SQLite's commit path: every
    :data:`CHECKPOINT_EVERY` appends a thread of the store's own does the
    copying, and the next append finishes the round with the few pages
    written meanwhile (see ``_Checkpointer``). While several runs are live
    and writing, an append waits one pass of the event loop for the appends
    of other runs, and all of them share one transaction (group commit).

    Durability: with ``synchronous="NORMAL"`` (the default) a commit is written
    to the WAL but not fsynced, so a crash of the application loses nothing,
    while an OS crash or power loss may lose the last transactions (never
    corrupt the file). ``synchronous="FULL"`` fsyncs every commit.

    Event payloads are stored as the JSON of :data:`EVENT_ADAPTER`. The runs
    table keeps datetimes as ISO-8601 text, aware ones converted to UTC so the
    text sorts in time order: a summary reads back equal, its times in UTC.

    Args:
        path: the database file; missing parent directories are created.
        synchronous: SQLite's ``PRAGMA synchronous`` for this connection.
        read_only: open an existing journal for reading only: nothing is
            created or migrated, and every write raises ``PermissionError``.
            Inspecting a journal (``replan show``, ``replan runs``) this way
            cannot change what the file holds, even one that is no journal
            at all, and leaves no ``-wal``/``-shm`` files behind when no
            writer has the journal open.

    Raises:
        ConfigurationError: ``synchronous`` is not a supported level; or
            (field ``path``, naming the file) the file cannot be opened or
            created, is no SQLite database, holds another application's
            tables, or was written by a newer version of replan; read-only,
            also when the file does not exist or holds no journal yet.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        read_only: bool = False,
    ) -> None:
        self._conn: sqlite3.Connection | None = None
        if synchronous not in ("NORMAL", "FULL"):
            raise ConfigurationError(
                "synchronous", f"expected 'NORMAL' or 'FULL', got {synchronous!r}"
            )
        self.path = Path(path)
        self.read_only = read_only
        # The file itself, for what is opened later or by name: a relative
        # path still finds it after a chdir, and a symlink shares its lease
        # (as SQLite's WAL follows the link; a hard link's other name does
        # not, which nothing short of locking the file itself could catch).
        real = self.path.resolve()
        self._checkpointer = _Checkpointer(real, synchronous)
        self._lease = _Lease(real.with_name(real.name + _LEASE_SUFFIX))
        self._holders = LeaseHolders()
        # The last seq this store committed per run: an append then needs no
        # query to check that its events follow on. Another writer's rows
        # still collide on the primary key, which reads as a conflict.
        self._last_seq: dict[str, int] = {}
        # The status and stop reason this store last wrote to each run's row.
        self._row: dict[str, tuple[RunStatus, str | None]] = {}
        # Runs this store journals that have not ended: while more than one
        # is live, appends become ready together and share one commit.
        self._live: set[str] = set()
        self._previous: str | None = None
        """The run of the last append."""
        self._batch: _Batch | None = None
        self._inserts: sqlite3.Cursor | None = None
        """The cursor appends insert with: ``Connection.execute`` makes a
        cursor per call, which costs as much as binding the rows."""
        if read_only:
            self._conn = _connect(self.path, synchronous, read_only=True)
            return
        self._conn = _connect(self.path, synchronous)
        self._inserts = self._conn.cursor()
        self._conn.execute("PRAGMA wal_autocheckpoint = 0")
        # A burst may still grow the WAL; once rewound, it shrinks back.
        self._conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` ran: every call is then refused."""
        return self._conn is None

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
        conn = getattr(self, "_conn", None)
        if conn is not None:
            warnings.warn(
                f"unclosed {self!r}", ResourceWarning, stacklevel=2, source=self
            )
            self._checkpointer.stop(wait=False)
            conn.close()

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        conn = self._writable()
        # Serialized first: an event that cannot be stored fails its own
        # append before it joins anything.
        item = _Append(run_id, events, [_event_row(run_id, e) for e in events], summary)
        batch = self._batch
        if batch is not None:
            # A group commit is gathering: ride on it. Shielded, because once
            # handed over the events are committed whether or not this caller
            # still waits; it learns the outcome before it is cancelled.
            batch.items.append(item)
            if batch.done is None:
                batch.done = anyio.Event()
            with anyio.CancelScope(shield=True):
                await batch.done.wait()
        elif len(self._live) > 1 and run_id != self._previous:
            # Other runs are live and writing too: let every append that
            # becomes ready in this pass of the event loop join, then commit
            # them together. A run that writes alone while others wait (for
            # a person, say) keeps committing at once.
            batch = self._batch = _Batch([item])
            try:
                await anyio.lowlevel.cancel_shielded_checkpoint()
            finally:
                self._batch = None
                try:
                    self._commit_batch(batch.items)
                finally:
                    for other in batch.items:
                        if not other.committed and other.error is None:
                            other.error = RuntimeError(
                                "the group commit was interrupted"
                            )
                    if batch.done is not None:
                        batch.done.set()
        else:
            self._commit_one(conn, item)
        self._previous = run_id
        if item.error is not None:
            raise item.error

    def _commit_one(self, conn: sqlite3.Connection, item: _Append) -> None:
        """Commit one append in a transaction of its own."""
        run_id, events = item.run_id, item.events
        row = (item.summary.status, item.summary.stop_reason)
        last = self._last_seq.get(run_id)
        if (
            last is not None
            and 0 < len(events) <= _ONE_STATEMENT_ROWS
            and self._row.get(run_id) == row
        ):
            # Nearly every append: this store wrote the run's last event and
            # its row is current. One multi-row INSERT is its own transaction
            # (atomic, committed when it returns): no BEGIN and COMMIT.
            _check_follows(run_id, events, last)
            cursor = self._inserts
            try:
                _insert(conn if cursor is None else cursor, item)
            except BaseException:
                self._last_seq.pop(run_id, None)
                raise
            self._last_seq[run_id] = events[-1].seq
            item.committed = True
            self._after_commit(conn)
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._write(conn, item)
            conn.execute("COMMIT")
        except BaseException:
            self._forget(run_id)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self._settle(item)
        self._after_commit(conn)

    def _commit_batch(self, batch: list[_Append]) -> None:
        """Commit the appends of several runs in one transaction (group commit).

        Each append stays atomic on its own: should one fail (another
        writer's rows refuse its seq), the transaction is rolled back and
        each append is committed alone, so that only that one fails. When the
        transaction itself fails (the write lock is not to be had, say),
        every append fails with its error, without one more try each. Every
        append of the batch gets its outcome, whatever happens here.
        """
        try:
            conn = self._writable()
            if len(batch) > 1:
                one_failed = False
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for item in batch:
                        try:
                            self._write(conn, item)
                        except Exception:
                            one_failed = True
                            raise
                    conn.execute("COMMIT")
                except Exception:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    if not one_failed:
                        raise
                else:
                    for item in batch:
                        self._settle(item)
                    self._after_commit(conn, appends=len(batch))
                    return
            for item in batch:
                try:
                    self._commit_one(conn, item)
                except Exception as exc:
                    item.error = exc
        except Exception as exc:  # the store is closed, say
            for item in batch:
                self._forget(item.run_id)
                if item.error is None:
                    item.error = exc

    def _write(self, conn: sqlite3.Connection, item: _Append) -> None:
        """Write one append inside the caller's transaction; no cache changes."""
        run_id, events = item.run_id, item.events
        summary = item.summary
        last = self._last_seq.get(run_id)
        # A run's first append (its events start at 1) needs no query: had
        # another writer journaled the run, the primary key refuses seq 1.
        new_run = last is None and bool(events) and events[0].seq == 1
        if new_run:
            last = 0
        elif last is None:
            (last,) = conn.execute(_LAST_SEQ, (run_id,)).fetchone()
        _check_follows(run_id, events, last)
        cursor = self._inserts
        _insert(conn if cursor is None else cursor, item)
        known = self._row.get(run_id)
        if known != (summary.status, summary.stop_reason):
            # A new run has no row yet, and a changed status has none the
            # status-keyed update could match: write the row whole.
            whole = new_run or (known is not None and known[0] != summary.status)
            _write_summary(conn, run_id, summary, whole=whole)

    def _settle(self, item: _Append) -> None:
        """Remember what a committed append left: the run's seq and row."""
        run_id, summary = item.run_id, item.summary
        item.committed = True
        if summary.status.final:
            # Nothing follows a run's end: keep no cache of it, so that a
            # long-lived store's memory does not grow with every run.
            self._live.discard(run_id)
            self._forget(run_id)
            return
        self._row[run_id] = (summary.status, summary.stop_reason)
        if item.events:
            self._last_seq[run_id] = item.events[-1].seq
        self._live.add(run_id)

    def _forget(self, run_id: str) -> None:
        """After a failed append, or the run's end: the next append (if
        any) reads the journal again."""
        self._last_seq.pop(run_id, None)
        self._row.pop(run_id, None)

    def _after_commit(self, conn: sqlite3.Connection, appends: int = 1) -> None:
        if self._checkpointer.committed(appends):
            # The thread copied the bulk; copy what came meanwhile, so that
            # the next commit rewinds the WAL (a few pages and two fsyncs).
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    async def read(self, run_id: str, after: int = 0) -> list[Event]:
        try:
            rows = self._connection().execute(_READ, (run_id, after)).fetchall()
        except sqlite3.OperationalError as exc:
            if "decode" not in str(exc):
                raise
            raise self._corrupt(run_id, "an event", exc) from None  # not UTF-8
        events: list[Event] = []
        for seq, payload in rows:
            try:
                events.append(read_event(payload))
            except (ValueError, TypeError) as exc:
                raise self._corrupt(run_id, f"event {seq}", exc, seq=seq) from None
        return events

    async def get_run(self, run_id: str) -> RunSummary | None:
        row = self._connection().execute(_GET_RUN, (run_id,)).fetchone()
        return None if row is None else self._summary(row)

    async def list_runs(
        self,
        *,
        statuses: Sequence[RunStatus] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RunSummary]:
        check_page(limit, offset)
        conn = self._connection()
        if statuses is None:
            query = f"{_SELECT_RUNS} {_ORDER}"
            params: tuple[object, ...] = (limit, offset)
        else:
            marks = ", ".join("?" * len(statuses))
            query = f"{_SELECT_RUNS} WHERE r.status IN ({marks}) {_ORDER}"
            params = (*(str(s) for s in statuses), limit, offset)
        return [self._summary(row) for row in conn.execute(query, params)]

    async def aclose(self) -> None:
        self._holders.clear()
        self._lease.release()
        conn, self._conn = self._conn, None
        self._inserts = None
        if conn is not None:
            self._checkpointer.stop()
            # The last connection to close checkpoints the rest of the WAL.
            conn.close()

    # Effect ledger --------------------------------------------------------------

    async def record_effect(self, run_id: str, record: EffectRecord) -> None:
        # One statement is its own transaction: committed when it returns.
        self._writable().execute(
            _RECORD_EFFECT,
            (run_id, record.task_id, record.attempt, record.model_dump_json()),
        )

    async def read_effects(self, run_id: str) -> list[EffectRecord]:
        return self._records(EffectRecord, "effect record", _READ_EFFECTS, run_id)

    async def record_tool_effect(self, run_id: str, record: ToolEffectRecord) -> None:
        self._writable().execute(
            _RECORD_TOOL_EFFECT,
            (run_id, record.task_id, record.key, record.model_dump_json()),
        )

    async def read_tool_effects(
        self, run_id: str, task_id: str | None = None
    ) -> list[ToolEffectRecord]:
        if self.read_only and not self._has_tool_effects():
            return []  # a journal of an older replan, opened to be read
        if task_id is None:
            return self._records(
                ToolEffectRecord, "tool effect record", _READ_RUN_TOOL_EFFECTS, run_id
            )
        return self._records(
            ToolEffectRecord, "tool effect record", _READ_TOOL_EFFECTS, run_id, task_id
        )

    def _has_tool_effects(self) -> bool:
        found = self._connection().execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tool_effects'"
        )
        return found.fetchone() is not None

    def _records(
        self, model: type[_Record], what: str, query: str, run_id: str, *more: str
    ) -> list[_Record]:
        """The payloads ``query`` selects for the run, validated as ``model``.

        Raises:
            JournalCorrupt: a payload is not a valid ``model``.
        """
        rows = self._connection().execute(query, (run_id, *more)).fetchall()
        try:
            return [model.model_validate_json(payload) for (payload,) in rows]
        except (ValueError, TypeError) as exc:
            raise self._corrupt(run_id, what, exc) from None

    # Retention ------------------------------------------------------------------

    async def finished_before(
        self, before: datetime, *, include_compacted: bool, limit: int
    ) -> list[str]:
        params = (_to_text(before), *_FINAL, include_compacted, limit)
        rows = self._connection().execute(_FINISHED_BEFORE, params).fetchall()
        return [run_id for (run_id,) in rows]

    async def compact_run(self, run_id: str, snapshot: RunCompacted) -> None:
        conn = self._writable()
        payload = event_json(snapshot).decode()
        conn.execute("BEGIN IMMEDIATE")
        try:
            (last,) = conn.execute(_LAST_SEQ, (run_id,)).fetchone()
            if snapshot.seq != last:
                raise JournalConflict(
                    f"run {run_id}: the snapshot ends at seq {snapshot.seq}, "
                    f"the journal at {last}"
                )
            rows = conn.execute("DELETE FROM events WHERE run_id = ?", (run_id,))
            deleted = rows.rowcount
            conn.execute(
                _INSERT_EVENT,
                (run_id, snapshot.seq, snapshot.kind, payload, _to_text(snapshot.at)),
            )
            conn.execute("DELETE FROM effects WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM tool_effects WHERE run_id = ?", (run_id,))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        # It writes about as many pages as appending those events did.
        self._after_commit(conn, appends=max(1, deleted))

    async def delete_run(self, run_id: str) -> None:
        conn = self._writable()
        self._forget(run_id)
        self._live.discard(run_id)
        conn.execute("BEGIN IMMEDIATE")
        deleted = 0
        try:
            for table in _RUN_TABLES:
                rows = conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
                deleted += max(0, rows.rowcount)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self._after_commit(conn, appends=max(1, deleted))

    def checkpoint_soon(self) -> None:
        """Have the store's thread copy the WAL into the database file now
        and truncate it (after a burst of deletions, say, with no appends
        to follow and rewind it)."""
        if self._conn is not None:
            self._checkpointer.wake()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise anyio.ClosedResourceError(f"{self!r} is closed")
        return self._conn

    # The drivers' lease (see DriverLease) --------------------------------------

    def hold_lease(self, holder: object, *, exclusive: bool) -> None:
        """Hold ``PATH-drivers.lock`` shared, or alone to take over runs.

        ``flock`` on a file beside the journal: the kernel lets go of it
        when its holder exits, however it exits. Supervisors sharing this
        store object are told apart by ``holder``, as other processes are by
        the lock. A read-only store never drives a run and holds nothing.

        Raises:
            ConfigurationError: another supervisor holds the lease so that
                this one cannot (field ``store``, naming the journal).
        """
        if self.read_only:
            return
        exclusive = self._holders.admit(
            holder, exclusive, lambda alone: _lease_refused(self.path, exclusive=alone)
        )
        self._lease.hold(exclusive=exclusive)
        self._holders.hold(holder, exclusive)

    def release_lease(self, holder: object) -> None:
        if self._holders.release(holder):
            self._lease.release()

    def _summary(self, row: Any) -> RunSummary:
        try:
            return _summary_from_row(row)
        except (ValueError, TypeError) as exc:
            raise self._corrupt(row[0], "summary row", exc) from None

    def _corrupt(
        self, run_id: str, what: str, exc: Exception, *, seq: int | None = None
    ) -> JournalCorrupt:
        """The error for a row that does not read back, in one line."""
        return corrupt(self.path, run_id, what, exc, seq=seq)

    def _writable(self) -> sqlite3.Connection:
        conn = self._connection()
        if self.read_only:
            raise PermissionError(f"{self!r} is open read-only")
        return conn


CHECKPOINT_EVERY = 1024
"""Appends between two checkpoints: the WAL stays within about ten MiB.

Each round ends with the writer's own checkpoint of what was written during
it, two fsyncs on the event loop (2 to 8 ms on a loaded machine); a round
copies each page once however often it was rewritten since the last. At 256
the 6,200 appends of 200 concurrent W1 runs paid that 24 times, 60 to 80 ms
of their wall time, and the thread copied the same index pages over and
over."""
WAL_SIZE_LIMIT = 16 * 2**20
"""Bytes of WAL file kept when the WAL is rewound (``journal_size_limit``)."""


class _Checkpointer:
    """Checkpoints the WAL on a thread of its own, with its own connection.

    SQLite's automatic checkpoint runs inside the commit that crosses its
    threshold, on the committing thread: it copies every page the WAL holds
    into the database file and fsyncs both, which would stall the event loop
    for milliseconds. Here a thread does that copying with a passive
    checkpoint, which never blocks the writer. The thread starts on the
    first checkpoint a store needs, and sleeps between rounds.

    A passive checkpoint copies the frames that were in the WAL when it
    began; under a steady stream of commits it never catches up, and SQLite
    only rewinds the WAL once everything in it is copied. So after each of
    the thread's rounds, the writer checkpoints once more itself (see
    :meth:`committed`): only the frames written during the round are left,
    and the next commit starts the WAL from its beginning again.
    """

    def __init__(self, path: Path, synchronous: str) -> None:
        self._path = path
        self._synchronous = synchronous
        self._commits = 0
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._round_done = False
        self.rounds = threading.Semaphore(0)
        """Released once per finished checkpoint round (tests wait on it)."""

    def committed(self, appends: int = 1) -> bool:
        """Count a commit of ``appends`` appends (a group commit's are
        counted one by one, so the WAL grows by as much between rounds);
        True when the writer should finish a round now. Every append counts,
        the one whose commit finishes a round too: a round starts every
        :data:`CHECKPOINT_EVERY` appends exactly."""
        self._commits += appends
        if self._round_done:
            self._round_done = False
            return True
        if self._commits < CHECKPOINT_EVERY:
            return False
        self._commits = 0
        self._start()
        self._wake.set()
        return False

    def wake(self) -> None:
        """Start a round now (and the thread, if it has not started)."""
        self._commits = 0
        self._start()
        self._wake.set()

    def _start(self) -> None:
        if self._thread is None:
            # A daemon thread: a store nobody closed must not keep the
            # interpreter from exiting (an interrupted checkpoint is safe).
            self._thread = threading.Thread(
                target=self._run,
                name=f"replan-checkpoint {self._path.name}",
                daemon=True,
            )
            self._thread.start()

    def stop(self, *, wait: bool = True) -> None:
        """Stop the thread (after the checkpoint it may be running)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None and wait:
            self._thread.join()
            self._thread = None

    def _round(self, conn: sqlite3.Connection) -> None:
        (_, in_wal, copied) = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        wal = self._path.with_name(self._path.name + "-wal")
        with contextlib.suppress(OSError):
            if 0 <= in_wal == copied and wal.stat().st_size > WAL_SIZE_LIMIT:
                # All of it copied, and grown past its bound (deletions in a
                # burst): truncated now, where the next commit would only
                # rewind it, and none may come for a while. Never waited
                # for: busy, it is left to the next round.
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, timeout=0)
        except sqlite3.Error:
            return  # the writer's own close still checkpoints
        try:
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                # Busy (another checkpoint, a reader) is fine: the next
                # round copies what this one could not.
                with contextlib.suppress(sqlite3.Error):
                    self._round(conn)
                self._round_done = True
                self.rounds.release()
        finally:
            conn.close()


class _Lease:
    """A ``flock`` on one file, held shared or exclusive, never waited for."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._exclusive = False

    def hold(self, *, exclusive: bool) -> None:
        if self._fd is not None and (self._exclusive or not exclusive):
            return  # held as strongly already
        converting = self._fd is not None
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise ConfigurationError(
                    "store", f"cannot lock {self.path}: {exc}"
                ) from None
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(self._fd, mode | fcntl.LOCK_NB)
        except OSError as exc:
            # A refused conversion may have dropped the shared lock.
            if not (converting and self._share_again()):
                self.release()
            if not isinstance(exc, BlockingIOError):
                raise ConfigurationError(
                    "store", f"cannot lock {self.path}: {exc}"
                ) from None
            journal = self.path.with_name(self.path.name.removesuffix(_LEASE_SUFFIX))
            raise _lease_refused(journal, exclusive=exclusive) from None
        self._exclusive = exclusive

    def _share_again(self) -> bool:
        assert self._fd is not None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return False
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        self._exclusive = False
        if fd is not None:
            os.close(fd)  # releases the lock; the file stays for the next holder


_LEASE_SUFFIX = "-drivers.lock"


def _connect(
    path: Path, synchronous: str, *, read_only: bool = False
) -> sqlite3.Connection:
    """Open the file, set the pragmas and bring the schema up to date; or,
    ``read_only``, open an existing journal without writing to it.

    Raises:
        ConfigurationError: the file cannot be opened or created, is not an
            SQLite database, holds another application's tables, or was
            written by a newer replan (field ``path``, naming the file);
            read-only, also when there is no file or no journal in it yet.
    """
    if path.is_dir():  # SQLite says only "unable to open database file"
        raise ConfigurationError("path", f"{path} is a directory, not a journal file")
    if read_only:
        return _open_read_only(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; we BEGIN/COMMIT.
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise ConfigurationError("path", f"cannot open {path}: {exc}") from None

    def set_up() -> None:
        # Nothing changes in a file that is not ours before it is checked.
        _refuse_foreign(conn, path)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        _migrate(conn, path)

    return _prepared(conn, path, set_up)


def _open_read_only(path: Path) -> sqlite3.Connection:
    """Open an existing journal for reading; see :func:`_read_mode`.

    A WAL journal in a directory this process may not write cannot get the
    ``-shm`` file its readers share. When no writer has left a ``-wal`` file
    there (none can be writing: it could not create one either), the file
    is opened as immutable, which needs no ``-shm``.
    """
    if not path.is_file():
        raise ConfigurationError("path", f"no journal at {path}")
    uri = path.resolve().as_uri()
    wal = path.with_name(path.name + "-wal")
    if not path.stat().st_mode & 0o222 and not wal.exists():
        # A file nobody may write (an archived journal, mode 0444), idle: a
        # reader would leave -wal and -shm files it cannot remove.
        return _open_uri(f"{uri}?mode=ro&immutable=1", path)
    try:
        return _open_uri(f"{uri}?mode={_read_mode(path)}", path)
    except ConfigurationError:
        if os.access(path.parent, os.W_OK) or wal.exists():
            raise
    return _open_uri(f"{uri}?mode=ro&immutable=1", path)


def _open_uri(uri: str, path: Path) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(
            uri, uri=True, check_same_thread=False, isolation_level=None
        )
    except sqlite3.Error as exc:
        raise ConfigurationError("path", f"cannot open {path}: {exc}") from None

    def check() -> None:
        conn.execute("PRAGMA query_only = ON")
        _check_journal(conn, path)

    return _prepared(conn, path, check)


def _prepared(
    conn: sqlite3.Connection, path: Path, prepare: Callable[[], None]
) -> sqlite3.Connection:
    """``conn`` once ``prepare`` has run; closed and refused if it fails."""
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        prepare()
    except sqlite3.Error as exc:
        conn.close()
        raise ConfigurationError(
            "path", f"{path} cannot be used as a replan journal: {exc}"
        ) from None
    except BaseException:
        conn.close()
        raise
    return conn


def _read_mode(path: Path) -> str:
    """How a read-only store opens ``path``: ``rw`` when it may, else ``ro``.

    A WAL journal's readers need its ``-wal`` and ``-shm`` files, and create
    them when no writer has the journal open. Only a connection able to write
    removes them again when it is the last to close, so a reader that may
    write opens the file read-write and forbids itself every change with
    ``PRAGMA query_only``: inspecting an idle journal leaves no files behind.
    """
    writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    return "rw" if writable else "ro"


def _refuse_foreign(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a file another application (or a newer replan) wrote.

    A journal gets its tables and its ``user_version`` in one transaction, so
    a file with tables and no version is not a journal of any replan.
    """
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    _refuse_newer(version, path)
    if version == 0 and conn.execute("SELECT 1 FROM sqlite_master").fetchone():
        raise ConfigurationError("path", f"{path} holds another application's tables")


def _check_journal(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a file with no journal in it, or a newer replan's journal."""
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    _refuse_newer(version, path)
    tables = {
        name
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
        )
    }
    if version == 0 or not {"events", "runs"} <= tables:
        raise ConfigurationError("path", f"{path} holds no replan journal")


def _refuse_newer(version: int, path: Path) -> None:
    if version > SCHEMA_VERSION:
        raise ConfigurationError(
            "path",
            f"{path} has journal schema {version}; this replan reads up to "
            f"{SCHEMA_VERSION}",
        )


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Create the tables in a new file; refuse a file from a newer replan."""
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    if version == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Another process may have migrated between the check and the lock.
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        _refuse_newer(version, path)
        if version == 0:
            for statement in _SCHEMA_V1:
                conn.execute(statement)
        if version <= 1:
            for statement in _SCHEMA_V2:
                conn.execute(statement)
        if version <= 2:
            for statement in _SCHEMA_V3:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@dataclass(slots=True)
class _Batch:
    """Appends gathering for one group commit."""

    items: list[_Append]
    done: anyio.Event | None = None
    """Set once the batch is committed (made when the first append joins)."""


@dataclass(slots=True)
class _Append:
    """One ``append`` call on its way to a commit."""

    run_id: str
    events: Sequence[Event]
    rows: list[tuple[object, ...]]
    summary: RunSummary
    error: Exception | None = None
    committed: bool = False


def _insert(conn: sqlite3.Connection | sqlite3.Cursor, item: _Append) -> None:
    """Insert an append's rows: one multi-row INSERT when they are few.

    Raises:
        JournalConflict: another writer's rows hold one of the seqs.
    """
    try:
        if 0 < len(item.rows) <= _ONE_STATEMENT_ROWS:
            conn.execute(_insert_rows(len(item.rows)), _flat(item.rows))
        else:
            conn.executemany(_INSERT_EVENT, item.rows)
    except sqlite3.IntegrityError as exc:
        raise JournalConflict(f"run {item.run_id}: {exc}") from exc


def _flat(rows: list[tuple[object, ...]]) -> list[object]:
    """The parameters of a multi-row INSERT, row after row."""
    values: list[object] = []
    for row in rows:
        values += row
    return values


def _write_summary(
    conn: sqlite3.Connection, run_id: str, summary: RunSummary, *, whole: bool = False
) -> None:
    """Update the run's row in place, or (``whole``, or no row matched)
    write all of it."""
    values = {
        "run_id": run_id,
        "goal": summary.goal,
        "kind": summary.kind,
        "pattern": summary.pattern,
        "status": str(summary.status),
        "created_at": _to_text(summary.created_at),
        "updated_at": _to_text(summary.updated_at),
        "last_seq": summary.last_seq,
        "stop_reason": summary.stop_reason,
    }
    if whole or conn.execute(_UPDATE_RUN, values).rowcount == 0:
        conn.execute(_REPLACE_RUN, values)
