"""The daemon's long-lived parts: journal, supervisor, retention, shutdown."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from .._errors import (
    ConfigurationError,
    ReplanError,
    SupervisorError,
    UnknownRunError,
)
from ..llm import Model, Tool
from ..messages import GateRequest, RunCompacted, RunStatus
from ..store import RunLeases, SQLiteStore, ToolEffectRecord
from ..supervisor import RunState, Supervisor, fold_journal
from ._gate_pages import oldest_first
from ._redrive import redrive_loop
from ._retention import retention_loop
from ._settings import DaemonSettings
from ._token import Token

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from ..store import PostgresStore

    Journal = SQLiteStore | PostgresStore

logger = logging.getLogger("replan.daemon")


def open_journal(settings: DaemonSettings) -> Journal:
    """The journal the settings name: ``journal_dsn``'s PostgreSQL database,
    or else the SQLite file in ``data_dir``.

    Raises:
        ConfigurationError: the journal cannot be opened (``journal_dsn``,
            or the store's own field).
    """
    if settings.journal_dsn is None:
        return SQLiteStore(settings.journal_path)
    try:
        from ..store import PostgresStore
    except ModuleNotFoundError as exc:
        raise ConfigurationError("journal_dsn", str(exc)) from None
    try:
        return PostgresStore(
            settings.journal_dsn.get_secret_value(),
            lease_s=settings.journal_lease_s,
        )
    except ConfigurationError as exc:
        if exc.field != "dsn":
            raise
        raise ConfigurationError("journal_dsn", exc.problem) from None


FOLDED_KEPT = 1024
"""Runs driven elsewhere whose folded state the gate listing keeps (those
waiting for a person; past this many it reads the least recent again)."""


@dataclass
class Counters:
    """Counts the daemon keeps for ``/metrics`` (the supervisor keeps the rest)."""

    submitted: int = 0
    refused: int = 0
    compacted: int = 0
    deleted: int = 0
    streams_open: int = 0


@dataclass
class Daemon:
    """Everything the HTTP API serves, started and stopped by :meth:`running`."""

    settings: DaemonSettings
    token: Token
    model: Model
    tools: list[Tool] = field(default_factory=list)
    """The executor's tools (the ``tools`` setting)."""
    tracer_provider: TracerProvider | None = None
    """Where the runs' spans and the HTTP API's spans go; the global provider
    when None (what ``replan serve`` uses, see ``setup()``)."""
    counters: Counters = field(default_factory=Counters)
    submitting: int = 0
    """Submissions accepted and not yet journaled (they count as active)."""
    unreadable: set[str] = field(default_factory=set)
    """Finished runs retention found it cannot read back (left as they are)."""
    _supervisor: Supervisor | None = None
    _store: Journal | None = None
    _draining: bool = False
    _drained: bool = False
    _hurried: bool = False
    _streams: set[anyio.CancelScope] = field(default_factory=set)
    _drains: set[anyio.CancelScope] = field(default_factory=set)
    _folded: OrderedDict[str, RunState] = field(default_factory=OrderedDict)
    """Runs other daemons drive, as last folded from the journal for the
    gate listing (least recently listed first, at most ``FOLDED_KEPT``)."""

    @property
    def supervisor(self) -> Supervisor:
        if self._supervisor is None or self._draining:
            raise SupervisorError("the daemon is not serving")
        return self._supervisor

    @property
    def store(self) -> Journal:
        if self._store is None:
            raise SupervisorError("the daemon is not serving")
        return self._store

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def ready(self) -> bool:
        return self._supervisor is not None and not self._draining

    @property
    def journal_outage(self) -> str | None:
        """Why the journal's server cannot be reached (a PostgreSQL restart,
        say), while the store's calls wait for it; None while it works."""
        outage = getattr(self._store, "outage", None)
        return outage if isinstance(outage, str) else None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Open the journal, resume unfinished runs, serve (applying retention
        and driving on the runs a journal failure let go of, see
        ``_redrive``); drain on the way out.

        Each long-lived part is one entry of the exit stack, undone in reverse
        order (telemetry wraps the whole server: see ``serve``).
        """
        settings = self.settings
        async with AsyncExitStack() as stack:
            aclose = getattr(self.model, "aclose", None)
            if aclose is not None:
                stack.push_async_callback(aclose)
            store = open_journal(settings)
            await stack.enter_async_context(store)
            supervisor = Supervisor(
                self.model,
                store,
                workers=settings.workers,
                tools=self.tools,
                resume=True,
                tracer_provider=self.tracer_provider,
            )
            await stack.enter_async_context(supervisor)
            tasks = await stack.enter_async_context(anyio.create_task_group())
            self._store, self._supervisor = store, supervisor
            tasks.start_soon(retention_loop, self)
            tasks.start_soon(redrive_loop, self)
            logger.info(
                "serving; %d unfinished run(s) resumed", len(supervisor.handles())
            )
            try:
                yield
            finally:
                # Quick when serve() has drained already, as it does on SIGTERM.
                with anyio.CancelScope(shield=True):
                    await self.drain()
                tasks.cancel_scope.cancel()
                logger.info("drained; the journal holds every unfinished run")

    def begin_shutdown(self) -> None:
        """Refuse new runs and end the event streams (SIGTERM's first step)."""
        self._draining = True
        for scope in list(self._streams):
            scope.cancel()

    async def drain(self) -> None:
        """Shut down: refuse new runs, let work in flight finish, stop the runs.

        Model calls and tasks in flight get ``drain_grace_s`` seconds to
        finish and reach the journal (not those waiting for a person at a
        tool call's gate: see ``Supervisor.drain``); then the supervisor
        stops and the unfinished runs wait in the journal for the next start.
        Only the first call waits (and none after :meth:`hurry`); later ones
        return at once.
        """
        self.begin_shutdown()
        supervisor = self._supervisor
        if supervisor is None:
            return
        if not (self._drained or self._hurried):
            with anyio.CancelScope() as scope:
                self._drains.add(scope)
                try:
                    await supervisor.drain(self.settings.drain_grace_s)
                finally:
                    self._drains.discard(scope)
            self._drained = True
        supervisor.stop()

    def hurry(self) -> None:
        """Cut a drain short (a second signal): stop without waiting.

        What was in flight is abandoned; its runs resume from the journal
        on the next start, as after a crash.
        """
        self._hurried = True
        self.begin_shutdown()
        for scope in list(self._drains):
            scope.cancel()
        # What the stop journals, shielded (finished attempts kept in the
        # effect ledger, leases let go of), waits for a PostgreSQL server
        # out of reach for up to its reconnect_s: not after a second signal.
        stop_waiting = getattr(self._store, "stop_waiting", None)
        if stop_waiting is not None:
            stop_waiting()

    def track_stream(self, scope: anyio.CancelScope) -> None:
        if self._draining:
            scope.cancel()
        self._streams.add(scope)

    def untrack_stream(self, scope: anyio.CancelScope) -> None:
        self._streams.discard(scope)

    async def run_state(self, run_id: str) -> RunState:
        """The run's state: live if this process drives it, else its journal.

        Raises:
            UnknownRunError: no such run.
        """
        supervisor = self._supervisor
        if supervisor is not None:
            try:
                state = supervisor.get(run_id).state
            except UnknownRunError:
                pass
            else:
                # A run let go of (another daemon took it over, its journal
                # failed) goes on in the journal, if anywhere.
                if supervisor.drives(run_id) or state.status.final:
                    return state
        events = await self.store.read(run_id)
        if not events:
            raise UnknownRunError(run_id)
        return fold_journal(run_id, events)

    async def driven_elsewhere(self, run_id: str) -> str | None:
        """Who drives the run, when another daemon holds its lease (a
        PostgreSQL journal, see ``RunLeases``): its ``host:pid``."""
        store, supervisor = self.store, self._supervisor
        if not isinstance(store, RunLeases) or (
            supervisor is not None and supervisor.drives(run_id)
        ):
            return None
        lease = await store.run_lease(run_id)
        if lease is None or (
            supervisor is not None and lease.owner == supervisor.owner.id
        ):
            return None
        return lease.holder

    async def open_gates(
        self, run_id: str | None = None
    ) -> tuple[list[GateRequest], dict[str, str]]:
        """The gates waiting for a person, oldest first (of one run, if
        ``run_id`` is given), and the daemons (``host:pid``) that drive the
        runs of those open in another, by gate id.

        On a journal that leases runs one by one (PostgreSQL), these are
        every open gate of the journal: this daemon's own, those of runs
        another daemon drives (answered there), and those of runs nobody
        drives for now (answerable once a daemon takes the run over).
        """
        supervisor, store = self.supervisor, self.store
        gates = supervisor.gates.pending(run_id)
        elsewhere: dict[str, str] = {}
        if not isinstance(store, RunLeases):
            # Listed as they were opened here, or listed again at a resume.
            return oldest_first(gates), elsewhere
        listed = {g.gate_id for g in gates}
        if run_id is None:
            waiting = await self._waiting_runs()
        else:
            summary = await store.get_run(run_id)
            waiting = [] if summary is None else [(run_id, summary.last_seq)]
        for other, last_seq in waiting:
            if supervisor.drives(other):
                continue
            try:
                state = await self._journal_state(other, last_seq)
            except (ReplanError, ValueError):
                continue  # no such run, or one that cannot be read back
            found = [
                g.request
                for g in state.open_gates
                if g.request.gate_id not in listed and not state.status.final
            ]
            if not found:
                continue
            gates += found
            holder = await self.driven_elsewhere(other)
            if holder is not None:
                elsewhere.update((g.gate_id, holder) for g in found)
        if run_id is None:
            # Runs no longer waiting (answered, ended) are not kept.
            still = {other for other, _ in waiting}
            for gone in [r for r in self._folded if r not in still]:
                del self._folded[gone]
        return oldest_first(gates), elsewhere

    async def _waiting_runs(self) -> list[tuple[str, int]]:
        """The journal's runs waiting for a person, newest first, each with
        the seq of its last event."""
        runs: list[tuple[str, int]] = []
        page = 500
        while True:
            rows = await self.store.list_runs(
                statuses=[RunStatus.WAITING_FOR_HUMAN], limit=page, offset=len(runs)
            )
            runs += [(r.run_id, r.last_seq) for r in rows]
            if len(rows) < page:
                return runs

    async def _journal_state(self, run_id: str, last_seq: int) -> RunState:
        """The run's state from the journal, up to ``last_seq`` at least.

        The state folded last time is kept: a run whose journal has not grown
        since is not read again, and one that has is read from where it was
        folded to. A run waits at its gate for minutes or days while the
        listing is asked for again and again.

        Raises:
            JournalCorrupt: the run has no events, or they do not fold.
        """
        folded = self._folded
        state = folded.pop(run_id, None)
        if state is not None and state.seq > last_seq:
            state = None  # rewritten since (compacted): read it whole
        if state is None or state.seq < last_seq:
            after = 0 if state is None else state.seq
            events = await self.store.read(run_id, after=after)
            if events and isinstance(events[0], RunCompacted):
                state = None  # a snapshot folds from nothing
            state = fold_journal(run_id, events, start=state)
        folded[run_id] = state
        while len(folded) > FOLDED_KEPT:
            folded.popitem(last=False)
        return state

    async def side_effects(self, state: RunState) -> list[ToolEffectRecord]:
        """The side-effect tool calls the run made, in the order they ran."""
        return await self.store.read_tool_effects(state.run_id)
