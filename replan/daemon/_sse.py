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
lines keep idle connections alive through proxies, also while a read of
the journal waits (a PostgreSQL server restarting, which the store waits
for up to its ``reconnect_s``): the reads run in a task of the
response's own, beside the heartbeats (a stream asked for while the
journal is known to be out of reach is refused with a 503 instead, as
the other reads are). The stream ends after the run's
last event, once retention has deleted the run, when the daemon shuts
down (a stream opened while it drains sends the history the journal
holds, then ends), or with a last comment saying why when the journal
cannot be read (the client resumes with ``Last-Event-ID``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Generic, TypeVar

import anyio
from anyio.abc import TaskGroup
from starlette.responses import StreamingResponse
from starlette.types import Send

from .._errors import JournalCorrupt, UnknownRunError
from ..messages import EVENT_ADAPTER, Event
from ..store import RunSummary
from ..supervisor import RunHandle
from ._service import Daemon

_T = TypeVar("_T")


def frame(event: Event) -> bytes:
    data = EVENT_ADAPTER.dump_json(event).decode()
    return f"id: {event.seq}\nevent: {event.kind}\ndata: {data}\n\n".encode()


logger = logging.getLogger("replan.daemon")

HEARTBEAT = b": keep-alive\n\n"
POLL_S = 0.25
"""How soon a stream following the journal reads it again after news..."""
MAX_POLL_S = 2.0
"""...and how long it waits at most, doubling its wait while nothing comes."""


def unreadable(error: Exception | None) -> bytes:
    """The last comment of a stream whose journal cannot be read."""
    why = " ".join(f"{type(error).__name__}: {error}".split())[:300]
    return (
        f": the stream ends: the journal cannot be read ({why}); "
        "resume with Last-Event-ID\n\n"
    ).encode()


class EventStream(StreamingResponse):
    """``GET /v1/runs/{id}/events``: :func:`event_source`'s frames, with a
    task group of the response's own for the journal reads, which go on
    while the stream sends heartbeats (the frames' generator cannot hold a
    task group across its yields)."""

    def __init__(self, daemon: Daemon, run_id: str, after: int) -> None:
        super().__init__(
            _no_frames(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._source = (daemon, run_id, after)

    async def stream_response(self, send: Send) -> None:
        error: Exception | None = None
        async with anyio.create_task_group() as tasks:
            frames = event_source(*self._source, tasks)
            self.body_iterator = frames
            try:
                await super().stream_response(send)
            except Exception as exc:  # raised as it was, not in a group
                error = exc
            finally:
                tasks.cancel_scope.cancel()  # a read still waiting
                await frames.aclose()
        if error is not None:
            raise error


async def _no_frames() -> AsyncIterator[bytes]:
    return
    yield  # pragma: no cover - makes this an async generator


async def event_source(
    daemon: Daemon, run_id: str, after: int, tasks: TaskGroup
) -> AsyncGenerator[bytes, None]:
    """The stream's frames (the run is known to exist); the journal reads
    run in ``tasks``, which must outlive the iteration."""
    if daemon.draining:
        # No stream follows a run any more, but its history can still be
        # read (``replan show`` reads it so) until the daemon stops.
        try:
            history = await daemon.store.read(run_id, after)
        except JournalCorrupt:
            raise
        except Exception as exc:
            yield unreadable(exc)
            return
        for past in history:
            yield frame(past)
        return
    stream = _Stream(daemon, run_id, after, tasks)
    daemon.counters.streams_open += 1
    try:
        # Closed with the stream, not left to the collector, when the
        # client goes between two frames.
        async with aclosing(stream.frames()) as frames:
            async for chunk in frames:
                yield chunk
    finally:
        daemon.counters.streams_open -= 1


class _Stream:
    """One client's stream: where it is in the run's journal, and when it
    last sent something."""

    def __init__(
        self, daemon: Daemon, run_id: str, after: int, tasks: TaskGroup
    ) -> None:
        self.daemon = daemon
        self.run_id = run_id
        self.seq = after
        self.tasks = tasks
        self.heartbeat = daemon.settings.heartbeat_s
        self.sent_at = anyio.current_time()

    async def frames(self) -> AsyncGenerator[bytes, None]:
        daemon = self.daemon
        delay = POLL_S
        while not daemon.draining:
            handle = self._driven_here()
            if handle is not None:
                async with aclosing(self._live(handle)) as live:
                    async for chunk in live:
                        yield chunk
                if handle.status.final or daemon.draining:
                    return
                # Let go of unfinished (another daemon took it over, its
                # journal failed): followed in the journal from here.
            reading = _Beside(self._read)
            self.tasks.start_soon(reading.run)
            while not await self._until_heartbeat(reading.done):
                if daemon.draining:
                    return
                yield HEARTBEAT
            if isinstance(reading.error, JournalCorrupt):
                raise reading.error
            if reading.result is None:
                # The store waited for the journal as long as it waits
                # (PostgreSQL's reconnect_s) and gave up: say so and end;
                # the client resumes where it was, and so learns whether
                # the journal is back (a 503 until it is).
                logger.info(
                    "run %s: an event stream ends, the journal cannot be read: %s",
                    self.run_id,
                    reading.error,
                )
                yield unreadable(reading.error)
                return
            summary, events = reading.result
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

    async def _read(self) -> tuple[RunSummary | None, list[Event]]:
        summary = await self.daemon.store.get_run(self.run_id)
        # Read after the summary: a final summary's events are all here.
        return summary, await self.daemon.store.read(self.run_id, self.seq)

    async def _until_heartbeat(self, done: anyio.Event) -> bool:
        """Wait for ``done`` until a heartbeat falls due (then False).
        Shutdown cuts the wait short."""
        due = self.sent_at + self.heartbeat
        with anyio.CancelScope(deadline=due) as wait:
            self.daemon.track_stream(wait)
            try:
                await done.wait()
            finally:
                self.daemon.untrack_stream(wait)
        if done.is_set():
            return True
        self.sent_at = anyio.current_time()
        return False

    def _driven_here(self) -> RunHandle | None:
        """The run's handle while this daemon drives it."""
        supervisor = self.daemon._supervisor
        if supervisor is None or not supervisor.drives(self.run_id):
            return None
        try:
            return supervisor.get(self.run_id)
        except UnknownRunError:
            return None  # being taken up: its handle comes at the next look

    async def _live(self, handle: RunHandle) -> AsyncGenerator[bytes, None]:
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


class _Beside(Generic[_T]):
    """An awaitable run in a task of its own: once ``done``, its ``result``,
    or None and its ``error``."""

    def __init__(self, work: Callable[[], Awaitable[_T]]) -> None:
        self._work = work
        self.done = anyio.Event()
        self.result: _T | None = None
        self.error: Exception | None = None

    async def run(self) -> None:
        try:
            self.result = await self._work()
        except Exception as exc:
            self.error = exc
        finally:
            self.done.set()
