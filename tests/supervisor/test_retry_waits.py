"""A task's retry waits: for the time a transient failure asked, else a backoff.

Other ready tasks go on meanwhile; a deadline or a cancel ends a run that
waits at once; the time is journaled, so a resumed run waits until it too.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from scripts import (
    clean,
    executed_ids,
    independent,
    run_to_end,
    scripted,
    spec,
    task_of,
    with_finding,
)

from replan import (
    ModelRequest,
    RunStatus,
    Supervisor,
    Task,
    TaskContext,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    TransientModelError,
    Verdict,
)
from replan._render import event_lines
from replan.messages import (
    MilestoneReviewed,
    RetryScheduled,
    TaskFinished,
    TaskStarted,
)
from replan.store import EffectRecord, SQLiteStore
from replan.supervisor import apply, replay


def rate_limited_once(key: str, wait_s: float) -> Any:
    """An executor answer: a 429 asking for ``wait_s`` on the first attempt
    at ``key``; a clean result otherwise. Records when each attempt began,
    and the time of day of the 429."""
    began: dict[tuple[str, int], float] = {}
    failed_at: list[datetime] = []

    def execute(request: ModelRequest) -> TaskOutcome:
        task = task_of(request)
        began[task.key, request.context["attempt"]] = time.monotonic()
        if task.key == key and request.context["attempt"] == 1:
            failed_at.append(datetime.now(UTC))
            raise TransientModelError(
                "HTTP 429: slow down; the server asks to wait", retry_after=wait_s
            )
        return clean(request)

    execute.began = began  # type: ignore[attr-defined]
    execute.failed_at = failed_at  # type: ignore[attr-defined]
    return execute


async def test_a_retry_waits_for_the_time_a_rate_limit_asked_while_others_go_on() -> (
    None
):
    execute = rate_limited_once("t0", 0.6)
    model = scripted(execute=execute)
    drafts = [
        TaskDraft(key="t0", description="a rate-limited call"),
        TaskDraft(key="after", description="uses it", depends_on=["t0"]),
        TaskDraft(key="other", description="independent work"),
    ]

    done = await run_to_end(model, spec(drafts, milestone_every=100))

    assert done.result.status is RunStatus.COMPLETED
    assert done.statuses() == {"t1": "completed", "t2": "completed", "t3": "completed"}
    assert done.task("t1").attempts == 2
    began = execute.began
    assert began["t0", 2] - began["t0", 1] >= 0.55
    # The independent task did not wait for the retry.
    assert began["other", 1] - began["t0", 1] < 0.3
    failed = next(e for e in done.events if isinstance(e, TaskFinished))
    assert failed.task_id == "t1"
    # Journaled with the failure, in the same append.
    (scheduled,) = [e for e in done.events if isinstance(e, RetryScheduled)]
    assert scheduled.task_id == "t1"
    assert scheduled.seq > failed.seq
    # Counted from the 429, not from its journaling (later, by however long
    # the report took to reach the driver).
    wait = timedelta(seconds=0.6)
    assert execute.failed_at[0] + wait <= scheduled.retry_at <= failed.at + wait
    (failure,) = done.result.model_failures
    assert failure.retry_after_s == pytest.approx(0.6)
    retry = [e for e in done.events if isinstance(e, TaskStarted) and e.attempt == 2]
    assert retry[0].at >= scheduled.retry_at
    assert done.replayed == done.result
    assert replay(done.events).retry_at == {}


async def test_a_plain_transient_failure_backs_off_by_retry_backoff_s() -> None:
    began: list[float] = []

    def execute(request: ModelRequest) -> TaskOutcome:
        began.append(time.monotonic())
        if request.context["attempt"] < 3:
            return TaskOutcome(success=False, transient=True, reason="503")
        return clean(request)

    model = scripted(execute=execute)
    done = await run_to_end(
        model, spec(independent(1), max_task_attempts=3, retry_backoff_s=0.4)
    )

    assert done.task("t1").status is TaskStatus.COMPLETED
    # Equal jitter: between half and all of 0.4 s, then of 0.8 s.
    assert 0.19 <= began[1] - began[0] < 0.6
    assert 0.39 <= began[2] - began[1] < 1.0
    order = [
        e.kind for e in done.events if isinstance(e, TaskFinished | RetryScheduled)
    ]
    assert order == ["task_finished", "retry_scheduled"] * 2 + ["task_finished"]
    assert done.replayed == done.result


async def test_a_doubled_backoff_waits_at_most_a_minute() -> None:
    # The first retry waits as its 429 asked (at once); the second failure
    # asked for nothing, so it backs off: 60 s doubled is 120 s, and the
    # wait is between half and all of the one minute it may be at most.
    def execute(request: ModelRequest) -> TaskOutcome:
        if request.context["attempt"] == 1:
            raise TransientModelError("HTTP 429", retry_after=0.01)
        return TaskOutcome(success=False, transient=True, reason="503")

    done = await run_to_end(
        scripted(execute=execute),
        spec(independent(1), max_task_attempts=3, retry_backoff_s=60, deadline_s=1),
    )

    assert done.result.status is RunStatus.LIMIT_REACHED
    assert done.task("t1").attempts == 2
    waits = [
        (e.retry_at - e.at).total_seconds()
        for e in done.events
        if isinstance(e, RetryScheduled)
    ]
    # The last is the backoff's (the 429's wait may be past when it is read).
    assert 29 <= waits[-1] <= 60.5


async def test_no_backoff_retries_at_once_and_journals_no_time() -> None:
    def execute(request: ModelRequest) -> TaskOutcome:
        if request.context["attempt"] == 1:
            return TaskOutcome(success=False, transient=True, reason="503")
        return clean(request)

    done = await run_to_end(
        scripted(execute=execute), spec(independent(1), retry_backoff_s=0)
    )

    assert done.task("t1").attempts == 2
    assert not [e for e in done.events if isinstance(e, RetryScheduled)]


async def test_the_last_attempts_failure_journals_no_retry_time() -> None:
    def execute(request: ModelRequest) -> TaskOutcome:
        raise TransientModelError("HTTP 429", retry_after=5)

    done = await run_to_end(
        scripted(execute=execute), spec(independent(1), max_task_attempts=1)
    )

    assert done.task("t1").status is TaskStatus.FAILED
    assert not [e for e in done.events if isinstance(e, RetryScheduled)]
    assert done.elapsed_s < 3


@pytest.mark.parametrize("end", ["deadline", "cancel"])
async def test_a_run_waiting_for_a_retry_ends_at_once_on_its_deadline_or_a_cancel(
    end: str,
) -> None:
    failed = anyio.Event()

    def execute(request: ModelRequest) -> TaskOutcome:
        failed.set()
        raise TransientModelError("HTTP 429", retry_after=60)

    limits: dict[str, Any] = {"deadline_s": 0.5} if end == "deadline" else {}
    started = time.monotonic()
    with anyio.fail_after(10):
        async with Supervisor(scripted(execute=execute)) as sup:
            handle = await sup.submit(spec(independent(1), **limits))
            if end == "cancel":
                await failed.wait()
                await anyio.sleep(0.1)
                await handle.cancel()
            result = await handle.result()
    elapsed = time.monotonic() - started

    assert elapsed < 3
    if end == "deadline":
        assert result.status is RunStatus.LIMIT_REACHED
        assert result.stop_reason == "deadline_s: 0.5s passed"
    else:
        assert result.status is RunStatus.CANCELLED
    assert result.tasks[0].status is TaskStatus.PENDING
    assert result.tasks[0].attempts == 1


async def test_a_task_function_asks_for_a_wait_by_raising_transient_model_error() -> (
    None
):
    began: list[float] = []

    async def runner(task: Task, ctx: TaskContext) -> TaskOutcome:
        began.append(time.monotonic())
        if ctx.attempt == 1:
            raise TransientModelError("our API said 429", retry_after=0.5)
        return TaskOutcome(success=True, summary="done")

    done = await run_to_end(scripted(), spec(independent(1)), task_runner=runner)

    assert done.task("t1").status is TaskStatus.COMPLETED
    assert began[1] - began[0] >= 0.45
    assert done.replayed == done.result


async def test_a_reviewer_asked_to_wait_is_asked_again_after_the_wait() -> None:
    asked: list[float] = []

    def milestone(request: ModelRequest) -> Verdict:
        asked.append(time.monotonic())
        if len(asked) == 1:
            raise TransientModelError("HTTP 429", retry_after=0.5)
        return Verdict(decision="continue", rationale="on track")

    model = scripted(execute=with_finding, milestone=milestone)
    done = await run_to_end(model, spec(independent(1)))

    assert done.result.status is RunStatus.COMPLETED
    assert len(asked) == 2
    assert asked[1] - asked[0] >= 0.45
    (review,) = [e for e in done.events if isinstance(e, MilestoneReviewed)]
    assert review.by == "model"


async def test_a_run_resumed_after_a_crash_waits_until_the_journaled_time(
    tmp_path: Any,
) -> None:
    def first_execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).key == "t0":
            raise TransientModelError("HTTP 429", retry_after=1.5)
        return clean(request)

    drafts = [
        TaskDraft(key="t0", description="a rate-limited call"),
        TaskDraft(key="after", description="uses it", depends_on=["t0"]),
    ]
    with anyio.fail_after(20):
        async with SQLiteStore(tmp_path / "j.db") as store:
            async with Supervisor(scripted(execute=first_execute), store) as sup:
                handle = await sup.submit(spec(drafts))
                async for event in handle.events():
                    if isinstance(event, RetryScheduled):
                        break
            run_id = handle.run_id
            events = await store.read(run_id)
        (finish,) = [e for e in events if isinstance(e, RetryScheduled)]
        assert replay(events).retry_at == {"t1": finish.retry_at}

        second = scripted()
        async with (
            SQLiteStore(tmp_path / "j.db") as store,
            Supervisor(second, store, resume=True) as sup,
        ):
            result = await sup.get(run_id).result()
            events = await store.read(run_id)
            assert await sup.replay(run_id) == result
    assert result.status is RunStatus.COMPLETED
    assert executed_ids(second) == ["t1", "t2"]
    retry = next(e for e in events if isinstance(e, TaskStarted) and e.attempt == 2)
    # No sooner than the journaled time, and not a whole new wait after it.
    assert finish.retry_at <= retry.at < finish.retry_at + timedelta(seconds=1)
    assert retry.at < datetime.now(UTC)


@pytest.mark.parametrize("given", [None, 0, -3, float("nan"), "5", True])
def test_a_retry_after_that_is_no_wait_asks_for_none(given: Any) -> None:
    # A task function's own error may carry anything: it asks for no wait
    # rather than crash the report of its attempt.
    failure = TransientModelError("429", retry_after=given).failure()
    assert failure.retry_after_s is None


def test_a_retry_after_longer_than_a_day_asks_for_a_day() -> None:
    failure = TransientModelError("429", retry_after=10**9).failure()
    assert failure.retry_after_s == 86_400


async def test_the_progress_of_a_run_says_when_a_failed_task_will_retry() -> None:
    execute = rate_limited_once("t0", 45)
    drafts = [TaskDraft(key="t0", description="a rate-limited call")]
    with anyio.fail_after(10):
        async with Supervisor(scripted(execute=execute)) as sup:
            handle = await sup.submit(spec(drafts))
            async for event in handle.events():
                if isinstance(event, RetryScheduled):
                    break
            await handle.cancel()
            events = await sup.store.read(handle.run_id)
    state = None
    lines = []
    for event in events:
        state = apply(state, event)
        lines.extend(event_lines(event, state))
    (failed,) = [line for line in lines if line.startswith("task t1 failed")]
    assert failed.startswith("task t1 failed (will retry): HTTP 429")
    assert "task t1 will retry in 45s" in lines


class LedgerSignal(SQLiteStore):
    """A SQLite journal that signals the first effect it records."""

    def __init__(self, path: Any) -> None:
        super().__init__(path)
        self.recorded = anyio.Event()

    async def record_effect(self, run_id: str, record: EffectRecord) -> None:
        await super().record_effect(run_id, record)
        self.recorded.set()


async def test_a_retry_kept_in_the_ledger_waits_after_a_crash_as_the_failure_asked(
    tmp_path: Any,
) -> None:
    # t2's 429 returns while the driver waits for a review that never ends:
    # only the effect ledger has it when the process stops. The resumed run
    # retries at the time the server asked for, not after a plain backoff,
    # and not after a whole new wait either. The wait asked for outlasts the
    # stop and the start by far (closing and opening a journal can take a
    # while on a busy machine): a retry already due at the start is taken at
    # once, with no retry_scheduled to journal.
    reviewing = anyio.Event()
    asked_at: list[datetime] = []

    async def slow_review(request: ModelRequest) -> Verdict:
        asked_at.append(datetime.now(UTC))
        reviewing.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).key == "s2":
            await reviewing.wait()
            raise TransientModelError("HTTP 429: slow down", retry_after=3)
        return with_finding(request)

    plan = [
        TaskDraft(key="s1", description="step 1", milestone=True),
        TaskDraft(key="s2", description="step 2"),
        TaskDraft(key="s3", description="step 3", depends_on=["s1", "s2"]),
    ]
    first = scripted(execute=execute, milestone=slow_review)
    with anyio.fail_after(20):
        async with LedgerSignal(tmp_path / "j.db") as store:
            async with Supervisor(first, store) as sup:
                handle = await sup.submit(spec(plan, milestone_every=100))
                run_id = handle.run_id
                await store.recorded.wait()
                await anyio.sleep(1)
            events = await store.read(run_id)
        finished = [e.task_id for e in events if isinstance(e, TaskFinished)]
        assert finished == ["t1"]

        second = scripted()
        resumed_at = datetime.now(UTC)
        async with (
            SQLiteStore(tmp_path / "j.db") as store,
            Supervisor(second, store, resume=True) as sup,
        ):
            result = await sup.get(run_id).result()
            events = await store.read(run_id)
            assert await sup.replay(run_id) == result
    assert result.status is RunStatus.COMPLETED
    assert executed_ids(second) == ["t2", "t3"]
    (scheduled,) = [e for e in events if isinstance(e, RetryScheduled)]
    retry = next(e for e in events if isinstance(e, TaskStarted) and e.attempt == 2)
    assert retry.at >= scheduled.retry_at >= asked_at[0] + timedelta(seconds=3)
    assert retry.at < resumed_at + timedelta(seconds=3)  # no whole new wait
    # The failure itself is journaled too, as it would have been at once.
    (failure,) = result.model_failures
    assert failure.task_id == "t2"
    assert failure.retry_after_s == pytest.approx(3)
