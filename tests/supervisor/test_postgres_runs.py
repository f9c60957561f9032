"""Runs journaled in PostgreSQL: a replan, replay, and a resume after a stop."""

from __future__ import annotations

import anyio
from scripts import (
    chain,
    executed_ids,
    first_then_continue,
    replan_verdict,
    scripted,
    spec,
    task_of,
    with_finding,
)

from replan import (
    ModelRequest,
    ReplanOutcome,
    RunStatus,
    Supervisor,
    TaskStatus,
)
from replan.messages import ReplanApplied, TaskInterrupted
from replan.store import PostgresStore
from replan.supervisor import replay


async def test_a_run_with_a_replan_replays_from_postgres_to_the_same_result(
    postgres_dsn: str,
) -> None:
    model = scripted(
        execute=with_finding, milestone=first_then_continue(replan_verdict())
    )
    with anyio.fail_after(20):
        async with (
            PostgresStore(postgres_dsn) as store,
            Supervisor(model, store) as sup,
        ):
            handle = await sup.submit(spec(chain(4), milestone_every=2))
            result = await handle.result()
            assert await sup.replay(handle.run_id) == result
        # Another store object, as another process would open it.
        async with PostgresStore(postgres_dsn) as store:
            events = await store.read(handle.run_id)
            summary = await store.get_run(handle.run_id)

    assert result.status is RunStatus.COMPLETED
    assert [r.outcome for r in result.replans] == [ReplanOutcome.APPLIED]
    assert sum(isinstance(e, ReplanApplied) for e in events) == 1
    assert replay(events).result() == result
    assert summary is not None
    assert summary.status is RunStatus.COMPLETED
    assert summary.last_seq == events[-1].seq


async def test_a_run_stopped_mid_task_is_resumed_from_postgres_without_rerunning(
    postgres_dsn: str,
) -> None:
    reached = anyio.Event()

    async def execute(request: ModelRequest) -> object:
        if task_of(request).key == "s3":
            reached.set()
            await anyio.sleep_forever()
        return with_finding(request)

    first = scripted(execute=execute)
    with anyio.fail_after(20):
        async with (
            PostgresStore(postgres_dsn) as store,
            Supervisor(first, store) as sup,
        ):
            handle = await sup.submit(spec(chain(4), milestone_every=100))
            await reached.wait()
        assert executed_ids(first) == ["t1", "t2", "t3"]

        second = scripted()
        async with (
            PostgresStore(postgres_dsn) as store,
            Supervisor(second, store, resume=True) as sup,
        ):
            result = await sup.get(handle.run_id).result()
            events = await store.read(handle.run_id)
            assert await sup.replay(handle.run_id) == result

    assert result.status is RunStatus.COMPLETED
    assert executed_ids(second) == ["t3", "t4"]
    assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 4
    assert [e.task_id for e in events if isinstance(e, TaskInterrupted)] == ["t3"]
