"""Resuming runs from the journal: after a stop, a drain, or a crash."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from scripts import (
    GOAL,
    DelegatingStore,
    always_replan,
    chain,
    clean,
    executed_ids,
    same_size_chain,
    scripted,
    spec,
    task_of,
    with_finding,
)

from replan import (
    ConfigurationError,
    GateResolution,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    PlanProposal,
    ReplanOutcome,
    RunSpec,
    RunStatus,
    Supervisor,
    SupervisorError,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    TokenUsage,
    Trigger,
    UnknownRunError,
    Verdict,
    tool,
)
from replan._demo import demo_model, demo_spec
from replan.messages import (
    Event,
    GateOpened,
    GateResolved,
    MilestoneReviewed,
    PlanCreated,
    RunSubmitted,
    TaskFinished,
    TaskInterrupted,
    TaskStarted,
    ToolCall,
)
from replan.store import EffectRecord, RunSummary, SQLiteStore, Store
from replan.supervisor import apply, build_version, replay
from replan.supervisor._run import summary_of

Answer = Callable[[ModelRequest], Any]


class LedgerWatch(DelegatingStore):
    """A store that signals each effect it records (and is an effect ledger)."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.ledger = inner
        self.recorded: list[EffectRecord] = []
        self.changed = anyio.Event()

    async def record_effect(self, run_id: str, record: EffectRecord) -> None:
        await self.ledger.record_effect(run_id, record)
        self.recorded.append(record)
        self.changed.set()
        self.changed = anyio.Event()

    async def read_effects(self, run_id: str) -> list[EffectRecord]:
        return await self.ledger.read_effects(run_id)


def blocking_at(task_key: str, reached: anyio.Event, answer: Answer = clean) -> Answer:
    """An executor answer that never returns for ``task_key``."""

    async def execute(request: ModelRequest) -> Any:
        if task_of(request).key == task_key:
            reached.set()
            await anyio.sleep_forever()
        return answer(request)

    return execute


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


async def test_a_run_stopped_during_a_task_resumes_and_never_reruns_completed_tasks(
    tmp_path: Any,
) -> None:
    reached = anyio.Event()
    first = scripted(execute=blocking_at("s3", reached))
    with anyio.fail_after(10):
        async with SQLiteStore(tmp_path / "j.db") as store:
            async with Supervisor(first, store) as sup:
                handle = await sup.submit(spec(chain(4), milestone_every=100))
                await reached.wait()
            run_id = handle.run_id
        assert executed_ids(first) == ["t1", "t2", "t3"]

        second = scripted()
        async with (
            SQLiteStore(tmp_path / "j.db") as store,
            Supervisor(second, store, resume=True) as sup,
        ):
            result = await sup.get(run_id).result()
            events = await store.read(run_id)
            assert await sup.replay(run_id) == result
    assert result.status is RunStatus.COMPLETED
    assert executed_ids(second) == ["t3", "t4"]
    assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 4
    assert [t.attempts for t in result.tasks] == [1, 1, 1, 1]
    interrupted = [e for e in events if isinstance(e, TaskInterrupted)]
    assert [e.task_id for e in interrupted] == ["t3"]
    assert kinds(events).count("plan_created") == 1
    assert result.task_executions == 5  # attempts started, the cut-short one too


async def test_an_attempt_finished_but_not_journaled_is_taken_from_the_ledger() -> None:
    # t1 is a milestone with a finding: the reviewer is asked while t2 runs.
    # t2 returns during the review, so its outcome waits in the driver's inbox
    # (not journaled) when the supervisor stops; only the ledger has it.
    reviewing = anyio.Event()

    async def slow_review(request: ModelRequest) -> Verdict:
        reviewing.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def execute(request: ModelRequest) -> TaskOutcome:
        task = task_of(request)
        if task.key == "s2":
            await reviewing.wait()
            return TaskOutcome(success=True, summary="s2 done before the stop")
        return with_finding(request)

    plan = [
        TaskDraft(key="s1", description="step 1", milestone=True),
        TaskDraft(key="s2", description="step 2"),
        TaskDraft(key="s3", description="step 3", depends_on=["s1", "s2"]),
    ]
    inner = MemoryStore()
    store = LedgerWatch(inner)
    first = scripted(execute=execute, milestone=slow_review)
    with anyio.fail_after(10):
        async with Supervisor(first, store) as sup:
            handle = await sup.submit(spec(plan, milestone_every=100))
            while not any(r.task_id == "t2" for r in store.recorded):
                await store.changed.wait()
        run_id = handle.run_id
        before = await inner.read(run_id)
        assert not any(
            isinstance(e, TaskFinished) and e.task_id == "t2" for e in before
        )

        second = scripted()
        async with Supervisor(second, store, resume=True) as sup:
            result = await sup.get(run_id).result()
            events = await inner.read(run_id)
    assert result.status is RunStatus.COMPLETED
    assert sorted(executed_ids(first)) == ["t1", "t2"]
    assert executed_ids(second) == ["t3"]
    t2 = next(t for t in result.tasks if t.id == "t2")
    assert t2.result is not None
    assert t2.result.summary == "s2 done before the stop"
    assert not any(isinstance(e, TaskInterrupted) for e in events)
    # The interrupted review is held again after the restart.
    assert len(second.calls_for("reviewer", "milestone")) >= 1
    assert next(e.index for e in events if isinstance(e, MilestoneReviewed)) == 1


async def test_a_run_resumed_past_its_deadline_keeps_what_its_ledger_holds() -> None:
    # t2 returns during t1's review (only the ledger has its finish) while
    # t3 waits at its tool call's gate; the deadline passes while nobody
    # drives the run. The resumed run ends as it withdraws the gate: t2's
    # finish is journaled with its end all the same, its call in the usage.
    reviewing = anyio.Event()

    async def slow_review(request: ModelRequest) -> Verdict:
        reviewing.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    @tool(side_effect=True)
    def send_email(to: str, idempotency_key: str) -> str:
        """Email someone."""
        return "sent"

    async def execute(request: ModelRequest) -> Any:
        key = task_of(request).key
        if key == "s2":
            await reviewing.wait()
            return TaskOutcome(success=True, summary="s2 done before the stop")
        if key == "s3":
            call = ToolCall(id="c1", name="send_email", arguments='{"to": "ana"}')
            return ModelResponse(tool_calls=[call])
        return with_finding(request)

    plan = [
        TaskDraft(key="s1", description="step 1", milestone=True),
        TaskDraft(key="s2", description="step 2"),
        TaskDraft(key="s3", description="step 3"),
        TaskDraft(key="s4", description="step 4", depends_on=["s1", "s2", "s3"]),
    ]
    inner = MemoryStore()
    store = LedgerWatch(inner)
    first = scripted(execute=execute, milestone=slow_review)
    with anyio.fail_after(10):
        async with Supervisor(first, store, tools=[send_email]) as sup:
            handle = await sup.submit(spec(plan, milestone_every=100, deadline_s=1.0))
            async for event in handle.events():
                if isinstance(event, GateOpened) and event.request.tool_call:
                    break
            while not any(r.task_id == "t2" for r in store.recorded):
                await store.changed.wait()
        run_id = handle.run_id
        await anyio.sleep(1.0)  # the deadline passes

        second = scripted()
        async with Supervisor(second, store, tools=[send_email], resume=True) as sup:
            result = await sup.get(run_id).result()
    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason == "deadline_s: 1s passed"
    assert second.calls == []
    t2 = next(t for t in result.tasks if t.id == "t2")
    assert t2.status is TaskStatus.COMPLETED
    assert t2.result is not None
    assert t2.result.summary == "s2 done before the stop"
    # t1's and t2's executions are the run's; so is t3's call, cut short.
    assert result.usage.by_role["executor"].calls == 3
    assert result == replay(await inner.read(run_id)).result()


@pytest.mark.parametrize("decision", ["approve", "reject"])
async def test_an_open_replan_gate_survives_a_restart_and_can_be_resolved(
    decision: str, tmp_path: Any
) -> None:
    with anyio.fail_after(10):
        async with SQLiteStore(tmp_path / "j.db") as store:
            async with Supervisor(demo_model(), store) as sup:
                handle = await sup.submit(demo_spec())
                async for event in handle.events():
                    if isinstance(event, GateOpened):
                        gate = event.request
                        break
            run_id = handle.run_id

        second = demo_model()
        async with (
            SQLiteStore(tmp_path / "j.db") as store,
            Supervisor(second, store, resume=True) as sup,
        ):
            assert [g.gate_id for g in sup.gates.pending()] == [gate.gate_id]
            await sup.gates.resolve(
                gate.gate_id, GateResolution(decision=decision, by="carol")
            )
            result = await sup.get(run_id).result()
            assert await sup.replay(run_id) == result
    assert result.status is RunStatus.COMPLETED
    # The proposal came from the journal: the planner was not asked again.
    assert second.calls_for("planner", "replan") == []
    assert second.calls_for("planner", "plan") == []
    (record,) = result.replans
    if decision == "approve":
        assert record.outcome is ReplanOutcome.APPLIED
        assert result.versions[-1].approved_by == "carol"
        assert result.versions[-1].added == gate.proposal.added  # type: ignore[union-attr]
    else:
        assert record.outcome is ReplanOutcome.REJECTED_BY_HUMAN
        assert len(result.versions) == 1


async def test_a_gate_answered_just_before_the_stop_is_acted_on_after_it() -> None:
    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(demo_model(), store) as sup:
            handle = await sup.submit(demo_spec())
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    gate_id = event.request.gate_id
                    break
        run_id = handle.run_id
        # Journal the answer by hand, as if the stop came right after it.
        events = await store.read(run_id)
        state = replay(events)
        answered = GateResolved(
            seq=state.seq + 1,
            at=state.updated_at,
            gate_id=gate_id,
            resolution=GateResolution(decision="approve", by="dave"),
        )
        await store.append(run_id, [answered], summary_of(replay([*events, answered])))

        async with Supervisor(demo_model(), store, resume=True) as sup:
            assert sup.gates.pending() == []
            result = await sup.get(run_id).result()
    assert result.status is RunStatus.COMPLETED
    assert result.replans[0].outcome is ReplanOutcome.APPLIED
    assert result.versions[-1].approved_by == "dave"


async def test_a_replan_cut_short_after_the_verdict_is_carried_out_on_resume() -> None:
    planning = anyio.Event()

    async def stuck_planner(request: ModelRequest) -> PlanProposal:
        planning.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    def contradiction(request: ModelRequest) -> Verdict:
        if request.context["milestone_index"] == 1:
            return Verdict(
                decision="replan",
                trigger=Trigger.CONTRADICTION,
                rationale="t1 contradicts the rest",
            )
        return Verdict(decision="continue")

    run_spec = spec(chain(3, milestone_at=[1]), milestone_every=100)
    store = MemoryStore()
    first = scripted(
        execute=with_finding, milestone=contradiction, replan=stuck_planner
    )
    with anyio.fail_after(10):
        async with Supervisor(first, store) as sup:
            handle = await sup.submit(run_spec)
            await planning.wait()
        run_id = handle.run_id
        second = scripted(execute=with_finding, milestone=contradiction)
        async with Supervisor(second, store, resume=True) as sup:
            result = await sup.get(run_id).result()
    assert result.status is RunStatus.COMPLETED
    assert [r.outcome for r in result.replans] == [ReplanOutcome.APPLIED]
    assert len(second.calls_for("planner", "replan")) == 1
    # The verdict was journaled before the stop: not asked for again.
    assert [c.context["milestone_index"] for c in second.calls_for("reviewer")] != [1]
    assert executed_ids(second)[0] != "t1"


async def test_an_approval_gate_survives_a_restart() -> None:
    run_spec = RunSpec(
        goal=GOAL,
        tasks=[
            TaskDraft(
                key="send", description="email the report", requires_approval=True
            )
        ],
    )
    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(scripted(), store) as sup:
            handle = await sup.submit(run_spec)
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    gate_id = event.request.gate_id
                    break
        second = scripted()
        async with Supervisor(second, store, resume=True) as sup:
            (pending,) = sup.gates.pending()
            assert pending.gate_id == gate_id
            assert pending.task_id == "t1"
            await sup.gates.resolve(gate_id, GateResolution(decision="approve"))
            result = await sup.get(handle.run_id).result()
    assert result.status is RunStatus.COMPLETED
    assert executed_ids(second) == ["t1"]


async def test_a_tool_calls_gate_from_before_a_stop_is_withdrawn_not_waited_for() -> (
    None
):
    # The attempt that asked was cut short; the attempt run again asks again.
    sent: list[str] = []

    @tool(side_effect=True)
    def send_email(to: str, idempotency_key: str) -> str:
        """Email someone."""
        sent.append(idempotency_key)
        return "sent"

    def execute(request: ModelRequest) -> Any:
        if not request.transcript:
            call = ToolCall(id="c1", name="send_email", arguments='{"to": "ana"}')
            return ModelResponse(tool_calls=[call])
        return TaskOutcome(success=True, summary="emailed")

    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(
            scripted(execute=execute), store, tools=[send_email]
        ) as sup:
            handle = await sup.submit(spec(chain(1)))
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    old = event.request.gate_id
                    break
        async with Supervisor(
            scripted(execute=execute), store, tools=[send_email], resume=True
        ) as sup:
            assert sup.gates.pending() == []  # the old gate is not listed again
            run = sup.get(handle.run_id)
            async for event in run.events():
                if isinstance(event, GateOpened) and event.request.gate_id != old:
                    break
            [new] = sup.gates.pending()
            assert new.gate_id != old
            assert new.tool_call is not None
            await sup.gates.resolve(new.gate_id, {"decision": "approve", "by": "ana"})
            result = await run.result()
            events = await store.read(handle.run_id)

    assert result.status is RunStatus.COMPLETED
    assert result.tasks[0].status is TaskStatus.COMPLETED
    assert sent == [f"{handle.run_id}:t1:s1c0"]
    withdrawn = [e for e in events if isinstance(e, GateResolved) and e.gate_id == old]
    assert [(e.resolution.decision, e.resolution.by) for e in withdrawn] == [
        ("reject", "supervisor")
    ]
    assert replay(events).result() == result


async def test_drain_lets_the_task_in_flight_finish_and_starts_nothing_new() -> None:
    running = anyio.Event()
    release = anyio.Event()

    async def execute(request: ModelRequest) -> TaskOutcome:
        running.set()
        await release.wait()
        return clean(request)

    store: Store = MemoryStore()
    first = scripted(execute=execute)
    with anyio.fail_after(10):
        async with Supervisor(first, store) as sup:
            handle = await sup.submit(spec(chain(3), milestone_every=100))
            await running.wait()
            async with anyio.create_task_group() as tg:
                tg.start_soon(sup.drain, 30.0)
                await anyio.sleep(0.05)
                with pytest.raises(SupervisorError):
                    await sup.submit(spec(chain(1)))
                with pytest.raises(SupervisorError, match="is stopping"):
                    await sup.resume(handle.run_id)
                release.set()
        assert executed_ids(first) == ["t1"]
        second = scripted()
        async with Supervisor(second, store, resume=True) as sup:
            result = await sup.get(handle.run_id).result()
    assert result.status is RunStatus.COMPLETED
    assert executed_ids(second) == ["t2", "t3"]


async def test_a_drain_journals_the_tokens_of_an_answer_the_run_then_holds() -> None:
    # The revision is taken, then the run holds before the drift check: the
    # resumed run asks the planner again, and both revisions were paid for.
    asked = anyio.Event()
    release = anyio.Event()

    async def replan(request: ModelRequest) -> PlanProposal:
        asked.set()
        await release.wait()
        return same_size_chain(request)

    store: Store = MemoryStore()
    first = scripted(execute=with_finding, milestone=always_replan, replan=replan)
    with anyio.fail_after(10):
        async with Supervisor(first, store) as sup:
            handle = await sup.submit(spec(chain(3, milestone_at=[1]), max_replans=1))
            await asked.wait()
            async with anyio.create_task_group() as tg:
                tg.start_soon(sup.drain, 30.0)
                await anyio.sleep(0.05)
                release.set()
        assert first.calls_for("ranker") == []  # held before it
        journaled = await store.read(handle.run_id)
        second = scripted(execute=with_finding, milestone=always_replan)
        async with Supervisor(second, store, resume=True) as sup:
            result = await sup.get(handle.run_id).result()
    assert [e.kind for e in journaled][-1] == "usage_recorded"
    assert result.usage.by_role["planner"].calls == 2
    assert result.usage.total.calls == len(first.calls) + len(second.calls)


async def test_drain_gives_up_after_its_grace_period() -> None:
    reached = anyio.Event()
    store = MemoryStore()
    first = scripted(execute=blocking_at("s1", reached))
    with anyio.fail_after(10):
        async with Supervisor(first, store) as sup:
            handle = await sup.submit(spec(chain(2)))
            await reached.wait()
            started = anyio.current_time()
            await sup.drain(0.2)
            assert 0.15 < anyio.current_time() - started < 2
        summary = await store.get_run(handle.run_id)
    assert summary is not None
    assert summary.status is RunStatus.RUNNING


async def test_resuming_a_finished_run_gives_its_journaled_result() -> None:
    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(scripted(), store) as sup:
            result = await (await sup.submit(spec(chain(2)))).result()
        async with Supervisor(scripted(), store) as sup:
            handle = await sup.resume(result.run_id)
            assert await handle.result() == result
            with pytest.raises(UnknownRunError):
                await sup.resume("no-such-run")


class BrokenOnce(DelegatingStore):
    """A journal whose disk fails once, when the second task's end comes."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.failed = False

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        ends = [e for e in events if isinstance(e, TaskFinished)]
        if not self.failed and any(e.task_id == "t2" for e in ends):
            self.failed = True
            raise OSError(28, "No space left on device")
        await self.inner.append(run_id, events, summary)


async def test_a_run_whose_journal_failed_resumes_in_the_same_supervisor() -> None:
    # The run stops unfinished when its journal fails; once the disk has
    # room again, resume() drives it on, here as after a restart.
    model = scripted()
    with anyio.fail_after(10):
        async with Supervisor(model, BrokenOnce(MemoryStore())) as sup:
            handle = await sup.submit(spec(chain(3), milestone_every=100))
            with pytest.raises(SupervisorError, match="driver crashed"):
                await handle.result()
            resumed = await sup.resume(handle.run_id)
            result = await resumed.result()
            assert sup.get(handle.run_id).status is RunStatus.COMPLETED
            assert await sup.replay(handle.run_id) == result
    assert result.status is RunStatus.COMPLETED
    assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 3
    # t2's attempt ran again: its end was never journaled.
    assert executed_ids(model) == ["t1", "t2", "t2", "t3"]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_run_whose_journal_failed_is_not_listed_as_running_until_resumed(
    kind: str, tmp_path: Path
) -> None:
    # Let go of unfinished, it was still listed by handles() and get() as
    # running (so counted by a daemon's /metrics and its max_active_runs)
    # though nothing drove it, unlike a run let go of on PostgreSQL.
    inner = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "j.db")
    with anyio.fail_after(10):
        async with inner, Supervisor(scripted(), BrokenOnce(inner)) as sup:
            handle = await sup.submit(spec(chain(3), milestone_every=100))
            with pytest.raises(SupervisorError, match="driver crashed"):
                await handle.result()
            assert sup.handles() == []
            with pytest.raises(UnknownRunError):
                sup.get(handle.run_id)
            assert not sup.drives(handle.run_id)
            # Still in the journal, unfinished, for a resume.
            summary = await inner.get_run(handle.run_id)
            assert summary is not None
            assert summary.status is RunStatus.RUNNING
            # A cancel says why it cannot end the run here.
            with pytest.raises(SupervisorError, match="driver crashed"):
                await sup.cancel(handle.run_id)
            resumed = await sup.resume(handle.run_id)
            assert [h.run_id for h in sup.handles()] == [handle.run_id]
            assert sup.get(handle.run_id).run_id == handle.run_id
            assert (await resumed.result()).status is RunStatus.COMPLETED


async def test_resume_all_picks_up_every_unfinished_run_and_leaves_finished_ones() -> (
    None
):
    reached = anyio.Event()
    store = MemoryStore()
    first = scripted(execute=blocking_at("s2", reached))
    with anyio.fail_after(10):
        async with Supervisor(first, store) as sup:
            done = await (
                await sup.submit(spec([TaskDraft(key="s1", description="a")]))
            ).result()
            stuck = await sup.submit(spec(chain(2)))
            await reached.wait()
        async with Supervisor(scripted(), store) as sup:
            handles = await sup.resume_all()
            assert [h.run_id for h in handles] == [stuck.run_id]
            assert (await handles[0].result()).status is RunStatus.COMPLETED
    assert done.status is RunStatus.COMPLETED


def test_an_interrupted_attempt_does_not_count_against_max_task_attempts() -> None:
    now = datetime.now(UTC)
    run_spec = spec(chain(1), max_task_attempts=1)
    state = apply(None, RunSubmitted(seq=1, at=now, run_id="r", spec=run_spec))
    version = build_version(
        state, chain(1), trigger=None, reason="", phase="main", replace_pending=False
    )
    state = apply(state, PlanCreated(seq=2, at=now, version=version))
    state = apply(state, TaskStarted(seq=3, at=now, task_id="t1", attempt=1))
    state = apply(state, TaskInterrupted(seq=4, at=now, task_id="t1"))
    assert state.tasks["t1"].status is TaskStatus.PENDING
    assert state.tasks["t1"].attempts == 0
    assert state.task_executions == 1
    with pytest.raises(ValueError, match="interrupted without starting"):
        apply(state, TaskInterrupted(seq=5, at=now, task_id="t1"))


async def test_tasks_finishing_while_the_driver_waits_skip_the_ledger() -> None:
    # The driver journals such a report at once: a ledger write would only
    # cost a commit per task on the hot path.
    store = LedgerWatch(MemoryStore())
    with anyio.fail_after(10):
        async with Supervisor(scripted(), store) as sup:
            handle = await sup.submit(spec(chain(4), milestone_every=100))
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED
    assert store.recorded == []


async def test_tasks_finishing_together_before_a_review_are_kept_across_a_stop() -> (
    None
):
    # Both tasks return at once; the first report makes a milestone and the
    # review never ends. While it waits (a kill -9 could land then), each
    # finished attempt is journaled or in the ledger; on resume neither runs
    # again.
    release = anyio.Event()
    reviewing = anyio.Event()
    both_running = anyio.Event()
    running: list[str] = []

    async def execute(request: ModelRequest) -> TaskOutcome:
        running.append(task_of(request).id)
        if len(running) == 2:
            both_running.set()
        await release.wait()
        return with_finding(request)

    async def slow_review(request: ModelRequest) -> Verdict:
        reviewing.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    plan = [
        TaskDraft(key="s1", description="step 1"),
        TaskDraft(key="s2", description="step 2"),
        TaskDraft(key="s3", description="step 3", depends_on=["s1", "s2"]),
    ]
    inner = MemoryStore()
    store = LedgerWatch(inner)
    first = scripted(execute=execute, milestone=slow_review)
    with anyio.fail_after(10):
        async with Supervisor(first, store) as sup:
            handle = await sup.submit(spec(plan, milestone_every=1))
            await both_running.wait()
            release.set()
            await reviewing.wait()
            await anyio.wait_all_tasks_blocked()
            run_id = handle.run_id
            journaled = {
                e.task_id
                for e in await inner.read(run_id)
                if isinstance(e, TaskFinished)
            }
            ledger = {r.task_id for r in await inner.read_effects(run_id)}
            assert journaled | ledger == {"t1", "t2"}

        second = scripted()
        async with Supervisor(second, store, resume=True) as sup:
            result = await sup.get(run_id).result()
    assert result.status is RunStatus.COMPLETED
    assert executed_ids(second) == ["t3"]


async def test_a_resumed_run_keeps_its_token_budget_and_its_spent_tokens() -> None:
    reached = anyio.Event()
    per_call = TokenUsage(input_tokens=60, output_tokens=40, calls=1)
    first = scripted(execute=blocking_at("s3", reached), usage=per_call)
    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(first, store) as sup:
            limits = {"milestone_every": 100, "token_budget": 1_000}
            handle = await sup.submit(spec(chain(4), **limits))
            await reached.wait()
        second = scripted(usage=per_call)
        async with Supervisor(second, store, resume=True) as sup:
            result = await sup.get(handle.run_id).result()
    assert result.status is RunStatus.COMPLETED
    # Two executions were journaled before the stop (200 tokens): the model
    # sees what is left of the budget on every call after the restart.
    allowances = [r.token_allowance for r in second.calls]
    assert allowances[0] == 800
    assert allowances == [800 - 100 * n for n in range(len(allowances))]


_DAMAGE = {
    "not json": ("UPDATE events SET payload = '{broken' WHERE run_id = ? AND seq = 2"),
    "no event": (
        'UPDATE events SET payload = \'{"kind": "no_such_event"}\' '
        "WHERE run_id = ? AND seq = 2"
    ),
    "not utf-8": (
        "UPDATE events SET payload = CAST(X'FFFE' AS TEXT) WHERE run_id = ? AND seq = 2"
    ),
    "summary row": "UPDATE runs SET created_at = 'yesterday' WHERE run_id = ?",
    "effect ledger": (
        "INSERT INTO effects (run_id, task_id, attempt, payload) "
        "VALUES (?, 't1', 9, '{broken')"
    ),
}


@pytest.mark.parametrize("damage", list(_DAMAGE))
async def test_resume_all_skips_a_run_whose_journal_cannot_be_read(
    damage: str, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j.db"
    with anyio.fail_after(10):
        async with SQLiteStore(path) as store, Supervisor(demo_model(), store) as sup:
            gates = {}
            for _ in range(2):
                handle = await sup.submit(demo_spec())
                async for event in handle.events():
                    if isinstance(event, GateOpened):
                        gates[handle.run_id] = event.request.gate_id
                        break
        damaged, fine = gates
        with sqlite3.connect(path) as db:
            db.execute(_DAMAGE[damage], (damaged,))
        db.close()

        caplog.set_level(logging.ERROR, logger="replan.supervisor")
        async with (
            SQLiteStore(path) as store,
            Supervisor(demo_model(), store, resume=True) as sup,
        ):
            assert [g.gate_id for g in sup.gates.pending()] == [gates[fine]]
            await sup.gates.resolve(
                gates[fine], GateResolution(decision="approve", by="erin")
            )
            result = await sup.get(fine).result()
            with pytest.raises(UnknownRunError):
                sup.get(damaged)  # not held half-resumed, never to end
    assert result.status is RunStatus.COMPLETED
    [record] = [r for r in caplog.records if "cannot be resumed" in r.message]
    assert damaged in record.message


async def test_a_run_another_supervisor_drives_is_not_taken_over_in_memory() -> None:
    # Supervisors sharing one MemoryStore (a test of resume(), say) follow
    # the rule of a shared SQLite journal: no run is driven twice.
    store = MemoryStore()
    reached = anyio.Event()
    first_model = scripted(execute=blocking_at("s2", reached))
    with anyio.fail_after(10):
        async with Supervisor(first_model, store) as first:
            handle = await first.submit(spec(chain(3), milestone_every=100))
            await reached.wait()
            with pytest.raises(ConfigurationError, match="to itself") as caught:
                async with Supervisor(scripted(), store, resume=True):
                    pass
            assert caught.value.field == "store"
            async with Supervisor(scripted(), store) as sharing:
                with pytest.raises(ConfigurationError, match="to itself"):
                    await sharing.resume(handle.run_id)
        # Once the first has stopped, the run is free to be taken over.
        second = scripted()
        async with Supervisor(second, store, resume=True) as sup:
            result = await sup.get(handle.run_id).result()
    assert result.status is RunStatus.COMPLETED
    assert executed_ids(first_model) == ["t1", "t2"]
    assert executed_ids(second) == ["t2", "t3"]


async def test_a_run_another_supervisor_drives_is_not_taken_over(
    tmp_path: Any,
) -> None:
    # Two supervisors on one SQLite journal (two replicas of an application):
    # the second must not resume the first one's live run, or its tasks would
    # run twice.
    path = tmp_path / "j.db"
    with anyio.fail_after(10):
        async with (
            SQLiteStore(path) as first_store,
            Supervisor(demo_model(), first_store) as first,
        ):
            handle = await first.submit(demo_spec())
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    gate = event.request
                    break

            async with SQLiteStore(path) as store:
                taker = Supervisor(demo_model(), store, resume=True)
                with pytest.raises(ConfigurationError) as caught:
                    await taker.__aenter__()
                assert caught.value.field == "store"
                assert "resuming runs needs the journal to itself" in str(caught.value)

            # A supervisor that only starts runs shares the journal, and may
            # not take over the live one either.
            async with (
                SQLiteStore(path) as store,
                Supervisor(demo_model(), store) as sharing,
            ):
                other = await sharing.submit(RunSpec(goal="a run of its own"))
                with pytest.raises(ConfigurationError, match="to itself"):
                    await sharing.resume(handle.run_id)
                await other.cancel()
                with pytest.raises(UnknownRunError):
                    sharing.get(handle.run_id)  # nothing was left half-taken

            assert [g.gate_id for g in first.gates.pending()] == [gate.gate_id]
            await first.gates.resolve(gate.gate_id, GateResolution(decision="approve"))
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED

    # Once the first has stopped, the journal is free to be taken over.
    async with (
        SQLiteStore(path) as store,
        Supervisor(demo_model(), store, resume=True) as after,
    ):
        resumed = await after.resume(handle.run_id)
        assert (await resumed.result()).status is RunStatus.COMPLETED


async def test_resuming_many_runs_from_sqlite_lets_other_tasks_run_meanwhile(
    tmp_path: Any,
) -> None:
    # A SQLite journal reads without yielding: a daemon resuming thousands
    # of runs answered no HTTP request until the last one had resumed.
    runs = 30
    with anyio.fail_after(20):
        async with (
            SQLiteStore(tmp_path / "j.db") as store,
            Supervisor(demo_model(), store) as sup,
        ):
            for _ in range(runs):
                handle = await sup.submit(demo_spec())
                async for event in handle.events():
                    if isinstance(event, GateOpened):
                        break
        ticks = 0
        resumed = anyio.Event()

        async def tick() -> None:
            nonlocal ticks
            while not resumed.is_set():
                ticks += 1
                await anyio.lowlevel.checkpoint()

        async with SQLiteStore(tmp_path / "j.db") as store:
            sup = Supervisor(demo_model(), store)
            async with anyio.create_task_group() as tg, sup:
                tg.start_soon(tick)
                await anyio.lowlevel.checkpoint()  # the ticker is waiting
                counted = ticks
                handles = await sup.resume_all()
                during = ticks - counted
                resumed.set()
    assert len(handles) == runs
    # Once per run, give or take the scheduler's order (a journal read
    # without yields lets the ticker run only once or twice in all).
    assert during >= runs // 2
