"""``Limits.task_timeout_s``: an attempt that takes too long is cut short.

The attempt's handling is cancelled and it fails ``transient``, so it is
retried up to ``max_task_attempts``; a task whose every attempt times out
fails and skips its dependents. A tool call's gate the attempt left waiting
is withdrawn: the next attempt asks again.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from scripts import GOAL, chain, emails_first, independent, send_email, spec

from replan import (
    ConfigurationError,
    GateError,
    Limits,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    RunSpec,
    RunStatus,
    ScriptedModel,
    Supervisor,
    Synthesis,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    TokenUsage,
    tool,
)
from replan.messages import GateOpened, GateResolved, TaskFinished, ToolCall
from replan.store import SQLiteStore

TIMEOUT_S = 0.2


class Hanging:
    """An executor whose listed attempts hang (until cancelled); it counts
    the attempts it saw and the hung ones that were cancelled."""

    def __init__(self, *, hang: set[tuple[str, int]]) -> None:
        self.hang = hang
        self.attempts: list[tuple[str, int]] = []
        self.cancelled: list[tuple[str, int]] = []

    async def __call__(self, request: ModelRequest) -> Any:
        if request.purpose == "synthesize":
            return Synthesis(output="done")
        task = request.context["task"]
        attempt = (task.key, request.context["attempt"])
        self.attempts.append(attempt)
        if attempt in self.hang:
            try:
                await anyio.sleep_forever()
            finally:
                self.cancelled.append(attempt)
        return TaskOutcome(success=True, summary=f"{task.key} done")


async def run(model: ScriptedModel, run_spec: RunSpec) -> tuple[Any, list[Any]]:
    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(model, store) as sup:
            handle = await sup.submit(run_spec)
            result = await handle.result()
            events = await store.read(handle.run_id)
            assert await sup.replay(handle.run_id) == result
    return result, events


def timed(
    tasks: list[TaskDraft], timeout_s: float = TIMEOUT_S, **limits: Any
) -> RunSpec:
    return spec(tasks, task_timeout_s=timeout_s, **limits)


async def test_an_attempt_past_task_timeout_s_is_cut_short_and_retried() -> None:
    executor = Hanging(hang={("s1", 1)})

    result, events = await run(ScriptedModel(executor), timed(independent(2)))

    assert result.status is RunStatus.COMPLETED
    assert executor.cancelled == [("s1", 1)]
    assert executor.attempts.count(("s1", 2)) == 1
    first = next(e for e in events if isinstance(e, TaskFinished) and e.task_id == "t1")
    assert not first.outcome.success
    assert first.outcome.transient
    assert first.outcome.reason == (
        f"task_timeout_s: the attempt took longer than {TIMEOUT_S:g}s"
    )
    assert {t.id: t.attempts for t in result.tasks} == {"t1": 2, "t2": 1}


async def test_a_timed_out_attempt_on_a_sqlite_journal_is_retried_and_replayed(
    tmp_path: Path,
) -> None:
    executor = Hanging(hang={("s1", 1)})
    with anyio.fail_after(10):
        async with (
            SQLiteStore(tmp_path / "journal.db") as store,
            Supervisor(ScriptedModel(executor), store) as sup,
        ):
            handle = await sup.submit(timed(independent(2)))
            result = await handle.result()
            assert await sup.replay(handle.run_id) == result

    assert result.status is RunStatus.COMPLETED
    assert executor.cancelled == [("s1", 1)]
    assert {t.id: t.attempts for t in result.tasks} == {"t1": 2, "t2": 1}


async def test_a_task_whose_every_attempt_times_out_fails_and_skips_dependents() -> (
    None
):
    tasks = [*chain(2), TaskDraft(key="other", description="independent work")]
    executor = Hanging(hang={("s1", 1), ("s1", 2)})

    result, _ = await run(ScriptedModel(executor), timed(tasks, max_task_attempts=2))

    statuses = {t.key: t.status.value for t in result.tasks}
    assert statuses == {"s1": "failed", "s2": "skipped", "other": "completed"}
    assert executor.cancelled == [("s1", 1), ("s1", 2)]
    assert ("s2", 1) not in executor.attempts


async def test_the_time_an_attempt_waits_for_an_executor_is_not_its_time() -> None:
    # One executor for three runs of two tasks: each attempt takes 0.1s,
    # within the limit, though the last ones wait 0.5s for the executor.
    async def runner(task: Any, ctx: Any) -> TaskOutcome:
        await anyio.sleep(0.1)
        return TaskOutcome(success=True, summary=f"{task.key} done")

    model = ScriptedModel(lambda request: Synthesis(output="done"))
    with anyio.fail_after(10):
        async with Supervisor(
            model, MemoryStore(), task_runner=runner, workers={"executor": 1}
        ) as sup:
            handles = [
                await sup.submit(timed(independent(2), 0.25, max_task_attempts=1))
                for _ in range(3)
            ]
            results = [await handle.result() for handle in handles]

    assert [r.status for r in results] == [RunStatus.COMPLETED] * 3
    assert [t.attempts for r in results for t in r.tasks] == [1] * 6


async def test_an_attempt_timed_out_in_a_thread_keeps_its_place_until_it_stops() -> (
    None
):
    # A task function blocked in a thread does not notice the cancellation
    # at task_timeout_s: until it returns, its attempt still runs, and no
    # retry or other task may take its place beyond max_concurrency.
    lock = threading.Lock()
    running = most = 0

    def blocking() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.3)  # well past the timeout
        with lock:
            running -= 1

    async def runner(task: Any, ctx: Any) -> TaskOutcome:
        await anyio.to_thread.run_sync(blocking)
        return TaskOutcome(success=True, summary="done")

    model = ScriptedModel(lambda request: Synthesis(output="done"))
    limits = {"max_concurrency": 1, "task_timeout_s": 0.05, "max_task_attempts": 2}
    async with Supervisor(model, MemoryStore(), task_runner=runner) as sup:
        handle = await sup.submit(spec(independent(2), **limits))
        with anyio.fail_after(10):
            result = await handle.result()
    # Every attempt timed out (two per task), one thread at a time.
    assert [t.status for t in result.tasks] == [TaskStatus.FAILED] * 2
    assert result.task_executions == 4
    assert most == 1


async def test_without_task_timeout_s_a_slow_attempt_is_waited_for() -> None:
    async def slow(request: ModelRequest) -> Any:
        if request.purpose == "synthesize":
            return Synthesis(output="done")
        await anyio.sleep(TIMEOUT_S * 2)
        return TaskOutcome(success=True, summary="slow but done")

    result, events = await run(ScriptedModel(slow), spec(independent(1)))

    assert result.status is RunStatus.COMPLETED
    finished = [e for e in events if isinstance(e, TaskFinished)]
    assert [e.outcome.success for e in finished] == [True]


async def test_a_tool_calls_gate_left_by_a_timed_out_attempt_is_withdrawn() -> None:
    store = MemoryStore()
    async with Supervisor(
        ScriptedModel(emails_first), store, tools=[send_email]
    ) as sup:
        # Long enough for the second attempt to finish once approved.
        handle = await sup.submit(timed(independent(1), timeout_s=1.0))
        gates: list[str] = []
        with anyio.fail_after(10):
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    gates.append(event.request.gate_id)
                    if len(gates) == 2:
                        break
            # The first attempt's gate expired with the attempt; the second
            # attempt asked again, and its answer lets the task finish.
            assert [g.gate_id for g in sup.gates.pending()] == [gates[1]]
            await sup.gates.resolve(gates[1], {"decision": "approve"})
            result = await handle.result()
        events = await store.read(handle.run_id)
        assert await sup.replay(handle.run_id) == result

    assert result.status is RunStatus.COMPLETED
    resolved = {e.gate_id: e.resolution for e in events if isinstance(e, GateResolved)}
    assert resolved[gates[0]].decision == "reject"
    assert resolved[gates[0]].by == "supervisor"
    assert resolved[gates[1]].decision == "approve"
    assert sup.gates.pending() == []


@tool
async def _stall(topic: str) -> str:
    """Look something up, and never come back."""
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


USAGE = TokenUsage(input_tokens=10, output_tokens=5)


def _looks_up(request: ModelRequest) -> Any:
    if request.purpose == "synthesize":
        return Synthesis(output="done")
    if request.context["attempt"] == 1:
        call = ToolCall(id="c1", name="_stall", arguments='{"topic": "x"}')
        return ModelResponse(tool_calls=[call], usage=USAGE)
    return TaskOutcome(success=True, summary="found it without the tool")


async def test_the_tokens_a_timed_out_attempt_spent_are_journaled() -> None:
    usage = USAGE
    model = ScriptedModel(_looks_up, usage=usage)
    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(model, store, tools=[_stall]) as sup:
            handle = await sup.submit(timed(independent(1)))
            result = await handle.result()
            events = await store.read(handle.run_id)
            assert await sup.replay(handle.run_id) == result

    assert result.status is RunStatus.COMPLETED
    first, second = (e for e in events if isinstance(e, TaskFinished))
    assert first.outcome.reason is not None
    assert first.outcome.reason.startswith("task_timeout_s:")
    # One call of the cut-short attempt (its tool never returned), one of
    # the retry: the journal has both, each counted as the one call it was.
    one_call = usage.model_copy(update={"calls": 1})
    assert first.usage == one_call
    assert second.usage == one_call
    assert len(model.calls_for("executor", "execute")) == 2
    # Both attempts and the synthesis.
    calls = len(model.calls_for("executor"))
    assert calls == 3
    assert result.usage.by_role["executor"].total_tokens == 15 * calls


async def test_an_answer_that_comes_after_its_attempt_timed_out_is_journaled() -> None:
    # The model call of the attempt cut short answered a moment later (its
    # cancellation did not reach it in time: a model in a thread, or an
    # answer already on its way): its tokens were charged to an attempt the
    # run had journaled already, and were in no journal.
    def answer(request: ModelRequest) -> Any:
        if request.purpose == "synthesize":
            return Synthesis(output="done")
        return TaskOutcome(success=True, summary="found")

    async def late_first(request: ModelRequest) -> Any:
        if request.purpose == "execute" and request.context["attempt"] == 1:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(2 * TIMEOUT_S)
        return answer(request)

    model = ScriptedModel(late_first, usage=USAGE)
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(timed(independent(1)))
            result = await handle.result()
            assert await sup.replay(handle.run_id) == result
    assert result.status is RunStatus.COMPLETED
    assert len(model.calls_for("executor", "execute")) == 2
    # Both attempts' answers and the synthesis.
    assert result.usage.by_role["executor"].calls == len(model.calls) == 3


@pytest.mark.parametrize("value", [0, -1, 10**9])
def test_task_timeout_s_must_be_positive_and_at_most_a_year(value: float) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Limits(task_timeout_s=value)
    assert caught.value.field == "task_timeout_s"


def test_a_run_spec_names_a_bad_task_timeout_s() -> None:
    with pytest.raises(ConfigurationError) as caught:
        RunSpec(goal=GOAL, limits={"task_timeout_s": "soon"})
    assert caught.value.field == "limits.task_timeout_s"


async def test_answers_racing_the_timeout_leave_every_gate_resolved_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # People answer tool calls' gates at random moments around the attempts'
    # timeout. Whichever comes first, each gate is resolved exactly once in
    # the journal (by the person or withdrawn), no worker crashes, and every
    # run's journal replays to its result.
    rnd = random.Random(7)
    store = MemoryStore()
    async with Supervisor(
        ScriptedModel(emails_first), store, tools=[send_email]
    ) as sup:
        run_spec = timed(independent(2), timeout_s=0.02, max_task_attempts=3)
        handles = [await sup.submit(run_spec) for _ in range(30)]

        async def answer(gate_id: str, after: float) -> None:
            await anyio.sleep(after)
            with contextlib.suppress(GateError):
                await sup.gates.resolve(gate_id, {"decision": "approve"})

        async def answering() -> None:
            seen: set[str] = set()
            while True:
                for gate in sup.gates.pending():
                    if gate.gate_id not in seen:
                        seen.add(gate.gate_id)
                        tg.start_soon(answer, gate.gate_id, rnd.random() * 0.03)
                await anyio.sleep(0.002)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(answering)
                results = [await h.result() for h in handles]
                tg.cancel_scope.cancel()
        for handle, result in zip(handles, results, strict=True):
            events = await store.read(handle.run_id)
            opened = [e.request.gate_id for e in events if isinstance(e, GateOpened)]
            resolved = [e.gate_id for e in events if isinstance(e, GateResolved)]
            assert sorted(opened) == sorted(resolved)
            assert await sup.replay(handle.run_id) == result
        assert sup.gates.pending() == []
    crashes = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert crashes == []


async def test_tool_calls_to_a_supervisor_without_tools_name_what_is_missing() -> None:
    # A run resumed on a supervisor built without the tools it started with
    # (or a scripted model asking for tools): the task's failure says so.
    model = ScriptedModel(_looks_up)
    async with Supervisor(model) as sup:
        result = await (await sup.submit(spec(independent(1)))).result()
    (task,) = result.tasks
    assert task.status is TaskStatus.FAILED
    assert task.result is not None
    assert "asked for tools (_stall) but the supervisor has none" in (
        task.result.reason
    )
