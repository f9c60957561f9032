"""A run's journal as Server-Sent Events, resumable with ``Last-Event-ID``.

Each event is ``id: <seq>``, ``event: <kind>``, ``data: <the event's JSON>``.
A client that reconnects with the last id it saw gets every later event
once: the stream reads the journal after that seq, then follows the run
live, so nothing is skipped or repeated. Comment lines keep idle
connections alive through proxies; the stream ends after the run's last
event, or when the daemon shuts down (a stream opened while it drains
sends the history the journal holds, then ends).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio

from .._errors import UnknownRunError
from ..messages import EVENT_ADAPTER, Event
from ._service import Daemon


def frame(event: Event) -> bytes:
    data = EVENT_ADAPTER.dump_json(event).decode()
    return f"id: {event.seq}\nevent: {event.kind}\ndata: {data}\n\n".encode()


HEARTBEAT = b": keep-alive\n\n"


async def event_source(daemon: Daemon, run_id: str, after: int) -> AsyncIterator[bytes]:
    """The stream's frames (the run is known to exist).

    Raises:
        UnknownRunError: the run disappeared (retention) before streaming.
    """
    sup = daemon._supervisor
    try:
        handle = sup.get(run_id) if sup is not None else None
    except UnknownRunError:
        handle = None
    if handle is None or daemon.draining:
        # Not driven by this process: finished, so the journal is complete.
        # Draining: no stream follows a run any more, but its history can
        # still be read (``replan show`` reads it so) until the daemon stops.
        for past in await daemon.store.read(run_id, after):
            yield frame(past)
        return
    events = handle.events(after)
    heartbeat = daemon.settings.heartbeat_s
    daemon.counters.streams_open += 1
    try:
        while not daemon.draining:
            event: Event | None = None
            # A scope per wait, never across a yield: shutdown cancels it.
            with anyio.CancelScope(deadline=anyio.current_time() + heartbeat) as wait:
                daemon.track_stream(wait)
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    daemon.untrack_stream(wait)
            yield HEARTBEAT if event is None else frame(event)
    finally:
        daemon.counters.streams_open -= 1
