"""A submitted run as the caller holds it: result, events, cancel."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

from .._errors import SupervisorError
from ..messages import Event, RunResult, RunStatus
from ..store import Store
from ._arguments import a_seq
from ._state import RunState

if TYPE_CHECKING:
    from collections.abc import Sequence


class RunRecord:
    """The live state of one run and the signals its readers wait on."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self._changed: anyio.Event | None = None
        self.done = anyio.Event()
        self.detached: str | None = None
        """Why the supervisor let go of the run before it finished."""
        self.cancel: Callable[[], None] | None = None

    @property
    def changed(self) -> anyio.Event:
        """Set at the next change of state (made only when someone waits)."""
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def _signal(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def install(self, state: RunState, events: Sequence[Event]) -> None:
        """Make ``state`` current (its ``events`` are already journaled)."""
        self.state = state
        self._signal()
        if state.status.final:
            self.done.set()

    def detach(self, reason: str) -> None:
        """The supervisor stops without finishing the run: wake every reader."""
        if not self.done.is_set():
            self.detached = reason
            self.done.set()
            self._signal()


class RunHandle:
    """A run submitted to a :class:`Supervisor`.

    ``await handle.result()`` waits for the end; ``handle.events()`` streams
    the journal (history first, then live events); ``await handle.cancel()``
    stops the run, which ends ``cancelled``.
    """

    def __init__(
        self,
        record: RunRecord,
        store: Store,
        request_cancel: Callable[[], Awaitable[RunRecord | None]],
    ) -> None:
        self._record = record
        self._store = store
        self._request_cancel = request_cancel

    @property
    def run_id(self) -> str:
        return self._record.state.run_id

    @property
    def status(self) -> RunStatus:
        return self._record.state.status

    @property
    def state(self) -> RunState:
        """The run's current state (a frozen snapshot)."""
        return self._record.state

    async def result(self) -> RunResult:
        """Wait for the run to end and return its result.

        Raises:
            SupervisorError: the supervisor stopped before the run ended (the
                journal keeps the run; it can be resumed from there).
        """
        await self._record.done.wait()
        if not self._record.state.status.final:
            raise SupervisorError(
                f"run {self.run_id} did not finish: {self._record.detached}"
            )
        return self._record.state.result()

    async def cancel(self) -> None:
        """Cancel the run and wait until its end is journaled.

        Returns at once for a run that has ended already (in any status).

        Raises:
            SupervisorError: the run did not end: the supervisor let go of
                it first (it is stopping, or the run's driver crashed); the
                journal keeps the run, unfinished, to be resumed from there.
        """
        # The run may be driven on since with a record of its own (taken up
        # again after its driver let go of it): its end is that one's.
        record = await self._request_cancel() or self._record
        await record.done.wait()
        if not record.state.status.final:
            raise SupervisorError(
                f"run {self.run_id} was not cancelled: {record.detached}"
            )

    def events(self, after: int = 0) -> AsyncIterator[Event]:
        """The run's journal events with ``seq > after``: past ones, then live.

        The iterator ends after the run's last event.

        Raises:
            ConfigurationError: ``after`` is no whole number from 0 (field
                ``after``), before anything is read.
        """
        return _EventStream(self._record, self._store, a_seq(after, "after"))

    def __repr__(self) -> str:
        return f"<RunHandle {self.run_id} {self.status.value}>"


class _EventStream:
    """Reads the journal, then waits for the record to change: no gaps, no
    duplicates, and no per-subscriber buffer that could grow without bound."""

    def __init__(self, record: RunRecord, store: Store, after: int) -> None:
        self._record = record
        self._store = store
        self._seq = after
        self._buffer: list[Event] = []

    def __aiter__(self) -> _EventStream:
        return self

    async def __anext__(self) -> Event:
        while not self._buffer:
            changed = self._record.changed
            last = self._record.state.seq
            if self._seq < last:
                events = await self._store.read(self._record.state.run_id, self._seq)
                if not events:
                    # The journal no longer holds them: the run was deleted
                    # (retention) while this reader lagged behind.
                    raise StopAsyncIteration
                # Only what the run has acted on: an append may be in the
                # journal a moment before its state is installed (the gate
                # its gate_opened lists is answerable from then on).
                self._buffer = [e for e in events if e.seq <= last] or events
                continue
            if self._record.done.is_set():
                raise StopAsyncIteration
            await changed.wait()
        event = self._buffer.pop(0)
        self._seq = event.seq
        return event
