"""A run's event stream shows an event once the run has acted on it."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from scripts import DelegatingStore, scripted, spec

from replan import GateResolution, MemoryStore, RunStatus, Supervisor, TaskDraft
from replan.messages import Event, GateOpened
from replan.store import RunSummary


class SlowToReturn(DelegatingStore):
    """Its ``gate_opened`` append is in the journal a while before it returns
    (a PostgreSQL commit in a worker thread): until a read has seen it."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.committed = anyio.Event()
        self.seen = anyio.Event()

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        await self.inner.append(run_id, events, summary)
        if any(isinstance(e, GateOpened) for e in events):
            self.committed.set()
            await self.seen.wait()

    async def read(self, run_id: str, after: int = 0) -> list[Event]:
        events = await self.inner.read(run_id, after)
        if self.committed.is_set():
            self.seen.set()
        return events


async def test_a_gate_opened_event_read_from_the_journal_can_be_answered_at_once() -> (
    None
):
    store = SlowToReturn()
    tasks = [TaskDraft(key="a", description="send it", requires_approval=True)]
    with anyio.fail_after(10):
        async with Supervisor(scripted(), store) as sup:
            handle = await sup.submit(spec(tasks))
            await store.committed.wait()
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    await sup.gates.resolve(
                        event.request.gate_id,
                        GateResolution(decision="approve", by="ana"),
                    )
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED
