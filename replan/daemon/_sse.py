"""A run's journal as Server-Sent Events, resumable with ``Last-Event-ID``.

Each event is ``id: <seq>``, ``event: <kind>``, ``data: <the event's JSON>``.
A client that reconnects with the last id it saw gets every later event
once: the stream reads the journal after that seq, then follows the run,
so nothing is skipped or repeated. A run this daemon drives is followed
live; one another daemon drives (a shared PostgreSQL journal), or nobody
drives for now, is followed in the journal, which the stream reads again
every :data:`POLL_S` seconds, less often while nothing happens (at most
every :data:`MAX_POLL_S`). The stream switches between the two when the
run changes hands (this daemon takes it over, or lets go of it). Comment
lines keep idle connections alive through proxies, and a stream
following the journal waits with them while the journal cannot be read
(a database restarting). The stream ends after the run's last event,
once retention has deleted the run, or when the daemon shuts down (a
stream opened while it drains sends the history the journal holds, then
ends).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import anyio

from .._errors import JournalCorrupt, UnknownRunError
from ..messages import EVENT_ADAPTER, Event
from ..supervisor import RunHandle
from ._service import Daemon


def frame(event: Event) -> bytes:
    data = EVENT_ADAPTER.dump_json(event).decode()
    return f"id: {event.seq}\nevent: {event.kind}\ndata: {data}\n\n".encode()


logger = logging.getLogger("replan.daemon")

HEARTBEAT = b": keep-alive\n\n"
POLL_S = 0.25
"""How soon a stream following the journal reads it again after news..."""
MAX_POLL_S = 2.0
"""...and how long it waits at most, doubling its wait while nothing comes."""


async def event_source(daemon: Daemon, run_id: str, after: int) -> AsyncIterator[bytes]:
    """The stream's frames (the run is known to exist)."""
    if daemon.draining:
        # No stream follows a run any more, but its history can still be
        # read (``replan show`` reads it so) until the daemon stops.
        for past in await daemon.store.read(run_id, after):
            yield frame(past)
        return
    stream = _Stream(daemon, run_id, after)
    daemon.counters.streams_open += 1
    try:
        async for chunk in stream.frames():
            yield chunk
    finally:
        daemon.counters.streams_open -= 1


class _Stream:
    """One client's stream: where it is in the run's journal, and when it
    last sent something."""

    def __init__(self, daemon: Daemon, run_id: str, after: int) -> None:
        self.daemon = daemon
        self.run_id = run_id
        self.seq = after
        self.heartbeat = daemon.settings.heartbeat_s
        self.sent_at = anyio.current_time()

    async def frames(self) -> AsyncIterator[bytes]:
        daemon = self.daemon
        delay = POLL_S
        while not daemon.draining:
            handle = self._driven_here()
            if handle is not None:
                async for chunk in self._live(handle):
                    yield chunk
                if handle.status.final or daemon.draining:
                    return
                # Let go of unfinished (another daemon took it over, its
                # journal failed): followed in the journal from here.
            try:
                summary = await daemon.store.get_run(self.run_id)
                # Read after the summary: a final summary's events are all here.
                events = await daemon.store.read(self.run_id, self.seq)
            except JournalCorrupt:
                raise
            except Exception:
                # The journal fails for now (a database restarting): the
                # stream waits for it, with heartbeats, as for a quiet run.
                logger.debug(
                    "run %s: the journal cannot be read", self.run_id, exc_info=True
                )
                ended, events = False, []
            else:
                # Ended, or deleted by retention.
                ended = summary is None or summary.status.final
            for event in events:
                self.seq = event.seq
                self.sent_at = anyio.current_time()
                yield frame(event)
            if ended:
                return
            if events:
                delay = POLL_S
                continue
            if await self._pause(delay):
                yield HEARTBEAT
            delay = min(2 * delay, MAX_POLL_S)

    def _driven_here(self) -> RunHandle | None:
        """The run's handle while this daemon drives it."""
        supervisor = self.daemon._supervisor
        if supervisor is None or not supervisor.drives(self.run_id):
            return None
        try:
            return supervisor.get(self.run_id)
        except UnknownRunError:
            return None  # being taken up: its handle comes at the next look

    async def _live(self, handle: RunHandle) -> AsyncIterator[bytes]:
        """The run's events as this daemon journals them, until it ends or
        this daemon lets go of it."""
        daemon = self.daemon
        events = handle.events(self.seq)
        while not daemon.draining:
            event: Event | None = None
            # A scope per wait, never across a yield: shutdown cancels it.
            deadline = self.sent_at + self.heartbeat
            with anyio.CancelScope(deadline=deadline) as wait:
                daemon.track_stream(wait)
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    daemon.untrack_stream(wait)
            self.sent_at = anyio.current_time()
            if event is None:
                yield HEARTBEAT
            else:
                self.seq = event.seq
                yield frame(event)

    async def _pause(self, delay: float) -> bool:
        """Wait ``delay`` seconds, or less when a heartbeat falls due first;
        whether one is due now. Shutdown cuts the wait short."""
        due = self.sent_at + self.heartbeat
        with anyio.CancelScope() as wait:
            self.daemon.track_stream(wait)
            try:
                await anyio.sleep(max(0.0, min(delay, due - anyio.current_time())))
            finally:
                self.daemon.untrack_stream(wait)
        if anyio.current_time() < due:
            return False
        self.sent_at = anyio.current_time()
        return True
