"""At most ``max_concurrency`` tasks of a run in flight; no head-of-line blocking."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
from scripts import (
    clean,
    emails_first,
    independent,
    scripted,
    send_email,
    spec,
    task_of,
)

from replan import (
    MemoryStore,
    ModelRequest,
    RunStatus,
    ScriptedModel,
    Supervisor,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
)
from replan.messages import TaskFinished


@dataclass
class InFlight:
    current: int = 0
    peak: int = 0

    async def execute(self, request: ModelRequest) -> TaskOutcome:
        """An execution that takes 50 ms, counted while it runs."""
        self.current += 1
        self.peak = max(self.peak, self.current)
        try:
            await anyio.sleep(0.05)
        finally:
            self.current -= 1
        return clean(request)


async def test_never_more_than_max_concurrency_tasks_of_a_run_run_at_once() -> None:
    flight = InFlight()
    model = scripted(execute=flight.execute)

    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(spec(independent(12), max_concurrency=3))
            result = await handle.result()

    assert result.status is RunStatus.COMPLETED
    assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 12
    assert len(model.calls_for("executor", "execute")) == 12
    # The executor pool has far more workers than 3: the run's limit holds.
    assert flight.peak == 3


async def test_the_executor_pool_bounds_the_tasks_of_all_runs_at_once() -> None:
    flight = InFlight()
    model = scripted(execute=flight.execute)

    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore(), workers={"executor": 2}) as sup:
            handles = [
                await sup.submit(spec(independent(4), max_concurrency=4))
                for _ in range(3)
            ]
            results = [await handle.result() for handle in handles]

    for result in results:
        assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 4
    # Each run would take four at once; the pool's two workers serve them all.
    assert flight.peak == 2


async def test_one_slow_task_does_not_hold_back_independent_ready_tasks() -> None:
    release = anyio.Event()
    others = {f"t{i}" for i in range(2, 8)}

    async def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).key == "slow":
            await release.wait()
        return clean(request)

    model = scripted(execute=execute)
    drafts = [
        TaskDraft(key="slow", description="a long crawl"),
        *(TaskDraft(key=f"s{i}", description=f"step {i}") for i in range(2, 8)),
    ]
    slow_state_when_others_done: TaskStatus | None = None

    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(spec(drafts, max_concurrency=2))
            finished: set[str] = set()
            async for event in handle.events():
                if isinstance(event, TaskFinished):
                    finished.add(event.task_id)
                    if finished == others:
                        slow_state_when_others_done = handle.state.tasks["t1"].status
                        release.set()
            result = await handle.result()

    # Six tasks ran one after another through the second slot while the slow
    # one held the first.
    assert slow_state_when_others_done is TaskStatus.IN_PROGRESS
    assert result.status is RunStatus.COMPLETED
    assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 7
    assert result.tasks[0].attempts == 1


async def test_a_slot_held_by_a_slow_task_stays_taken_while_others_run() -> None:
    # The fast tasks finish one by one while the slow one runs: every time
    # the run starts another, the slow one still counts against the limit.
    flight = InFlight()
    release = anyio.Event()

    async def execute(request: ModelRequest) -> TaskOutcome:
        flight.current += 1
        flight.peak = max(flight.peak, flight.current)
        try:
            if task_of(request).key == "slow":
                await release.wait()
            else:
                await anyio.sleep(0.01)
        finally:
            flight.current -= 1
        return clean(request)

    model = scripted(execute=execute)
    drafts = [
        TaskDraft(key="slow", description="a long crawl"),
        *(TaskDraft(key=f"s{i}", description=f"step {i}") for i in range(2, 8)),
    ]

    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(spec(drafts, max_concurrency=2))
            finished = 0
            async for event in handle.events():
                if isinstance(event, TaskFinished):
                    finished += 1
                    if finished == 6:
                        release.set()
            result = await handle.result()

    assert result.status is RunStatus.COMPLETED
    assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 7
    assert flight.peak == 2


async def test_a_run_cancelled_while_an_execution_waits_for_mailbox_room_ends() -> None:
    # One executor worker holds the first task, the second waits in the
    # one-slot mailbox, the third is sent while the mailbox is full.
    holding = anyio.Event()
    cancelled: list[str] = []

    async def execute(request: ModelRequest) -> TaskOutcome:
        holding.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.append(task_of(request).id)
        raise AssertionError("unreachable")

    with anyio.fail_after(10):
        async with Supervisor(
            scripted(execute=execute),
            MemoryStore(),
            workers={"executor": 1},
            mailbox_size=1,
        ) as sup:
            handle = await sup.submit(spec(independent(3), max_concurrency=3))
            await holding.wait()
            await anyio.wait_all_tasks_blocked()
            executor = next(s for s in sup.pool_statistics() if s.role == "executor")
            assert (executor.busy, executor.mailbox_depth) == (1, 1)
            assert executor.senders_waiting == 1
            await handle.cancel()
            result = await handle.result()
            await anyio.wait_all_tasks_blocked()
            executor = next(s for s in sup.pool_statistics() if s.role == "executor")
            assert executor.senders_waiting == 0
            assert executor.busy == 0
    assert result.status is RunStatus.CANCELLED
    assert cancelled == ["t1"]  # the running one stopped; the others never ran


async def gates_open(sup: Supervisor, count: int) -> None:
    while True:
        if len(sup.gates.pending()) >= count:
            return
        await anyio.sleep(0.005)


async def test_tool_calls_waiting_for_a_person_hold_no_executor_worker() -> None:
    # Two runs' attempts wait for approvals of their emails on the only
    # executor worker there is; the other runs' tasks must not wait for
    # those people too.
    mailing = spec(independent(1)).model_copy(update={"goal": "email the team"})
    others_model = scripted()

    async def answer(request: ModelRequest) -> Any:
        if request.context["goal"] == mailing.goal:
            return emails_first(request)
        return await others_model.generate(request)

    workers = {"executor": 1}
    model = ScriptedModel(answer)
    async with Supervisor(model, tools=[send_email], workers=workers) as sup:
        with anyio.fail_after(10):
            waiting = [await sup.submit(mailing) for _ in range(2)]
            await gates_open(sup, 2)
            others = [await sup.submit(spec(independent(3))) for _ in range(2)]
            for handle in others:
                result = await handle.result()
                assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 3
            for gate in sup.gates.pending():
                await sup.gates.resolve(gate.gate_id, {"decision": "approve"})
            for handle in waiting:
                assert (await handle.result()).status is RunStatus.COMPLETED
            executor = next(p for p in sup.pool_statistics() if p.role == "executor")
    # Back to its size once the people answered.
    assert executor.live <= 1
    assert executor.busy == 0
