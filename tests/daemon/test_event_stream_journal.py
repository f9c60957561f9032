"""A stream that follows a run in the journal (one this daemon does not
drive): it keeps sending heartbeats while a read waits for the journal,
and ends with a comment saying why when a read fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from replan import Event, GatePolicy, Supervisor
from replan._demo import demo_model, demo_spec
from replan.daemon import DaemonSettings, Token
from replan.daemon._service import Daemon
from replan.daemon._sse import HEARTBEAT, EventStream, event_source
from replan.store import MemoryStore, RunSummary


class FailsOnce:
    """A journal whose first look at a run's summary fails (a database
    that stayed out of reach longer than the store waits), then reads as
    usual."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.failed = False

    async def get_run(self, run_id: str) -> RunSummary | None:
        if not self.failed:
            self.failed = True
            raise OSError("the database is restarting")
        return await self._store.get_run(run_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class WaitingReads:
    """A journal whose reads wait until ``release`` is set (a PostgreSQL
    server restarting, which the store waits for up to its reconnect_s)."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.release = anyio.Event()
        self.reads = 0
        self.cancelled = 0

    async def get_run(self, run_id: str) -> RunSummary | None:
        self.reads += 1
        try:
            await self.release.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        return await self._store.get_run(run_id)

    async def read(self, run_id: str, after: int = 0) -> list[Event]:
        await self.release.wait()
        return await self._store.read(run_id, after)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture
async def finished_run() -> tuple[MemoryStore, str, int]:
    """A journal holding one completed run: the store, its id, its last seq."""
    store = MemoryStore()
    spec = demo_spec().model_copy(
        update={"gate_policy": GatePolicy(gate_on=frozenset())}
    )
    with anyio.fail_after(20):
        async with Supervisor(demo_model(), store) as sup:
            handle = await sup.submit(spec)
            await handle.result()
    return store, handle.run_id, handle.state.seq


def daemon_on(journal: object, tmp_path: Path) -> Daemon:
    daemon = Daemon(
        DaemonSettings(data_dir=tmp_path, heartbeat_s=0.1),
        Token("stream-test-token-0123456789"),
        demo_model(),
    )
    daemon._store = journal  # type: ignore[assignment]
    return daemon


def seqs(frames: list[bytes]) -> list[int]:
    return [int(f.split(b"\n")[0][4:]) for f in frames if f.startswith(b"id: ")]


async def test_a_failing_read_ends_the_stream_with_a_comment_and_a_resume_loses_nothing(
    tmp_path: Path, finished_run: tuple[MemoryStore, str, int]
) -> None:
    store, run_id, last = finished_run
    journal = FailsOnce(store)
    daemon = daemon_on(journal, tmp_path)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tasks:
            first = [f async for f in event_source(daemon, run_id, 0, tasks)]
    assert journal.failed
    assert first == [
        b": the stream ends: the journal cannot be read (OSError: the database "
        b"is restarting); resume with Last-Event-ID\n\n"
    ]
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tasks:
            again = [f async for f in event_source(daemon, run_id, 0, tasks)]
    assert seqs(again) == list(range(1, last + 1))
    assert b"event: run_finished" in again[-1]


async def test_a_stream_sends_heartbeats_while_a_read_waits_for_the_journal(
    tmp_path: Path, finished_run: tuple[MemoryStore, str, int]
) -> None:
    # The read waited up to reconnect_s (30 s) with nothing sent, and a
    # proxy with a 30 s idle timeout cut the stream.
    store, run_id, last = finished_run
    journal = WaitingReads(store)
    daemon = daemon_on(journal, tmp_path)
    frames: list[bytes] = []
    beating = anyio.Event()

    async def follow(tasks: anyio.abc.TaskGroup) -> None:
        async for chunk in event_source(daemon, run_id, 0, tasks):
            frames.append(chunk)
            if frames.count(HEARTBEAT) == 5:
                beating.set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(follow, tasks)
            await beating.wait()
            assert journal.reads == 1  # one read waits; none is started per beat
            journal.release.set()
    assert set(frames[:5]) == {HEARTBEAT}
    assert seqs(frames) == list(range(1, last + 1))
    assert b"event: run_finished" in frames[-1]


async def test_a_read_still_waiting_is_cancelled_when_the_client_goes(
    tmp_path: Path, finished_run: tuple[MemoryStore, str, int]
) -> None:
    store, run_id, _ = finished_run
    journal = WaitingReads(store)
    response = EventStream(daemon_on(journal, tmp_path), run_id, 0)
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)
        if message.get("body") == HEARTBEAT and len(sent) > 3:
            raise OSError("the client went away")  # as uvicorn's send does

    with anyio.fail_after(20), pytest.raises(OSError, match="went away"):
        await response.stream_response(send)
    assert sent[0]["type"] == "http.response.start"
    assert journal.reads == 1
    assert journal.cancelled == 1
