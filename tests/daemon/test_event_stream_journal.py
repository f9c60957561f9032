"""A stream that follows a run in the journal (one this daemon does not
drive) waits out a journal that fails for a moment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from replan import GatePolicy, Supervisor
from replan._demo import demo_model, demo_spec
from replan.daemon import DaemonSettings, Token
from replan.daemon._service import Daemon
from replan.daemon._sse import event_source
from replan.store import MemoryStore, RunSummary


class FailsOnce:
    """A journal whose first look at a run's summary fails (a database
    restarting), then reads as usual."""

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


async def test_a_stream_following_the_journal_waits_out_a_failing_read(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    spec = demo_spec().model_copy(
        update={"gate_policy": GatePolicy(gate_on=frozenset())}
    )
    with anyio.fail_after(20):
        async with Supervisor(demo_model(), store) as sup:
            handle = await sup.submit(spec)
            await handle.result()
        journal = FailsOnce(store)
        daemon = Daemon(
            DaemonSettings(data_dir=tmp_path, heartbeat_s=0.1),
            Token("stream-test-token-0123456789"),
            demo_model(),
        )
        daemon._store = journal  # type: ignore[assignment]
        frames = [f async for f in event_source(daemon, handle.run_id, 0)]
    events = [f for f in frames if f.startswith(b"id: ")]
    assert journal.failed
    assert len(events) == handle.state.seq
    assert b"event: run_finished" in events[-1]
