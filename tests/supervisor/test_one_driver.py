"""A run is driven by one driver at most, however submit() and resume() meet."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest
from scripts import DelegatingStore, chain, executed_ids, scripted, spec

from replan import MemoryStore, RunStatus, Supervisor, SupervisorError, TaskStatus
from replan.messages import Event, RunSubmitted, TaskFinished
from replan.store import RunSummary, Store


class HeldSubmission(DelegatingStore):
    """Journals a run's ``run_submitted``, then holds the append's return
    until ``go`` is set: the run is in the journal, its submit() not done."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.journaled = anyio.Event()
        self.go = anyio.Event()

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        await self.inner.append(run_id, events, summary)
        if isinstance(events[0], RunSubmitted) and not self.go.is_set():
            self.journaled.set()
            await self.go.wait()


@pytest.mark.parametrize("how", ["resume", "resume_all"])
async def test_a_run_resumed_while_its_submission_is_journaled_is_driven_once(
    how: str,
) -> None:
    store = HeldSubmission(MemoryStore())
    model = scripted()
    with anyio.fail_after(10):
        async with Supervisor(model, store) as sup:
            async with anyio.create_task_group() as tg:
                submitted = []

                async def submit() -> None:
                    submitted.append(await sup.submit(spec(chain(3))))

                tg.start_soon(submit)
                await store.journaled.wait()
                [row] = await store.list_runs()
                resumed = []

                async def resume() -> None:
                    if how == "resume":
                        resumed.append(await sup.resume(row.run_id))
                    else:
                        resumed.extend(await sup.resume_all())

                tg.start_soon(resume)
                await anyio.wait_all_tasks_blocked()
                store.go.set()
            [handle] = submitted
            assert [h.run_id for h in resumed] == [handle.run_id]
            result = await handle.result()
            assert (await resumed[0].result()) == result
    assert result.status is RunStatus.COMPLETED
    assert executed_ids(model) == ["t1", "t2", "t3"]


class HeldRead(DelegatingStore):
    """A journal whose disk fails once, at the second task's end, and whose
    first read after that waits until ``go`` is set."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.failed = False
        self.reading = anyio.Event()
        self.go = anyio.Event()

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        ends = [e for e in events if isinstance(e, TaskFinished)]
        if not self.failed and any(e.task_id == "t2" for e in ends):
            self.failed = True
            raise OSError(28, "No space left on device")
        await self.inner.append(run_id, events, summary)

    async def read(self, run_id: str, after: int = 0) -> list[Event]:
        events = await self.inner.read(run_id, after)
        if self.failed and not self.go.is_set():
            self.reading.set()
            await self.go.wait()
        return events


async def test_two_resumes_of_a_run_let_go_of_start_one_driver() -> None:
    store = HeldRead(MemoryStore())
    model = scripted()
    with anyio.fail_after(10):
        async with Supervisor(model, store) as sup:
            handle = await sup.submit(spec(chain(3), milestone_every=100))
            with pytest.raises(SupervisorError, match="driver crashed"):
                await handle.result()
            handles = []

            async def resume() -> None:
                handles.append(await sup.resume(handle.run_id))

            async with anyio.create_task_group() as tg:
                tg.start_soon(resume)
                await store.reading.wait()
                tg.start_soon(resume)
                tg.start_soon(sup.resume_all)
                await anyio.wait_all_tasks_blocked()
                store.go.set()
            first, second = handles
            result = await first.result()
            assert await second.result() == result
    assert result.status is RunStatus.COMPLETED
    assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 3
    # t2's attempt ran again once (its end was never journaled), and no more.
    assert executed_ids(model) == ["t1", "t2", "t2", "t3"]
