"""Attempts that finish while a run waits at a gate of its own are journaled.

A replan's gate or a contract run's validation gate may wait for a person
for hours: tasks already in flight finish meanwhile, and the run's state and
events show them at once. Nothing new starts before the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from scripts import DelegatingStore, scripted, task_of

from replan import (
    GateAlreadyResolved,
    GateResolution,
    Limits,
    MemoryStore,
    ModelAuthenticationError,
    ModelRequest,
    PlanProposal,
    ReplanOutcome,
    RunHandle,
    RunResult,
    RunSpec,
    RunStatus,
    Supervisor,
    SupervisorError,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    Trigger,
    Verdict,
)
from replan.messages import (
    Event,
    GateOpened,
    GateResolved,
    MilestoneReviewed,
    TaskFinished,
    TaskStarted,
)
from replan.store import EffectRecord, RunSummary, SQLiteStore

GOAL = "map the market for solid-state batteries"


SURVEY = TaskDraft(key="a", description="survey", milestone=True)
"""The first milestone: its review asks for the replan and opens the gate."""
INDEPENDENT = TaskDraft(key="slow", description="an independent survey")
BUILD_ON_SURVEY = TaskDraft(
    key="c", description="build on the survey", depends_on=["a"]
)


async def answer(
    sup: Supervisor,
    handle: RunHandle,
    gate: Any,
    decision: str | GateResolution = "approve",
) -> RunResult:
    """Answer ``gate``, wait for the run's end, and check that its journal
    replays to the same result."""
    if isinstance(decision, str):
        decision = GateResolution(decision=decision, by="ana")  # type: ignore[arg-type]
    await sup.gates.resolve(gate.gate_id, decision)
    result = await handle.result()
    assert await sup.replay(handle.run_id) == result
    return result


class Held:
    """An executor answer that holds the tasks named in ``held`` until
    released; ``outcomes`` may script a held task's answer per attempt."""

    def __init__(
        self, *held: str, outcomes: dict[str, list[TaskOutcome]] | None = None
    ):
        self.held = set(held)
        self.release = anyio.Event()
        self.outcomes = outcomes or {}
        self.started: list[tuple[str, int]] = []

    async def __call__(self, request: ModelRequest) -> TaskOutcome:
        task = task_of(request)
        attempt = request.context["attempt"]
        self.started.append((task.key, attempt))
        if task.key in self.held and attempt == 1:
            await self.release.wait()
        scripted_outcomes = self.outcomes.get(task.key)
        if scripted_outcomes and attempt <= len(scripted_outcomes):
            return scripted_outcomes[attempt - 1]
        findings = ["the field moved"] if task.key == "a" else []
        return TaskOutcome(success=True, summary=f"did {task.key}", findings=findings)


def scope_shift_once(request: ModelRequest) -> Verdict:
    if request.context["milestone_index"] == 1:
        return Verdict(
            decision="replan", trigger=Trigger.SCOPE_SHIFT, rationale="wider"
        )
    return Verdict(decision="continue", rationale="on track")


def revised(request: ModelRequest) -> PlanProposal:
    return PlanProposal(
        tasks=[TaskDraft(key="x", description="survey the wider field")],
        rationale="wider",
    )


def plan(*drafts: TaskDraft, pattern: str = "discovery", **limits: Any) -> RunSpec:
    return RunSpec(
        goal=GOAL,
        pattern=pattern,  # type: ignore[arg-type]
        tasks=list(drafts),
        limits=Limits(milestone_every=100, **limits),
    )


async def gate_then_finish(handle: RunHandle, held: Held, task_id: str) -> Any:
    """Wait for the gate, release the held tasks, and return the gate once
    ``task_id``'s finish is in the events (while the gate is still open)."""
    gate = None
    async for event in handle.events():
        if isinstance(event, GateOpened):
            gate = event.request
            held.release.set()
        elif isinstance(event, TaskFinished) and event.task_id == task_id:
            assert gate is not None, "the task finished before the gate opened"
            return gate
        elif isinstance(event, GateResolved):
            raise AssertionError("the gate was answered first")
    raise AssertionError("the run ended")


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


async def test_a_task_finishing_while_a_replan_gate_waits_shows_completed_at_once() -> (
    None
):
    held = Held("slow")
    model = scripted(execute=held, milestone=scope_shift_once, replan=revised)
    drafts = [
        SURVEY,
        INDEPENDENT,
        BUILD_ON_SURVEY,
    ]
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(plan(*drafts))
            gate = await gate_then_finish(handle, held, "t2")
            # Before anyone answers: the state and the journal show it.
            assert handle.state.tasks["t2"].status is TaskStatus.COMPLETED
            assert handle.state.status is RunStatus.WAITING_FOR_HUMAN
            assert [g.gate_id for g in sup.gates.pending()] == [gate.gate_id]
            # Nothing new started while the gate waits.
            assert held.started == [("a", 1), ("slow", 1)]
            result = await answer(sup, handle, gate, "approve")
            events = await sup.store.read(handle.run_id)
    assert result.status is RunStatus.COMPLETED
    statuses = {t.key: t.status for t in result.tasks}
    assert statuses == {
        "a": TaskStatus.COMPLETED,
        "slow": TaskStatus.COMPLETED,
        "c": TaskStatus.SUPERSEDED,
        "x": TaskStatus.COMPLETED,
    }
    (record,) = result.replans
    assert record.outcome is ReplanOutcome.APPLIED
    assert result.versions[-1].removed == ["t3"]
    order = kinds(events)
    assert order.index("gate_opened") < order.index("gate_resolved")
    finished_slow = next(
        i
        for i, e in enumerate(events)
        if isinstance(e, TaskFinished) and e.task_id == "t2"
    )
    assert order.index("gate_opened") < finished_slow < order.index("gate_resolved")


async def test_a_milestone_reached_during_a_gate_is_reviewed_once_it_is_answered() -> (
    None
):
    held = Held("m")
    model = scripted(execute=held, milestone=scope_shift_once, replan=revised)
    drafts = [
        SURVEY,
        TaskDraft(key="m", description="a milestone of its own", milestone=True),
        BUILD_ON_SURVEY,
    ]

    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(plan(*drafts))
            held.outcomes["m"] = [
                TaskOutcome(success=True, summary="did m", findings=["news"])
            ]
            gate = await gate_then_finish(handle, held, "t2")
            result = await answer(sup, handle, gate, "reject")
            events = await sup.store.read(handle.run_id)
    assert result.status is RunStatus.COMPLETED
    reviews = [e for e in events if isinstance(e, MilestoneReviewed)]
    # The first review's gate, then the milestone m reached meanwhile,
    # before anything else starts.
    assert [r.index for r in reviews][:2] == [1, 2]
    assert reviews[1].by == "model"
    second = events.index(reviews[1])
    c_started = next(
        i
        for i, e in enumerate(events)
        if isinstance(e, TaskStarted) and e.task_id == "t3"
    )
    assert second < c_started
    milestones = [c.context["milestone_index"] for c in model.calls_for("reviewer")]
    assert milestones[:2] == [1, 2]


async def test_an_attempt_failing_transiently_during_a_gate_is_kept_and_retried() -> (
    None
):
    # The person approved a diff that removes t3 only: the attempt of t2 that
    # failed meanwhile waits for its retry, and the change does not take it.
    held = Held(
        "flaky",
        outcomes={"flaky": [TaskOutcome(success=False, transient=True, reason="503")]},
    )
    model = scripted(execute=held, milestone=scope_shift_once, replan=revised)
    drafts = [
        SURVEY,
        TaskDraft(key="flaky", description="a flaky call"),
        BUILD_ON_SURVEY,
    ]
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(plan(*drafts, retry_backoff_s=0))
            gate = await gate_then_finish(handle, held, "t2")
            assert handle.state.tasks["t2"].status is TaskStatus.PENDING
            assert gate.proposal is not None
            assert gate.proposal.removed == ["t3"]
            result = await answer(sup, handle, gate, "approve")
    assert result.status is RunStatus.COMPLETED
    assert result.versions[-1].removed == ["t3"]
    flaky = result.tasks[1]
    assert (flaky.status, flaky.attempts) == (TaskStatus.COMPLETED, 2)
    assert ("flaky", 2) in held.started


async def test_a_task_failing_during_a_gate_skips_its_dependents_at_once() -> None:
    held = Held(
        "fetch",
        outcomes={"fetch": [TaskOutcome(success=False, reason="gone for good")]},
    )
    model = scripted(execute=held, milestone=scope_shift_once, replan=revised)
    drafts = [
        SURVEY,
        TaskDraft(key="fetch", description="fetch a source"),
        TaskDraft(key="parse", description="parse it", depends_on=["fetch"]),
    ]
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(plan(*drafts))
            gate = await gate_then_finish(handle, held, "t2")
            assert handle.state.tasks["t2"].status is TaskStatus.FAILED
            assert handle.state.tasks["t3"].status is TaskStatus.SKIPPED
            result = await answer(sup, handle, gate, "approve")
    assert result.status is RunStatus.COMPLETED
    # The diff shown removed t3; it was skipped meanwhile, so nothing is.
    assert result.versions[-1].removed == []
    assert {t.key: t.status for t in result.tasks}["x"] is TaskStatus.COMPLETED


@pytest.mark.parametrize("how", ["approve", "edit"])
async def test_a_change_building_on_a_task_that_fails_during_its_gate_is_applied(
    how: str,
) -> None:
    # The change shown at the gate builds on t2, then running: t2 fails for
    # good before the person approves. The approved change is applied, and
    # only its tasks that depend on t2 are skipped, as the rules skip any
    # task depending on a failed one; the rest of it runs.
    held = Held(
        "fetch",
        outcomes={"fetch": [TaskOutcome(success=False, reason="gone for good")]},
    )

    def builds_on_fetch(request: ModelRequest) -> PlanProposal:
        return PlanProposal(
            tasks=[
                TaskDraft(key="x", description="parse the source", depends_on=["t2"]),
                TaskDraft(key="y", description="sum it up", depends_on=["x"]),
                TaskDraft(key="z", description="survey the wider field"),
            ],
            rationale="wider",
        )

    model = scripted(execute=held, milestone=scope_shift_once, replan=builds_on_fetch)
    drafts = [
        SURVEY,
        TaskDraft(key="fetch", description="fetch a source"),
        BUILD_ON_SURVEY,
    ]
    resolution = GateResolution(decision="approve", by="ana")
    if how == "edit":
        resolution = GateResolution(
            decision="edit",
            by="ana",
            tasks=[
                TaskDraft(key="x", description="parse it", depends_on=["t2"]),
                TaskDraft(key="z", description="survey the field"),
            ],
        )
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(plan(*drafts))
            gate = await gate_then_finish(handle, held, "t2")
            assert handle.state.tasks["t2"].status is TaskStatus.FAILED
            result = await answer(sup, handle, gate, resolution)
    assert result.status is RunStatus.COMPLETED
    (record,) = result.replans
    assert record.outcome is ReplanOutcome.APPLIED
    version = result.versions[-1]
    assert version.approved_by == "ana"
    assert version.removed == ["t3"]
    statuses = {t.key: t.status for t in result.tasks}
    assert statuses["fetch"] is TaskStatus.FAILED
    assert statuses["c"] is TaskStatus.SUPERSEDED
    assert statuses["x"] is TaskStatus.SKIPPED
    assert statuses["z"] is TaskStatus.COMPLETED
    if how == "approve":
        assert statuses["y"] is TaskStatus.SKIPPED  # through x
    assert ("x", 1) not in held.started


async def test_a_task_finishing_at_a_contract_runs_validation_gate_is_journaled() -> (
    None
):
    held = Held("slow")
    model = scripted(execute=held, milestone=scope_shift_once)
    drafts = [
        SURVEY,
        INDEPENDENT,
    ]
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(plan(*drafts, pattern="contract"))
            gate = await gate_then_finish(handle, held, "t2")
            assert gate.proposal is None  # the validation gate
            assert handle.state.tasks["t2"].status is TaskStatus.COMPLETED
            result = await answer(sup, handle, gate, "reject")
    assert result.status is RunStatus.ABORTED
    assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 2


async def test_a_task_journaled_during_a_gate_does_not_run_again_after_a_crash(
    tmp_path: Any,
) -> None:
    held = Held("slow")
    first = scripted(execute=held, milestone=scope_shift_once, replan=revised)
    drafts = [
        SURVEY,
        INDEPENDENT,
        BUILD_ON_SURVEY,
    ]
    with anyio.fail_after(10):
        async with SQLiteStore(tmp_path / "j.db") as store:
            async with Supervisor(first, store) as sup:
                handle = await sup.submit(plan(*drafts))
                gate = await gate_then_finish(handle, held, "t2")
            run_id = handle.run_id

        second_held = Held()
        second = scripted(execute=second_held, milestone=scope_shift_once)
        async with (
            SQLiteStore(tmp_path / "j.db") as store,
            Supervisor(second, store, resume=True) as sup,
        ):
            await sup.gates.resolve(
                gate.gate_id, GateResolution(decision="approve", by="ana")
            )
            result = await sup.get(run_id).result()
            assert await sup.replay(run_id) == result
    assert result.status is RunStatus.COMPLETED
    assert [key for key, _ in second_held.started] == ["x"]
    assert {t.key: t.status for t in result.tasks}["slow"] is TaskStatus.COMPLETED


async def test_a_report_that_ends_the_run_ends_it_at_once_while_a_gate_waits() -> None:
    # Rejected credentials in an attempt that was in flight: no one needs
    # to answer the gate to learn that the run cannot go on.
    held = Held("slow")

    async def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).key == "slow":
            await held(request)
            raise ModelAuthenticationError("401: set OPENAI_API_KEY")
        return await held(request)

    model = scripted(execute=execute, milestone=scope_shift_once, replan=revised)
    drafts = [
        SURVEY,
        INDEPENDENT,
    ]
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(plan(*drafts))
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    gate = event.request
                    held.release.set()
                    break
            result = await handle.result()
            with pytest.raises(GateAlreadyResolved, match="the run ended"):
                await sup.gates.resolve(
                    gate.gate_id, GateResolution(decision="approve", by="ana")
                )
            assert await sup.replay(handle.run_id) == result
    assert result.status is RunStatus.FAILED
    assert "OPENAI_API_KEY" in (result.stop_reason or "")


async def test_an_attempt_reported_with_one_that_ends_the_run_at_a_gate_is_kept() -> (
    None
):
    # Two attempts in flight report together while the run waits at its
    # gate, and the first ends the run (rejected credentials): the second's
    # success went with the rest of the batch, its result and its tokens in
    # no journal.
    reviewing, failed, done = anyio.Event(), anyio.Event(), anyio.Event()

    async def execute(request: ModelRequest) -> TaskOutcome:
        key = task_of(request).key
        if key == "slow":
            await reviewing.wait()
            failed.set()
            raise ModelAuthenticationError("401: set OPENAI_API_KEY")
        if key == "also":
            await failed.wait()
            await anyio.sleep(0.01)
            done.set()
        return await Held()(request)

    def review(request: ModelRequest) -> Verdict:
        reviewing.set()
        return scope_shift_once(request)

    async def revise(request: ModelRequest) -> PlanProposal:
        # Both reports are in before the gate opens.
        await done.wait()
        await anyio.sleep(0.05)
        return revised(request)

    model = scripted(execute=execute, milestone=review, replan=revise)
    also = TaskDraft(key="also", description="another independent survey")
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(plan(SURVEY, INDEPENDENT, also))
            result = await handle.result()
            assert await sup.replay(handle.run_id) == result
    assert result.status is RunStatus.FAILED
    assert "OPENAI_API_KEY" in (result.stop_reason or "")
    statuses = {t.key: t.status for t in result.tasks}
    assert statuses["also"] is TaskStatus.COMPLETED
    # Every answer counts; the rejected call cost nothing.
    answered = len(model.calls_for("executor", "execute")) - 1
    assert result.usage.by_role["executor"].calls == answered


class FailsAtFinishOf(DelegatingStore):
    """A journal (and effect ledger) whose disk fails once, when
    ``task_id``'s end comes."""

    def __init__(self, inner: MemoryStore, task_id: str) -> None:
        super().__init__(inner)
        self.ledger = inner
        self.task_id = task_id
        self.failed = False

    async def record_effect(self, run_id: str, record: EffectRecord) -> None:
        await self.ledger.record_effect(run_id, record)

    async def read_effects(self, run_id: str) -> list[EffectRecord]:
        return await self.ledger.read_effects(run_id)

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        ends = [e for e in events if isinstance(e, TaskFinished)]
        if not self.failed and any(e.task_id == self.task_id for e in ends):
            self.failed = True
            raise OSError(28, "No space left on device")
        await self.inner.append(run_id, events, summary)


async def test_a_journal_failing_during_a_gate_lets_go_of_the_run_for_a_resume() -> (
    None
):
    held = Held("slow")
    model = scripted(execute=held, milestone=scope_shift_once, replan=revised)
    drafts = [
        SURVEY,
        INDEPENDENT,
        BUILD_ON_SURVEY,
    ]
    with anyio.fail_after(10):
        async with Supervisor(model, FailsAtFinishOf(MemoryStore(), "t2")) as sup:
            handle = await sup.submit(plan(*drafts))
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    gate = event.request
                    held.release.set()
                    break
            with pytest.raises(SupervisorError, match="driver crashed"):
                await handle.result()
            resumed = await sup.resume(handle.run_id)
            await sup.gates.resolve(
                gate.gate_id, GateResolution(decision="approve", by="ana")
            )
            result = await resumed.result()
            assert await sup.replay(handle.run_id) == result
    assert result.status is RunStatus.COMPLETED
    # The finished attempt was kept in the ledger: it did not run again.
    assert held.started.count(("slow", 1)) == 1
    assert {t.key: t.status for t in result.tasks}["slow"] is TaskStatus.COMPLETED


async def test_a_milestone_reached_at_a_resumed_runs_gate_is_reviewed_once() -> None:
    # The stop comes while a contract run waits at its validation gate with
    # a milestone in flight; the resumed run waits at the same gate, the
    # milestone finishes meanwhile, and the answer lets the plan go on: one
    # review of it, not one by the resume and one by the run's loop.
    milestone = TaskDraft(key="m", description="a milestone of its own", milestone=True)
    news = [TaskOutcome(success=True, summary="did m", findings=["news"])]
    store = MemoryStore()
    first = scripted(execute=Held("m"), milestone=scope_shift_once)
    with anyio.fail_after(10):
        async with Supervisor(first, store) as sup:
            handle = await sup.submit(plan(SURVEY, milestone, pattern="contract"))
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    gate = event.request
                    break
        run_id = handle.run_id

        held = Held("m", outcomes={"m": news})
        second = scripted(execute=held, milestone=scope_shift_once)
        async with Supervisor(second, store, resume=True) as sup:
            assert [g.gate_id for g in sup.gates.pending()] == [gate.gate_id]
            resumed = sup.get(run_id)
            assert await gate_then_finish(resumed, held, "t2") == gate
            result = await answer(sup, resumed, gate, "approve")
            events = await store.read(run_id)
    assert result.status is RunStatus.COMPLETED
    assert [r.index for r in events if isinstance(r, MilestoneReviewed)] == [1, 2]
    milestones = [c.context["milestone_index"] for c in second.calls_for("reviewer")]
    assert milestones == [2]


class SlowAtAnswers(DelegatingStore):
    """A journal whose append of a gate's answer takes a while: ``writing``
    is set once one is under way."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.writing = anyio.Event()

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        if any(isinstance(e, GateResolved) for e in events):
            self.writing.set()
            await anyio.sleep(0.05)
        await self.inner.append(run_id, events, summary)


async def test_a_change_is_applied_to_the_plan_an_answer_being_journaled_changed() -> (
    None
):
    # A side effect's rejection is being journaled (it fails the task) as
    # the planner's change comes in, with no gate to wait at: the change is
    # checked against the plan with that answer in it, and does not replace
    # the task that failed meanwhile.
    store = SlowAtAnswers(MemoryStore())
    planning = anyio.Event()

    async def revise(request: ModelRequest) -> PlanProposal:
        planning.set()
        await store.writing.wait()
        return PlanProposal(tasks=[], rationale="nothing more to do")

    def contradiction_once(request: ModelRequest) -> Verdict:
        if request.context["milestone_index"] == 1:
            return Verdict(
                decision="replan", trigger=Trigger.CONTRADICTION, rationale="no"
            )
        return Verdict(decision="continue", rationale="on track")

    send = TaskDraft(key="send", description="email it", requires_approval=True)
    model = scripted(execute=Held(), milestone=contradiction_once, replan=revise)
    with anyio.fail_after(10):
        async with Supervisor(model, store) as sup:
            handle = await sup.submit(plan(SURVEY, send))
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    approval = event.request
                    break
            await planning.wait()
            await sup.gates.resolve(
                approval.gate_id, GateResolution(decision="reject", by="ana")
            )
            result = await handle.result()
            assert await sup.replay(handle.run_id) == result
    assert result.status is RunStatus.COMPLETED
    assert {t.key: t.status for t in result.tasks} == {
        "a": TaskStatus.COMPLETED,
        "send": TaskStatus.FAILED,
    }
    (record,) = result.replans
    assert record.outcome is ReplanOutcome.APPLIED
    assert result.versions[-1].removed == []
