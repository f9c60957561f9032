"""Stopping: submissions during a shutdown, quiet cancels and exits, drain."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from scripts import (
    DelegatingStore,
    chain,
    emails_first,
    fresh_tasks,
    independent,
    replan_verdict,
    scripted,
    send_email,
    spec,
    task_of,
    with_finding,
)

from replan import (
    ConfigurationError,
    GateError,
    GatePolicy,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    RunHandle,
    RunSpec,
    RunStatus,
    ScriptedModel,
    Supervisor,
    SupervisorError,
    Synthesis,
    TaskOutcome,
    TokenUsage,
    Tool,
    Verdict,
    replay,
    tool,
)
from replan.messages import Event, GateOpened, GateResolved, ToolCall
from replan.store import RunSummary, SQLiteStore, Store
from replan.supervisor._exits import lone_exit


class HeldStore(DelegatingStore):
    """Holds the first append (a run's submission) until released."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.entered = anyio.Event()
        self.release = anyio.Event()

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        if not self.entered.is_set():
            self.entered.set()
            await self.release.wait()
        await self.inner.append(run_id, events, summary)


async def finish_unfinished(store: Store) -> int:
    """Resume every unfinished run of ``store`` and check that it completes."""
    with anyio.fail_after(20):
        async with Supervisor(scripted(), store, resume=True) as sup:
            handles = sup.handles()
            for handle in handles:
                result = await handle.result()
                assert result.status is RunStatus.COMPLETED
    assert await store.list_runs(statuses=[RunStatus.RUNNING]) == []
    return len(handles)


async def ending_of(handle: RunHandle) -> str:
    """The run's final status, or why its result() is refused."""
    with anyio.fail_after(2):
        try:
            result = await handle.result()
        except SupervisorError as exc:
            return str(exc)
    return result.status.value


# Submitting while the supervisor stops ----------------------------------------


async def test_a_submit_after_stop_is_refused_and_the_exit_is_prompt() -> None:
    model = scripted()
    store = MemoryStore()
    with anyio.fail_after(10):  # a guard: the exit used to hang on asyncio
        async with Supervisor(model, store) as sup:
            sup.stop()
            with pytest.raises(SupervisorError, match="is stopping"):
                await sup.submit(spec(independent(1)))
            with pytest.raises(SupervisorError, match="is stopping"):
                await sup.resume("no-such-run")
    with pytest.raises(SupervisorError, match="has stopped"):
        await sup.submit(spec(independent(1)))
    with pytest.raises(SupervisorError, match="has stopped"):
        await sup.resume("no-such-run")
    with pytest.raises(SupervisorError, match="not serving: use `async with`"):
        await Supervisor(model, store).submit(spec(independent(1)))
    assert await store.list_runs() == []
    assert model.calls == []


async def test_a_submit_whose_journal_write_outlasts_the_exit_leaves_it_resumable() -> (
    None
):
    inner = MemoryStore()
    store = HeldStore(inner)
    refused: list[SupervisorError] = []

    async def client(sup: Supervisor) -> None:
        try:
            await sup.submit(spec(independent(2)))
        except SupervisorError as exc:
            refused.append(exc)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as app:
            async with Supervisor(scripted(), store) as sup:
                app.start_soon(client, sup)
                await store.entered.wait()
            store.release.set()  # the run reaches the journal after the exit

    # Refused, not a RuntimeError from a closed task group, and not driven.
    assert len(refused) == 1
    [row] = await inner.list_runs()
    assert row.status is RunStatus.RUNNING
    assert row.run_id in str(refused[0])
    with anyio.fail_after(2), pytest.raises(SupervisorError):
        await sup.get(row.run_id).result()
    assert await finish_unfinished(inner) == 1


@pytest.mark.parametrize("delay_ms", [0, 2, 5, 9])
async def test_submits_racing_the_exit_are_driven_or_refused_never_lost(
    delay_ms: int,
) -> None:
    store = MemoryStore()
    outcomes = {"accepted": 0, "refused": 0}

    async def client(sup: Supervisor) -> None:
        while True:
            try:
                await sup.submit(spec(independent(2)))
            except SupervisorError:
                outcomes["refused"] += 1
                return
            outcomes["accepted"] += 1
            await anyio.sleep(0.001)

    with anyio.fail_after(10):  # a guard: the exit used to hang on asyncio
        async with (
            anyio.create_task_group() as app,
            Supervisor(scripted(), store, workers={"executor": 8}) as sup,
        ):
            app.start_soon(client, sup)
            await anyio.sleep(delay_ms / 1000)

    assert outcomes["refused"] == 1
    for handle in sup.handles():
        with anyio.fail_after(2):
            try:
                result = await handle.result()
            except SupervisorError:
                continue
        assert result.status is RunStatus.COMPLETED
    rows = await store.list_runs(limit=10_000)
    assert len(rows) >= outcomes["accepted"]
    await finish_unfinished(store)


# Quiet cancels and exits ------------------------------------------------------


async def test_cancelling_runs_with_tasks_in_flight_is_quiet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    for _ in range(5):
        with anyio.fail_after(10):
            async with Supervisor(scripted()) as sup:
                handle = await sup.submit(spec(independent(3)))
                driver = sup._drivers[handle.run_id]
                await handle.cancel()
                result = await handle.result()
        assert result.status is RunStatus.CANCELLED
        assert driver._busy == 0  # what drain() waits on
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_leaving_the_supervisor_with_tasks_in_flight_is_quiet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    for attempt in range(10):
        with anyio.fail_after(10):
            async with Supervisor(
                scripted(latency_s=0.001), workers={"executor": 4}
            ) as sup:
                handles = [
                    await sup.submit(spec(independent(8), max_concurrency=4))
                    for _ in range(3)
                ]
                await anyio.sleep(attempt * 0.002)
        for handle in handles:
            ending = await ending_of(handle)
            assert ending == "completed" or ending.endswith(
                "the supervisor stopped before the run finished"
            )
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# Drain ------------------------------------------------------------------------


async def test_drain_before_the_supervisor_serves_does_nothing() -> None:
    sup = Supervisor(scripted())
    await sup.drain(0.1)
    with anyio.fail_after(10):
        async with sup:
            handle = await sup.submit(spec(independent(1)))
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED
    await sup.drain(0.1)  # stopped: nothing to do either


@pytest.mark.parametrize("grace_s", [float("nan"), "10", None, True, 10**400])
async def test_a_drain_with_no_grace_in_seconds_is_refused_before_it_starts(
    grace_s: object,
) -> None:
    async with Supervisor(scripted()) as sup:
        with pytest.raises(ConfigurationError) as caught:
            await sup.drain(grace_s)  # type: ignore[arg-type]
        assert caught.value.field == "grace_s"
        # Nothing was held: the supervisor serves on as before.
        with anyio.fail_after(10):
            handle = await sup.submit(spec(independent(2)))
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED


class Outbox:
    """A side-effect tool that counts its calls, and a model whose task t1
    emails while every other task's attempt takes ``slow_s``."""

    def __init__(self, slow_s: float = 0.0) -> None:
        self.sent = 0
        self.slow_s = slow_s

    def tool(self) -> Tool:
        @tool(side_effect=True)
        def send_email(to: str, idempotency_key: str) -> str:
            """Email someone."""
            self.sent += 1
            return "sent"

        return send_email

    def model(self) -> ScriptedModel:
        async def execute(request: ModelRequest) -> Any:
            if task_of(request).id != "t1":
                await anyio.sleep(self.slow_s)
                return TaskOutcome(success=True, summary="slow")
            return emails_first(request)

        return scripted(execute=execute)  # type: ignore[arg-type]


async def test_a_run_cancelled_during_a_drain_ends_cancelled() -> None:
    # Its call in flight, cancelled, leaves it idle at once: the drain must
    # not stop the supervisor before the run has journaled its end.
    asked = anyio.Event()

    async def milestone(request: ModelRequest) -> Verdict:
        asked.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    model = scripted(execute=with_finding, milestone=milestone)
    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(model, store) as sup:
            handle = await sup.submit(spec(chain(2, milestone_at=[1])))
            await asked.wait()
            async with anyio.create_task_group() as tg:
                tg.start_soon(sup.drain, 30.0)
                await anyio.sleep(0.05)
                await handle.cancel()
            result = await handle.result()
    assert result.status is RunStatus.CANCELLED
    [summary] = await store.list_runs()
    assert summary.status is RunStatus.CANCELLED


async def test_a_drain_its_caller_cancels_still_stops_the_supervisor() -> None:
    # The caller's own timeout cut drain() short: the run it held waited
    # for a stop that never came, and serve() went on forever.
    asked = anyio.Event()

    async def milestone(request: ModelRequest) -> Verdict:
        asked.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    store = MemoryStore()
    sup = Supervisor(scripted(execute=with_finding, milestone=milestone), store)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(sup.serve)
            handle = await sup.submit(spec(chain(2, milestone_at=[1])))
            await asked.wait()
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as draining:
                    draining.start_soon(sup.drain, 30.0)
                    await anyio.wait_all_tasks_blocked()
                    scope.cancel()
            # serve() ends on its own, as when the grace runs out.
    assert "did not finish" in await ending_of(handle)
    [summary] = await store.list_runs()
    assert summary.status is RunStatus.RUNNING  # left to resume


async def test_a_drain_does_not_wait_for_a_tool_call_waiting_for_a_person() -> None:
    outbox = Outbox()
    store = MemoryStore()
    async with Supervisor(outbox.model(), store, tools=[outbox.tool()]) as sup:
        handle = await sup.submit(spec(independent(1)))
        with anyio.fail_after(10):
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    break
        # The gate is journaled: the resumed run asks again. No one answers
        # while the daemon stops, so waiting for the grace is waiting in vain.
        with anyio.fail_after(5):
            await sup.drain(60)
    assert outbox.sent == 0
    [summary] = await store.list_runs()
    assert summary.run_id == handle.run_id
    assert summary.status is RunStatus.WAITING_FOR_HUMAN  # left to resume


async def test_a_tool_call_answered_during_a_drain_waits_for_the_resumed_run(
    tmp_path: Path,
) -> None:
    # t1's gate times out (approved by the policy) while the drain waits
    # for t2: the call starts no more now, and runs once after the resume.
    outbox = Outbox(slow_s=1.0)
    journal = tmp_path / "journal.db"
    policy = GatePolicy(gate_on=frozenset(), on_timeout="approve")
    run = spec(independent(2), gate_policy=policy, gate_timeout_s=0.2)
    async with (
        SQLiteStore(journal) as store,
        Supervisor(outbox.model(), store, tools=[outbox.tool()]) as sup,
    ):
        handle = await sup.submit(run)
        with anyio.fail_after(10):
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    break
            await sup.drain(60)
        events = await store.read(handle.run_id)
    assert outbox.sent == 0
    [answer] = [e for e in events if isinstance(e, GateResolved)]
    assert answer.resolution.decision == "approve"
    with anyio.fail_after(20):
        async with (
            SQLiteStore(journal) as store,
            Supervisor(
                outbox.model(), store, tools=[outbox.tool()], resume=True
            ) as sup,
        ):
            result = await sup.get(handle.run_id).result()
            events = await store.read(handle.run_id)
    assert result.status is RunStatus.COMPLETED
    assert outbox.sent == 1
    assert sum(isinstance(e, GateOpened) for e in events) == 1  # not asked again


async def _approve(
    sup: Supervisor, gate_id: str, refused: list[str] | None = None
) -> None:
    try:
        await sup.gates.resolve(gate_id, {"decision": "approve"})
    except GateError:  # the run may end first
        if refused is not None:
            refused.append(gate_id)


async def test_an_approval_answered_as_the_run_is_cancelled_comes_before_its_end() -> (
    None
):
    # The tool call's approval is journaled on an executor worker, which the
    # cancel reaches only at its next checkpoint: on trio it appended after
    # run_finished, and gate_resolved set the cancelled run 'running' again.
    store = MemoryStore()
    model = ScriptedModel(emails_first)
    async with Supervisor(model, store, tools=[send_email]) as sup:
        for trial in range(16):
            handle = await sup.submit(spec(independent(1)))
            with anyio.fail_after(10):
                async for event in handle.events():
                    if isinstance(event, GateOpened):
                        gate_id = event.request.gate_id
                        break
                refused: list[str] = []
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_approve, sup, gate_id, refused)
                    for _ in range(trial % 4):
                        await anyio.lowlevel.checkpoint()
                    tg.start_soon(handle.cancel)
                result = await handle.result()
            events = await store.read(handle.run_id)
            assert events[-1].kind == "run_finished", [e.kind for e in events[-3:]]
            # An approval is journaled, or refused with GateError: never lost.
            journaled = [e for e in events if e.kind == "gate_resolved"]
            assert len(journaled) + len(refused) == 1
            assert result.status is RunStatus.CANCELLED
            assert (await sup.replay(handle.run_id)) == result


USAGE = TokenUsage(input_tokens=10, output_tokens=4, calls=1)


class SlowReask:
    """A reviewer whose first answer is malformed; the re-ask waits until
    released (or forever), so that a drain's grace or a cancel cuts it."""

    def __init__(self) -> None:
        self.reasked = anyio.Event()
        self.release = anyio.Event()

    def model(self) -> ScriptedModel:
        async def milestone(request: ModelRequest) -> Any:
            if "answer_problem" not in request.context:
                return "not a verdict"
            self.reasked.set()
            await self.release.wait()
            return Verdict(decision="continue")

        return scripted(execute=with_finding, milestone=milestone, usage=USAGE)


async def test_a_drain_whose_grace_ends_during_a_re_ask_journals_the_first_answer(
    tmp_path: Path,
) -> None:
    reviewer = SlowReask()
    first = reviewer.model()
    async with SQLiteStore(tmp_path / "runs.db") as store:
        with anyio.fail_after(10):
            async with Supervisor(first, store) as sup:
                handle = await sup.submit(spec(chain(2), milestone_every=1))
                await reviewer.reasked.wait()
                await sup.drain(0.05)
            journaled = await store.read(handle.run_id)
            [summary] = await store.list_runs()
            assert summary.status is RunStatus.RUNNING  # left to resume
            # The malformed answer cost tokens: journaled though no reply came.
            usage = [e for e in journaled if e.kind == "usage_recorded"]
            assert [(e.role, e.purpose, e.usage) for e in usage] == [  # type: ignore[attr-defined]
                ("reviewer", "milestone", USAGE)
            ]
            second = scripted(execute=with_finding, usage=USAGE)
            with anyio.fail_after(10):
                async with Supervisor(second, store, resume=True) as sup:
                    result = await sup.get(handle.run_id).result()
    assert result.status is RunStatus.COMPLETED
    # Every answered call counts once; the re-ask the stop cut gave none.
    assert result.usage.total.calls == len(first.calls) - 1 + len(second.calls)
    assert result.usage.by_role["reviewer"].calls == 1 + 2


async def test_a_run_cancelled_during_a_re_ask_keeps_the_first_answers_tokens() -> None:
    reviewer = SlowReask()
    model = reviewer.model()
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(spec(chain(2), milestone_every=1))
            await reviewer.reasked.wait()
            await handle.cancel()
            result = await handle.result()
            assert await sup.replay(handle.run_id) == result
    assert result.status is RunStatus.CANCELLED
    assert result.usage.by_role["reviewer"] == USAGE
    assert result.usage.total.calls == len(model.calls) - 1


async def test_a_review_answered_as_the_run_is_cancelled_is_in_its_usage() -> None:
    # The cancel reached the run just before its reviewer's model call
    # answered: the run journaled its end while the answer was on its way,
    # and the answer's tokens were in no journal.
    reviewing, answer = anyio.Event(), anyio.Event()

    async def milestone(request: ModelRequest) -> Verdict:
        reviewing.set()
        await answer.wait()
        return Verdict(decision="continue")

    model = scripted(execute=with_finding, milestone=milestone, usage=USAGE)
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(spec(chain(2), milestone_every=1))
            await reviewing.wait()
            async with anyio.create_task_group() as tg:
                tg.start_soon(handle.cancel)
                await anyio.lowlevel.checkpoint()  # the cancel is under way
                answer.set()  # and the answer comes
            result = await handle.result()
            assert await sup.replay(handle.run_id) == result
    assert result.status is RunStatus.CANCELLED
    assert result.usage.by_role["reviewer"] == USAGE
    assert result.usage.total.calls == len(model.calls)


async def test_a_re_ask_that_answers_counts_both_answers_once() -> None:
    reviewer = SlowReask()
    reviewer.release.set()
    model = reviewer.model()
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            result = await (
                await sup.submit(spec(chain(2), milestone_every=1))
            ).result()
    assert result.status is RunStatus.COMPLETED
    assert result.usage.total.calls == len(model.calls)


async def test_a_drain_whose_grace_ends_between_candidates_journals_the_first() -> None:
    asked = anyio.Event()
    proposed = 0

    async def revise(request: ModelRequest) -> Any:
        nonlocal proposed
        proposed += 1
        if proposed > 1:  # the second candidate never comes
            asked.set()
            await anyio.sleep_forever()
        return fresh_tasks(2)

    model = scripted(
        execute=with_finding,
        milestone=lambda r: replan_verdict(),
        replan=revise,
        usage=USAGE,
    )
    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(model, store) as sup:
            handle = await sup.submit(
                spec(chain(3, milestone_at=[1]), replan_candidates=2)
            )
            await asked.wait()
            await sup.drain(0.05)
    journaled = await store.read(handle.run_id)
    usage = [e for e in journaled if e.kind == "usage_recorded"]
    assert ("planner", "replan", USAGE) in [
        (e.role, e.purpose, e.usage)  # type: ignore[attr-defined]
        for e in usage
    ]
    # Every answered call is in the journal once; the one cut short is not.
    assert replay(journaled).usage.total.calls == len(model.calls) - 1


async def test_a_drain_whose_grace_ends_during_a_tool_journals_the_attempts_calls(
    tmp_path: Path,
) -> None:
    searching = anyio.Event()

    @tool
    async def slow_search(query: str) -> str:
        """Search, slowly."""
        searching.set()
        await anyio.sleep_forever()
        return "found"

    def search_first(request: ModelRequest) -> Any:
        if request.purpose == "synthesize":
            return Synthesis(output="done")
        if not request.transcript:
            call = ToolCall(id="c1", name="slow_search", arguments='{"query": "a"}')
            return ModelResponse(tool_calls=[call], usage=USAGE)
        return TaskOutcome(success=True, summary="found")

    first = ScriptedModel(search_first, usage=USAGE)
    async with SQLiteStore(tmp_path / "runs.db") as store:
        with anyio.fail_after(10):
            async with Supervisor(first, store, tools=[slow_search]) as sup:
                handle = await sup.submit(spec(independent(1)))
                await searching.wait()
                await sup.drain(0.05)
        journaled = await store.read(handle.run_id)
        # The step the model answered before the tool: journaled as it stops.
        assert replay(journaled).usage.by_role["executor"] == USAGE

        @tool(name="slow_search")
        async def quick_search(query: str) -> str:
            """Search."""
            return "found"

        second = ScriptedModel(search_first, usage=USAGE)
        with anyio.fail_after(10):
            async with Supervisor(second, store, tools=[quick_search]) as sup:
                result = await (await sup.resume(handle.run_id)).result()
    assert result.status is RunStatus.COMPLETED
    assert result.usage.total.calls == len(first.calls) + len(second.calls)


async def test_an_attempt_timed_out_while_a_drain_holds_the_run_keeps_its_tokens(
    tmp_path: Path,
) -> None:
    # The drain held the run (it would have asked for the review of the
    # first task's milestone) when task_timeout_s cut the second task's
    # attempt short, in its tool. The
    # run never took that report: the stop secured what it held in the
    # effect ledger, which keeps no timed-out attempt, and the tokens of the
    # step the model had answered were in no journal.
    searching = anyio.Event()
    release = anyio.Event()

    @tool
    async def slow_search(query: str) -> str:
        """Search, slowly."""
        searching.set()
        await anyio.sleep_forever()
        return "found"

    async def answer(request: ModelRequest) -> Any:
        if request.purpose == "synthesize":
            return Synthesis(output="done")
        if request.role == "reviewer":
            return Verdict(decision="continue")
        key = task_of(request).key
        if key == "s1":
            await release.wait()
            # A finding: the reviewer model is asked about it.
            return TaskOutcome(success=True, summary="s1 done", findings=["new"])
        if key == "s2" and not request.transcript:
            call = ToolCall(id="c1", name="slow_search", arguments='{"query": "a"}')
            return ModelResponse(tool_calls=[call], usage=USAGE)
        return TaskOutcome(success=True, summary=f"{key} done")

    first = ScriptedModel(answer, usage=USAGE)
    run_spec = spec(
        independent(3), max_concurrency=2, task_timeout_s=0.2, milestone_every=1
    )
    async with SQLiteStore(tmp_path / "runs.db") as store:
        with anyio.fail_after(10):
            async with (
                Supervisor(first, store, tools=[slow_search]) as sup,
                anyio.create_task_group() as tg,
            ):
                handle = await sup.submit(run_spec)
                await searching.wait()
                tg.start_soon(sup.drain, 1.0)
                await anyio.sleep(0.01)
                release.set()  # s1 finishes; the drain holds its review
        journaled = replay(await store.read(handle.run_id))
        assert journaled.status is RunStatus.RUNNING  # left to resume
        assert journaled.usage.total.calls == len(first.calls) == 2

        @tool(name="slow_search")
        async def quick_search(query: str) -> str:
            """Search."""
            return "found"

        second = ScriptedModel(answer, usage=USAGE)
        with anyio.fail_after(10):
            async with Supervisor(second, store, tools=[quick_search]) as sup:
                result = await (await sup.resume(handle.run_id)).result()
    assert result.status is RunStatus.COMPLETED
    assert result.usage.total.calls == len(first.calls) + len(second.calls)


async def test_revisions_answered_before_a_stop_are_in_the_runs_usage() -> None:
    # The run had taken both revisions (replan_candidates=2) and staged
    # their usage for its next append; the stop came while the reviewer
    # critiqued them, and the staged usage was dropped with the revisions.
    critiquing = anyio.Event()

    async def stuck_critique(request: ModelRequest) -> Any:
        critiquing.set()
        await anyio.sleep_forever()

    first = scripted(
        execute=with_finding,
        milestone=lambda r: replan_verdict(),
        replan=lambda r: fresh_tasks(1),
        critiques=stuck_critique,
        usage=USAGE,
    )
    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(first, store) as sup:
            handle = await sup.submit(
                spec(chain(2), milestone_every=1, replan_candidates=2)
            )
            await critiquing.wait()
            sup.stop()
    journaled = replay(await store.read(handle.run_id))
    assert journaled.status is RunStatus.RUNNING  # left to resume
    assert journaled.usage.by_role["planner"].calls == 2
    answered = len(first.calls) - 1  # the critique never answered
    assert journaled.usage.total.calls == answered
    second = scripted(
        execute=with_finding,
        milestone=lambda r: replan_verdict(),
        replan=lambda r: fresh_tasks(1),
        usage=USAGE,
    )
    with anyio.fail_after(10):
        async with Supervisor(second, store) as sup:
            result = await (await sup.resume(handle.run_id)).result()
    assert result.status is RunStatus.COMPLETED
    assert result.usage.total.calls == answered + len(second.calls)


async def test_an_attempt_that_succeeds_as_the_supervisor_stops_is_not_run_again() -> (
    None
):
    # The stop abandoned the attempt's handling, which answered after all
    # (its last wait was over: the cancel found no checkpoint left): the
    # success was dropped, and the resumed run ran the task again.
    entered, release = anyio.Event(), anyio.Event()

    async def execute(request: ModelRequest) -> TaskOutcome:
        entered.set()
        with anyio.CancelScope(shield=True):
            await release.wait()
        return TaskOutcome(success=True, summary="done before the stop")

    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(scripted(execute=execute), store) as sup:
            handle = await sup.submit(spec(independent(1)))
            await entered.wait()
            sup.stop()
            await anyio.wait_all_tasks_blocked()  # the run has let go of it
            release.set()
    again = scripted()
    with anyio.fail_after(10):
        async with Supervisor(again, store) as sup:
            result = await (await sup.resume(handle.run_id)).result()
    assert result.status is RunStatus.COMPLETED
    assert result.tasks[0].result is not None
    assert result.tasks[0].result.summary == "done before the stop"
    assert again.calls_for("executor", "execute") == []


@pytest.mark.parametrize("purpose", ["milestone", "replan"])
async def test_an_answer_that_comes_as_the_supervisor_stops_is_in_the_runs_usage(
    purpose: str,
) -> None:
    # The stop cancelled the run as the reviewer's (or planner's) reply came:
    # the reply was dropped with its calls, and the answer's tokens, which
    # the model had handed out, were in no journal.
    stopping: list[Supervisor] = []
    answered = anyio.Event()

    def stop_as_it_answers(answer: Any) -> Any:
        def respond(request: ModelRequest) -> Any:
            if not answered.is_set():
                answered.set()
                stopping[0].stop()
            return answer

        return respond

    verdict = replan_verdict() if purpose == "replan" else Verdict(decision="continue")
    first = scripted(
        execute=with_finding,
        milestone=stop_as_it_answers(verdict),
        replan=stop_as_it_answers(fresh_tasks(1)),
        usage=USAGE,
    )
    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(first, store) as sup:
            stopping.append(sup)
            handle = await sup.submit(spec(chain(2), milestone_every=1))
            await answered.wait()
    journaled = replay(await store.read(handle.run_id))
    assert journaled.status is RunStatus.RUNNING  # left to resume
    assert journaled.usage.total.calls == len(first.calls)
    second = scripted(execute=with_finding, milestone=lambda r: verdict, usage=USAGE)
    with anyio.fail_after(10):
        async with Supervisor(second, store) as sup:
            result = await (await sup.resume(handle.run_id)).result()
    assert result.status is RunStatus.COMPLETED
    assert result.usage.total.calls == len(first.calls) + len(second.calls)


class Interrupted(BaseException):
    """What Ctrl-C is on trio when it lands in running code (a
    ``KeyboardInterrupt``): it goes on out of a task function, and of the
    supervisor. (asyncio lets no KeyboardInterrupt through a task group: it
    stops the event loop.)"""


@pytest.mark.parametrize("role", ["executor", "planner"])
async def test_an_interrupt_out_of_a_handler_leaves_the_run_to_resume(
    role: str,
) -> None:
    # The interrupt stops the roles with the supervisor; the run heard of
    # its role's stop before the supervisor's cancellation reached it, and
    # was journaled `failed` ("the executor role stopped"), lost to resume.
    def interrupt_once(request: ModelRequest) -> Any:
        if not interrupted:
            interrupted.append(request.purpose)
            raise Interrupted
        return fresh_tasks(2)

    async def runner(task: Any, ctx: Any) -> TaskOutcome:
        if not interrupted:
            interrupted.append("execute")
            raise Interrupted
        return TaskOutcome(success=True, summary="done")

    interrupted: list[str] = []
    store = MemoryStore()
    model = scripted(
        plan=interrupt_once if role == "planner" else lambda r: fresh_tasks(2)
    )

    async def until_interrupted() -> None:
        async with Supervisor(model, store, task_runner=runner) as sup:
            handle = await sup.submit(RunSpec(goal="g"))
            await handle.result()

    with pytest.raises(Interrupted), anyio.fail_after(10):
        await until_interrupted()
    assert interrupted
    (summary,) = await store.list_runs()
    assert summary.status is RunStatus.RUNNING
    with anyio.fail_after(10):
        async with Supervisor(model, store, task_runner=runner, resume=True) as sup:
            (handle,) = sup.handles()
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED


def interrupts(anyio_backend: str) -> list[Any]:
    """What an interrupt may be: a ``KeyboardInterrupt`` or a ``SystemExit``
    on trio; on asyncio either stops the event loop, and the test with it."""
    real = [KeyboardInterrupt, SystemExit] if anyio_backend == "trio" else []
    return [Interrupted, *real]


def interrupting(exc: type[BaseException]) -> Any:
    """An executor whose every model call is interrupted: several runs see
    it at once, as the same Ctrl-C."""

    def execute(request: ModelRequest) -> Any:
        raise exc

    return scripted(execute=execute)


async def serve_two_runs(sup: Supervisor) -> None:
    async with sup:
        await sup.submit(spec(independent(2)))
        await sup.submit(spec(independent(2)))
        await anyio.sleep_forever()


async def cancellation() -> BaseException:
    """A cancellation exception, as a cancelled task lets it out."""
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class() as exc:
            return exc
    raise AssertionError("not cancelled")


async def test_an_interrupt_goes_out_of_the_supervisor_as_itself(
    anyio_backend: str,
) -> None:
    # It came out wrapped in a BaseExceptionGroup per task group it crossed
    # (three deep), which `except KeyboardInterrupt:` does not catch.
    for exc in interrupts(anyio_backend):
        store = MemoryStore()
        with pytest.raises(exc), anyio.fail_after(10):
            await serve_two_runs(Supervisor(interrupting(exc), store))
        runs = await store.list_runs()
        assert [s.status for s in runs] == [RunStatus.RUNNING] * 2
        with anyio.fail_after(10):
            async with Supervisor(scripted(), store, resume=True) as sup:
                results = [await handle.result() for handle in sup.handles()]
        assert [r.status for r in results] == [RunStatus.COMPLETED] * 2


async def test_an_interrupt_goes_out_of_serve_as_itself(anyio_backend: str) -> None:
    for exc in interrupts(anyio_backend):
        store = MemoryStore()
        sup = Supervisor(interrupting(exc), store)
        # Only the caller's own task group wraps it, as any task's error.
        with pytest.RaisesGroup(exc), anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                await tg.start(sup.serve)
                await sup.submit(spec(independent(2)))
                await anyio.sleep_forever()
        (summary,) = await store.list_runs()
        assert summary.status is RunStatus.RUNNING


async def test_an_interrupt_beside_an_error_is_let_out_in_its_group() -> None:
    error = ValueError("a run's own failure")
    group = BaseExceptionGroup("g", [BaseExceptionGroup("h", [Interrupted()]), error])
    assert lone_exit(group) is None


async def test_a_group_of_interrupts_and_cancellations_is_let_out_as_one() -> None:
    first, second = Interrupted(), Interrupted()
    inner = BaseExceptionGroup("h", [first, await cancellation()])
    group = BaseExceptionGroup("g", [await cancellation(), inner, second])
    assert lone_exit(group) is first
    only = await cancellation()
    assert lone_exit(BaseExceptionGroup("g", [only, await cancellation()])) is only


async def test_an_interrupt_out_of_the_supervisor_keeps_the_error_of_its_body(
    anyio_backend: str,
) -> None:
    # The body's error was dropped: the interrupt came out `from None`, and
    # the traceback never showed the cleanup that failed as it was cancelled.
    async def body_failing_as_cancelled(exc: type[BaseException]) -> None:
        async with Supervisor(interrupting(exc), MemoryStore()) as sup:
            await sup.submit(spec(independent(2)))
            try:
                await anyio.sleep_forever()
            finally:
                raise ValueError("the body's cleanup failed")

    for exc in interrupts(anyio_backend):
        with pytest.raises(exc) as raised, anyio.fail_after(10):
            await body_failing_as_cancelled(exc)
        context = raised.value.__context__
        assert isinstance(context, ValueError), context
        assert str(context) == "the body's cleanup failed"
        assert not raised.value.__suppress_context__


async def test_an_interrupt_out_of_a_body_that_raised_nothing_shows_nothing_else(
    anyio_backend: str,
) -> None:
    # The groups and cancellations it came through are no part of its story.
    import traceback

    for exc in interrupts(anyio_backend):
        with pytest.raises(exc) as raised, anyio.fail_after(10):
            await serve_two_runs(Supervisor(interrupting(exc), MemoryStore()))
        shown = "".join(traceback.format_exception(raised.value))
        assert "During handling" not in shown
        assert "direct cause" not in shown
