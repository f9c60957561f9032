"""Failures: skips follow dependencies; transient failures retry, never replan."""

from __future__ import annotations

import logging
import sys
from typing import Any

import anyio
import pytest
from scripts import (
    SYNTHESIS,
    always_replan,
    clean,
    executed_ids,
    independent,
    run_to_end,
    scripted,
    spec,
    task_of,
)

from replan import (
    MemoryStore,
    ModelRequest,
    RunResult,
    RunStatus,
    Supervisor,
    Task,
    TaskContext,
    TaskDraft,
    TaskOutcome,
    TaskRunner,
    TaskStatus,
)
from replan.actors import PoolStatistics
from replan.messages import MilestoneReviewed, TaskFinished, TaskStarted


def transient(reason: str = "429 too many requests") -> TaskOutcome:
    return TaskOutcome(success=False, transient=True, reason=reason)


async def test_a_failed_task_skips_its_dependents_transitively_but_not_others() -> None:
    drafts = [
        TaskDraft(key="a", description="fetch the source"),
        TaskDraft(key="b", description="parse it", depends_on=["a"]),
        TaskDraft(key="c", description="summarize it", depends_on=["b"]),
        TaskDraft(key="d", description="an independent survey"),
    ]

    def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).key == "a":
            return TaskOutcome(success=False, reason="the source is gone for good")
        return clean(request)

    model = scripted(execute=execute)

    done = await run_to_end(model, spec(drafts))

    assert done.statuses() == {
        "t1": "failed",
        "t2": "skipped",
        "t3": "skipped",
        "t4": "completed",
    }
    # The executor was never asked to run b or c, and a failure for good is
    # not retried.
    assert sorted(executed_ids(model)) == ["t1", "t4"]
    assert done.task("t1").attempts == 1
    assert done.task("t1").result == TaskOutcome(
        success=False, reason="the source is gone for good"
    )
    assert done.task("t2").attempts == 0
    assert done.task("t3").attempts == 0
    assert done.result.status is RunStatus.COMPLETED
    assert done.replayed == done.result


async def test_a_transient_failure_is_retried_until_it_succeeds_without_a_review() -> (
    None
):
    def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).id == "t1" and request.context["attempt"] < 3:
            return transient()
        return clean(request)

    # The reviewer would replan if it were asked; it must not be.
    model = scripted(execute=execute, milestone=always_replan)
    drafts = [
        TaskDraft(key="flaky", description="call a rate-limited API"),
        TaskDraft(key="next", description="use its answer", depends_on=["flaky"]),
    ]

    done = await run_to_end(model, spec(drafts, milestone_every=1, max_task_attempts=3))

    flaky = done.task("t1")
    assert flaky.status is TaskStatus.COMPLETED
    assert flaky.attempts == 3
    assert flaky.result == TaskOutcome(success=True, summary="t1 done")
    assert executed_ids(model) == ["t1", "t1", "t1", "t2"]
    started = [e.attempt for e in done.events if isinstance(e, TaskStarted)]
    assert started == [1, 2, 3, 1]
    # Retries happen before any review, and no review needed the model.
    kinds = [
        e.kind for e in done.events if isinstance(e, TaskFinished | MilestoneReviewed)
    ]
    assert kinds[:3] == ["task_finished"] * 3
    assert all(r.by == "heuristic" for r in done.reviews())
    assert model.calls_for("reviewer", "milestone") == []
    assert model.calls_for("planner", "replan") == []
    assert done.result.replans == []
    assert done.result.status is RunStatus.COMPLETED


async def test_a_retried_task_counts_once_toward_the_next_milestone() -> None:
    def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).id == "t1" and request.context["attempt"] == 1:
            return transient()
        return clean(request)

    model = scripted(execute=execute)

    done = await run_to_end(
        model,
        spec(independent(3), max_concurrency=1, milestone_every=2, max_task_attempts=2),
    )

    # The first review comes after two completed tasks; t1's failed attempt
    # is no finished task.
    completed_before_review = 0
    for event in done.events:
        if isinstance(event, MilestoneReviewed):
            break
        if isinstance(event, TaskFinished) and event.outcome.success:
            completed_before_review += 1
    assert completed_before_review == 2
    assert done.task("t1").attempts == 2
    assert done.result.status is RunStatus.COMPLETED


@pytest.mark.parametrize("max_task_attempts", [1, 2, 3])
async def test_a_task_that_keeps_failing_transiently_fails_after_max_task_attempts(
    max_task_attempts: int,
) -> None:
    def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).id == "t1":
            return transient("503 service unavailable")
        return clean(request)

    model = scripted(execute=execute)
    drafts = [
        TaskDraft(key="flaky", description="call a broken API"),
        TaskDraft(key="next", description="use its answer", depends_on=["flaky"]),
        TaskDraft(key="other", description="an independent survey"),
    ]

    done = await run_to_end(
        model, spec(drafts, milestone_every=5, max_task_attempts=max_task_attempts)
    )

    flaky = done.task("t1")
    assert flaky.status is TaskStatus.FAILED
    assert flaky.attempts == max_task_attempts
    assert flaky.result == transient("503 service unavailable")
    assert executed_ids(model).count("t1") == max_task_attempts
    assert done.task("t2").status is TaskStatus.SKIPPED
    assert done.task("t3").status is TaskStatus.COMPLETED
    # Only the final failure reaches a review: one model review, after the
    # last attempt, and no replan.
    reviews = model.calls_for("reviewer", "milestone")
    assert len(reviews) == 1
    last_attempt = max(i for i, c in enumerate(model.calls) if c.purpose == "execute")
    assert model.calls.index(reviews[0]) > last_attempt
    assert done.result.replans == []
    assert done.result.status is RunStatus.COMPLETED


async def test_an_executor_crash_is_retried_as_transient_and_the_run_completes() -> (
    None
):
    def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).id == "t2" and request.context["attempt"] == 1:
            raise RuntimeError("the executor blew up")
        return clean(request)

    model = scripted(execute=execute, milestone=always_replan)

    done = await run_to_end(model, spec(independent(3), max_task_attempts=2))

    assert executed_ids(model).count("t2") == 2
    crashed = done.task("t2")
    assert crashed.status is TaskStatus.COMPLETED
    assert crashed.attempts == 2
    assert done.statuses() == {
        "t1": "completed",
        "t2": "completed",
        "t3": "completed",
    }
    assert done.result.status is RunStatus.COMPLETED
    assert done.result.output == SYNTHESIS
    assert done.result.replans == []
    assert model.calls_for("reviewer", "milestone") == []


async def test_an_executor_that_always_crashes_fails_the_task_not_the_run() -> None:
    def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).id == "t1":
            raise RuntimeError("the executor blew up")
        return clean(request)

    model = scripted(execute=execute)

    done = await run_to_end(model, spec(independent(2), max_task_attempts=2))

    assert executed_ids(model).count("t1") == 2
    crashed = done.task("t1")
    assert crashed.status is TaskStatus.FAILED
    assert crashed.attempts == 2
    assert crashed.result is not None
    assert crashed.result.transient
    assert crashed.result.reason is not None
    assert "the executor blew up" in crashed.result.reason
    assert done.task("t2").status is TaskStatus.COMPLETED
    assert done.result.status is RunStatus.COMPLETED


async def test_a_report_that_cannot_be_read_fails_the_task_not_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Reading a report runs on the executor worker that answered: a fault
    # there must fail that attempt, keep the pool serving, and end the run.
    from replan.supervisor._run import RunDriver

    real = RunDriver._report
    faults: list[str] = []

    def faulty(self: RunDriver, task: Any, slot: Any) -> Any:
        if task.id == "t1" and not faults:
            faults.append(task.id)
            raise RuntimeError("unreadable")
        return real(self, task, slot)

    monkeypatch.setattr(RunDriver, "_report", faulty)
    model = scripted()
    finished = await run_to_end(model, spec(independent(3)))
    result = finished.result
    assert result.status is RunStatus.COMPLETED
    statuses = {t.id: t.status for t in result.tasks}
    assert statuses == {
        "t1": TaskStatus.FAILED,
        "t2": TaskStatus.COMPLETED,
        "t3": TaskStatus.COMPLETED,
    }
    failed = next(t for t in result.tasks if t.id == "t1")
    assert failed.result is not None
    assert "could not be read: unreadable" in (failed.result.reason or "")


async def three_flaky_runs_then_a_healthy_one(
    run_task: TaskRunner,
) -> tuple[list[RunResult], RunResult, PoolStatistics]:
    """Three runs of the flaky service's task, then one of two independent
    tasks, on a supervisor whose executor stops after more than one crash a
    minute: their results and the executor's statistics."""
    flaky = [TaskDraft(key="s1", description="call the flaky service")]
    async with Supervisor(
        scripted(),
        MemoryStore(),
        task_runner=run_task,
        max_restarts=1,
        restart_period_s=60,
    ) as sup:
        with anyio.fail_after(10):
            failing = [await sup.submit(spec(flaky)) for _ in range(3)]
            results = [await handle.result() for handle in failing]
            healthy = await (await sup.submit(spec(independent(2)))).result()
        executor = next(p for p in sup.pool_statistics() if p.role == "executor")
    return results, healthy, executor


async def test_a_raising_task_function_fails_its_tasks_not_the_executor_role() -> None:
    # The user's task function raising is that task's failure, retried as a
    # crash; the executor itself is sound, so no number of such failures may
    # stop the role and fail every other run of the supervisor with it.
    async def run_task(task: Task, ctx: TaskContext) -> TaskOutcome:
        if task.description == "call the flaky service":
            raise ConnectionError("the service hung up")
        return TaskOutcome(success=True, summary=f"{task.id} done")

    results, healthy, executor = await three_flaky_runs_then_a_healthy_one(run_task)

    for result in results:
        task = result.tasks[0]
        assert task.status is TaskStatus.FAILED
        assert task.attempts == 2
        assert task.result is not None
        assert task.result.reason == (
            "executor crashed: executor: ConnectionError: the service hung up"
        )
    assert healthy.status is RunStatus.COMPLETED
    assert [t.status for t in healthy.tasks] == [TaskStatus.COMPLETED] * 2
    assert not executor.stopped
    assert executor.restarts == 0


async def test_a_task_function_calling_sys_exit_fails_its_attempt_only() -> None:
    # As in a tool: a command-line helper's sys.exit() ends the attempt, not
    # the application the supervisor runs in, nor the other runs.
    def run_task(task: Task, ctx: TaskContext) -> TaskOutcome:
        if task.description == "call the command-line helper":
            sys.exit(3)
        return TaskOutcome(success=True, summary=f"{task.id} done")

    exits = [TaskDraft(key="cli", description="call the command-line helper")]
    async with Supervisor(
        scripted(), MemoryStore(), task_runner=run_task, max_restarts=0
    ) as sup:
        with anyio.fail_after(10):
            exited = await (await sup.submit(spec(exits))).result()
            healthy = await (await sup.submit(spec(independent(2)))).result()
        executor = next(p for p in sup.pool_statistics() if p.role == "executor")

    task = exited.tasks[0]
    assert task.status is TaskStatus.FAILED
    assert task.attempts == 2
    assert task.result is not None
    assert task.result.reason == (
        "executor crashed: executor: RuntimeError: the task function called sys.exit(3)"
    )
    assert healthy.status is RunStatus.COMPLETED
    assert not executor.stopped
    assert executor.restarts == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_task_function_raising_a_stray_cancellation_fails_its_tasks_only() -> (
    None
):
    # Only asyncio code can raise a cancellation no scope sent (a task
    # function awaiting a task of its own that something else cancelled).
    # Counted as crashes of the executor, three such tasks stopped the role
    # and failed every other run of the supervisor with it.
    import asyncio  # noqa: TID251 - a stray asyncio.CancelledError

    async def run_task(task: Task, ctx: TaskContext) -> TaskOutcome:
        if task.description == "call the flaky service":
            future = asyncio.get_running_loop().create_future()
            future.cancel()
            await future
        return TaskOutcome(success=True, summary=f"{task.id} done")

    results, healthy, executor = await three_flaky_runs_then_a_healthy_one(run_task)

    for result in results:
        task = result.tasks[0]
        assert task.status is TaskStatus.FAILED
        assert task.attempts == 2
        assert task.result is not None
        assert task.result.reason == (
            "executor crashed: executor: RuntimeError: the task function raised "
            "a cancellation that nothing had asked for (CancelledError)"
        )
    assert healthy.status is RunStatus.COMPLETED
    assert not executor.stopped
    assert executor.restarts == 0


async def test_a_task_function_cut_short_by_its_timeout_ends_that_attempt_only() -> (
    None
):
    # The cancel goes on out of the task function: no crash of the
    # executor, and the supervisor serves on.
    async def run_task(task: Task, ctx: TaskContext) -> TaskOutcome:
        if task.key == "hang":
            await anyio.sleep_forever()
        return TaskOutcome(success=True, summary=f"{task.id} done")

    hangs = [TaskDraft(key="hang", description="wait for a reply that never comes")]
    async with Supervisor(
        scripted(), MemoryStore(), task_runner=run_task, max_restarts=0
    ) as sup:
        with anyio.fail_after(10):
            timed = spec(hangs, task_timeout_s=0.05, max_task_attempts=2)
            stuck = await (await sup.submit(timed)).result()
            healthy = await (await sup.submit(spec(independent(2)))).result()
        executor = next(p for p in sup.pool_statistics() if p.role == "executor")

    task = stuck.tasks[0]
    assert task.status is TaskStatus.FAILED
    assert task.attempts == 2
    assert healthy.status is RunStatus.COMPLETED
    assert not executor.stopped
    assert executor.restarts == 0


async def test_a_task_function_returning_no_outcome_fails_the_attempt_saying_so() -> (
    None
):
    async def run_task(task: Task, ctx: TaskContext) -> Any:
        return f"{task.id} done"

    model = scripted()
    done = await run_to_end(model, spec(independent(1)), task_runner=run_task)

    task = done.task("t1")
    assert task.status is TaskStatus.FAILED
    assert task.attempts == 2
    assert task.result is not None
    assert task.result.reason == (
        "executor crashed: executor: TypeError: the task function returned str, "
        "not a TaskOutcome"
    )


async def test_a_plain_function_runs_tasks_as_an_async_one_does() -> None:
    # Its result is taken as it is: not awaited, failed, and run again.
    ran: list[str] = []

    def run_task(task: Task, ctx: TaskContext) -> TaskOutcome:
        ran.append(task.id)
        return TaskOutcome(success=True, summary=f"{task.id} done")

    done = await run_to_end(scripted(), spec(independent(2)), task_runner=run_task)

    assert done.result.status is RunStatus.COMPLETED
    assert sorted(ran) == ["t1", "t2"]
    assert [t.attempts for t in done.result.tasks] == [1, 1]


async def test_a_raising_task_function_is_logged_on_replan_actors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def run_task(task: Task, ctx: TaskContext) -> TaskOutcome:
        raise ConnectionError("the service hung up")

    with caplog.at_level(logging.ERROR, logger="replan.actors"):
        await run_to_end(scripted(), spec(independent(1)), task_runner=run_task)

    logged = [r for r in caplog.records if r.name == "replan.actors"]
    assert len(logged) == 2  # one per attempt
    for record in logged:
        assert record.exc_info is not None
        assert isinstance(record.exc_info[1], ConnectionError)


async def test_the_idempotency_key_is_stable_across_retries_and_restarts() -> None:
    keys: list[tuple[str, str]] = []
    started = anyio.Event()

    async def blocked(task: Task, ctx: TaskContext) -> TaskOutcome:
        keys.append((task.id, ctx.idempotency_key))
        if len(keys) == 2:
            started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def flaky(task: Task, ctx: TaskContext) -> TaskOutcome:
        keys.append((task.id, ctx.idempotency_key))
        if sum(t == task.id for t, _ in keys) < 3:
            return transient()
        return TaskOutcome(success=True, summary=f"{task.id} done")

    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(scripted(), store, task_runner=blocked) as sup:
            run_id = (await sup.submit(spec(independent(2)))).run_id
            await started.wait()
        async with Supervisor(scripted(), store, task_runner=flaky, resume=True) as sup:
            result = await sup.handles()[0].result()

    assert result.status is RunStatus.COMPLETED
    assert result.run_id == run_id
    for task_id in ("t1", "t2"):
        # Cut short by the exit, then a transient failure, then a success.
        mine = [k for t, k in keys if t == task_id]
        assert len(mine) == 3
        assert len(set(mine)) == 1
    assert dict(keys)["t1"] != dict(keys)["t2"]
