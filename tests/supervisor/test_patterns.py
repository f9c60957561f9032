"""Run patterns: contract runs never replan, hybrid runs cross one boundary."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Literal

import anyio
import pytest

import replan
from replan import (
    Alignment,
    GatePolicy,
    GateRequest,
    GateResolution,
    Limits,
    ModelRequest,
    PlanProposal,
    ReplanOutcome,
    RunHandle,
    RunSpec,
    RunStatus,
    ScriptedModel,
    Supervisor,
    Synthesis,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    Trigger,
    Verdict,
    apply,
    replay,
)
from replan.messages import (
    GateOpened,
    GateResolved,
    MilestoneReviewed,
    PlanCreated,
    RunFinished,
    RunSubmitted,
    TaskFinished,
    TaskStarted,
)
from replan.supervisor import build_version, phase_gate

FIXED = [
    TaskDraft(key="a", description="collect the first source", milestone=True),
    TaskDraft(key="b", description="collect the second source", depends_on=["a"]),
    TaskDraft(key="c", description="compare sources", depends_on=["b"], milestone=True),
    TaskDraft(key="d", description="write the table", depends_on=["c"]),
]


def base_answers(request: ModelRequest) -> Any:
    """Answers shared by every run here; every task reports a finding, so the
    reviewer model is asked at every milestone."""
    ctx = request.context
    match (request.role, request.purpose):
        case ("executor", "execute"):
            task = ctx["task"]
            return TaskOutcome(
                success=True, summary=f"did {task.key}", findings=[f"{task.key}!"]
            )
        case ("executor", "synthesize"):
            return Synthesis(output="the answer")
        case ("ranker", "alignment"):
            return Alignment(aligned=[True] * len(ctx["proposed"]))
    raise AssertionError(f"unexpected request {request.role}/{request.purpose}")


def verdict(decision: Literal["replan", "complete"]) -> Verdict:
    if decision == "replan":
        return Verdict(
            decision="replan", trigger=Trigger.CONTRADICTION, rationale="it changed"
        )
    return Verdict(decision="complete", rationale="good enough")


def reviewer_saying(
    decision: Literal["replan", "complete"],
) -> Callable[[ModelRequest], Any]:
    """The base answers, with every milestone review answering ``decision``."""

    def handler(request: ModelRequest) -> Any:
        if request.role == "reviewer" and request.purpose == "milestone":
            return verdict(decision)
        return base_answers(request)

    return handler


@asynccontextmanager
async def approving_every_gate(sup: Supervisor) -> AsyncIterator[list[GateRequest]]:
    """Approve every gate that opens while the block runs; yield them."""
    seen: list[GateRequest] = []

    async def approve_forever() -> None:
        while True:
            for gate in sup.gates.pending():
                seen.append(gate)
                await sup.gates.resolve(
                    gate.gate_id, GateResolution(decision="approve")
                )
            await anyio.sleep(0.005)

    async with anyio.create_task_group() as tg:
        tg.start_soon(approve_forever)
        yield seen
        tg.cancel_scope.cancel()


async def until(predicate: Callable[[], object], seconds: float = 10) -> None:
    """Poll ``predicate`` until it holds (the run gives no event to wait on)."""
    with anyio.fail_after(seconds):
        while True:
            if predicate():
                return
            await anyio.sleep(0.005)


def journaled_gate(sup: Supervisor) -> GateRequest | None:
    """The oldest pending gate whose opening the run has journaled."""
    for gate in sup.gates.pending():
        if gate.gate_id in sup.get(gate.run_id).state.gates:
            return gate
    return None


async def next_gate(sup: Supervisor) -> GateRequest:
    await until(lambda: journaled_gate(sup))
    gate = journaled_gate(sup)
    assert gate is not None
    return gate


async def finish(handle: RunHandle) -> replan.RunResult:
    with anyio.fail_after(10):
        return await handle.result()


async def journal(handle: RunHandle) -> list[replan.Event]:
    with anyio.fail_after(10):
        return [event async for event in handle.events()]


def structure(task: replan.Task) -> tuple[Any, ...]:
    return (
        task.id,
        task.key,
        task.description,
        task.depends_on,
        task.phase,
        task.milestone,
        task.requires_approval,
        task.version,
    )


# Contract runs --------------------------------------------------------------


@pytest.mark.parametrize("decision", ["replan", "complete"])
async def test_a_contract_run_ends_with_exactly_the_task_structure_it_started_with(
    decision: Literal["replan", "complete"],
) -> None:
    model = ScriptedModel(reviewer_saying(decision))
    async with Supervisor(model) as sup, approving_every_gate(sup):
        handle = await sup.submit(
            RunSpec(goal="fill the table", pattern="contract", tasks=FIXED)
        )
        result = await finish(handle)

    start = result.versions[0].tasks_after
    assert [structure(t) for t in result.tasks] == [structure(t) for t in start]
    assert [t.key for t in result.tasks] == ["a", "b", "c", "d"]
    assert all(t.status is TaskStatus.COMPLETED for t in result.tasks)
    assert all(t.result is not None and t.result.success for t in result.tasks)
    assert result.status is RunStatus.COMPLETED
    assert len(result.versions) == 1
    assert result.replans == []
    assert model.calls_for("planner") == []
    # The reviewer was really asked, and really said what the test claims.
    assert len(model.calls_for("reviewer", "milestone")) >= 2


async def test_a_reviewer_complete_in_a_contract_run_is_recorded_as_continue() -> None:
    model = ScriptedModel(reviewer_saying("complete"))
    async with Supervisor(model) as sup:
        handle = await sup.submit(
            RunSpec(goal="fill the table", pattern="contract", tasks=FIXED)
        )
        await finish(handle)
        events = await journal(handle)

    reviews = [e for e in events if isinstance(e, MilestoneReviewed)]
    assert reviews
    assert all(e.verdict.decision == "continue" for e in reviews)
    assert all(e.by == "policy" for e in reviews)


async def test_a_reviewer_replan_in_a_contract_run_opens_a_validation_gate() -> None:
    model = ScriptedModel(reviewer_saying("replan"))
    async with Supervisor(model) as sup:
        handle = await sup.submit(
            RunSpec(goal="fill the table", pattern="contract", tasks=FIXED)
        )
        gate = await next_gate(sup)
        assert handle.status is RunStatus.WAITING_FOR_HUMAN
        assert gate.proposal is None
        assert gate.task_id is None
        assert gate.trigger is Trigger.CONTRADICTION
        # The run waits: the next fixed task does not start meanwhile.
        assert handle.state.tasks["t2"].status is TaskStatus.PENDING

        await sup.gates.resolve(gate.gate_id, GateResolution(decision="approve"))
        # Approved: the fixed plan goes on, to the next milestone (after t3).
        second = await next_gate(sup)
        assert second.gate_id != gate.gate_id
        assert handle.state.tasks["t3"].status is TaskStatus.COMPLETED
        assert handle.state.tasks["t4"].status is TaskStatus.PENDING
        async with approving_every_gate(sup) as later:
            result = await finish(handle)

    assert result.status is RunStatus.COMPLETED
    # t3's milestone, then the end of the phase after t4.
    assert [g.gate_id for g in later][:1] == [second.gate_id]
    assert len(later) == 2
    assert all(t.status is TaskStatus.COMPLETED for t in result.tasks)
    assert result.replans == []
    assert model.calls_for("planner") == []


@pytest.mark.parametrize("rationale", ["it changed", "it changed.", "it changed. "])
async def test_a_validation_gate_reason_ends_the_rationale_with_one_period(
    rationale: str,
) -> None:
    def handler(request: ModelRequest) -> Any:
        if request.role == "reviewer" and request.purpose == "milestone":
            return Verdict(
                decision="replan", trigger=Trigger.CONTRADICTION, rationale=rationale
            )
        return base_answers(request)

    async with Supervisor(ScriptedModel(handler)) as sup:
        handle = await sup.submit(
            RunSpec(goal="fill the table", pattern="contract", tasks=FIXED)
        )
        gate = await next_gate(sup)
        await handle.cancel()
    assert gate.reason == (
        "the plan's assumptions may no longer hold (contradiction): it changed. "
        "Approve to continue the fixed plan, reject to stop with the results "
        "so far."
    )


async def test_rejecting_a_validation_gate_aborts_the_contract_run() -> None:
    model = ScriptedModel(reviewer_saying("replan"))
    async with Supervisor(model) as sup:
        handle = await sup.submit(
            RunSpec(goal="fill the table", pattern="contract", tasks=FIXED)
        )
        gate = await next_gate(sup)
        await sup.gates.resolve(
            gate.gate_id, GateResolution(decision="reject", by="frank")
        )
        result = await finish(handle)

    assert result.status is RunStatus.ABORTED
    assert "frank" in (result.stop_reason or "")
    status = {t.id: t.status for t in result.tasks}
    # Partial results are kept; the rest of the fixed plan never ran.
    assert status["t1"] is TaskStatus.COMPLETED
    assert status["t2"] is TaskStatus.PENDING
    assert result.replans == []
    assert model.calls_for("planner") == []
    assert model.calls_for("executor", "synthesize") == []


@pytest.mark.parametrize(
    ("on_timeout", "status"),
    [("reject", RunStatus.ABORTED), ("approve", RunStatus.COMPLETED)],
)
async def test_an_unanswered_validation_gate_applies_the_timeout_policy(
    on_timeout: Literal["approve", "reject"], status: RunStatus
) -> None:
    model = ScriptedModel(reviewer_saying("replan"))
    async with Supervisor(model) as sup:
        handle = await sup.submit(
            RunSpec(
                goal="fill the table",
                pattern="contract",
                tasks=FIXED,
                limits=Limits(gate_timeout_s=0.05),
                gate_policy=GatePolicy(on_timeout=on_timeout),
            )
        )
        result = await finish(handle)
        events = await journal(handle)

    assert result.status is status
    resolved = [e.resolution for e in events if isinstance(e, GateResolved)]
    assert resolved
    assert {(r.decision, r.by) for r in resolved} == {(on_timeout, "policy:timeout")}
    if status is RunStatus.ABORTED:
        assert "policy:timeout" in (result.stop_reason or "")
        assert len(resolved) == 1
        assert model.calls_for("executor", "synthesize") == []
    else:
        assert all(t.status is TaskStatus.COMPLETED for t in result.tasks)
    assert result.replans == []
    assert model.calls_for("planner") == []


# Hybrid runs ----------------------------------------------------------------

COLLECTION = [
    TaskDraft(key="c1", description="collect prices"),
    TaskDraft(key="c2", description="collect volumes", milestone=True),
]
SYNTHESIS = [
    TaskDraft(key="s1", description="model the market", milestone=True),
    TaskDraft(key="s2", description="write the brief", depends_on=["s1"]),
]
REVISED = [TaskDraft(key="s3", description="write a revised brief", depends_on=["t3"])]


def hybrid_handler(
    *, replan_in_synthesis: bool, replan_in_collection: bool
) -> Callable[[ModelRequest], Any]:
    synthesis_replans = 0

    def handler(request: ModelRequest) -> Any:
        nonlocal synthesis_replans
        ctx = request.context
        match (request.role, request.purpose):
            case ("planner", "boundary"):
                return PlanProposal(tasks=SYNTHESIS, rationale="synthesize")
            case ("planner", "replan"):
                return PlanProposal(tasks=REVISED, rationale="revise the brief")
            case ("reviewer", "milestone"):
                in_synthesis = any(t.phase == "synthesis" for t in ctx["completed"])
                if not in_synthesis and replan_in_collection:
                    return verdict("replan")
                if in_synthesis and replan_in_synthesis and synthesis_replans == 0:
                    synthesis_replans += 1
                    return verdict("replan")
                return Verdict(decision="continue")
        return base_answers(request)

    return handler


async def run_hybrid(
    *, replan_in_synthesis: bool, replan_in_collection: bool
) -> tuple[ScriptedModel, replan.RunResult, list[replan.Event], list[GateRequest]]:
    model = ScriptedModel(
        hybrid_handler(
            replan_in_synthesis=replan_in_synthesis,
            replan_in_collection=replan_in_collection,
        )
    )
    async with Supervisor(model) as sup, approving_every_gate(sup) as gates:
        handle = await sup.submit(
            RunSpec(goal="brief the market", pattern="hybrid", tasks=COLLECTION)
        )
        result = await finish(handle)
        events = await journal(handle)
    return model, result, events, gates


async def test_a_hybrid_run_collects_without_replanning_then_crosses_one_boundary() -> (
    None
):
    model, result, events, gates = await run_hybrid(
        replan_in_synthesis=True, replan_in_collection=True
    )

    assert result.status is RunStatus.COMPLETED
    # A replan asked for during collection became a validation gate.
    assert gates
    assert all(g.proposal is None and g.task_id is None for g in gates)
    opened = [e for e in events if isinstance(e, GateOpened)]
    assert len(opened) == len(gates)
    # The boundary fired exactly once, after every collection task finished.
    assert len(model.calls_for("planner", "boundary")) == 1
    boundaries = [e for e in events if isinstance(e, PlanCreated) and e.boundary]
    assert len(boundaries) == 1
    boundary_at = events.index(boundaries[0])
    collection_ids = {"t1", "t2"}
    last_collected = max(
        i
        for i, e in enumerate(events)
        if isinstance(e, TaskFinished) and e.task_id in collection_ids
    )
    assert last_collected < boundary_at
    assert all(e.seq < boundaries[0].seq for e in opened)
    boundary_context = model.calls_for("planner", "boundary")[0].context
    assert {t.id for t in boundary_context["completed"]} == collection_ids

    phases = {t.key: t.phase for t in result.tasks}
    assert phases == {
        "c1": "collection",
        "c2": "collection",
        "s1": "synthesis",
        "s2": "synthesis",
        "s3": "synthesis",
    }


async def test_a_contradiction_during_a_hybrid_synthesis_phase_is_replanned() -> None:
    model, result, _, _ = await run_hybrid(
        replan_in_synthesis=True, replan_in_collection=True
    )

    # Only the synthesis-phase replan reached the planner.
    assert len(model.calls_for("planner", "replan")) == 1
    assert [r.outcome for r in result.replans] == [ReplanOutcome.APPLIED]
    assert result.replans[0].trigger is Trigger.CONTRADICTION
    version = result.versions[-1]
    assert version.trigger is Trigger.CONTRADICTION
    status = {t.key: t.status for t in result.tasks}
    assert status == {
        "c1": TaskStatus.COMPLETED,
        "c2": TaskStatus.COMPLETED,
        "s1": TaskStatus.COMPLETED,
        "s2": TaskStatus.SUPERSEDED,
        "s3": TaskStatus.COMPLETED,
    }
    # The collection tasks are untouched by the synthesis replan.
    assert set(version.preserved) >= {"t1", "t2", "t3"}


async def test_phase_gate_says_boundary_just_between_collection_end_and_boundary() -> (
    None
):
    _, result, events, _ = await run_hybrid(
        replan_in_synthesis=False, replan_in_collection=False
    )
    assert result.status is RunStatus.COMPLETED
    boundary_at = next(
        i for i, e in enumerate(events) if isinstance(e, PlanCreated) and e.boundary
    )
    last_collected = max(
        i
        for i, e in enumerate(events)
        if isinstance(e, TaskFinished) and e.task_id in {"t1", "t2"}
    )
    assert last_collected < boundary_at
    saw_boundary = 0
    for k in range(1, len(events) + 1):
        state = replay(events[:k])
        # events[:k] holds the last collection result and not yet the boundary.
        expected = "boundary" if last_collected < k <= boundary_at else "stay"
        answers = {phase_gate(state) for _ in range(5)}
        assert answers == {expected}, f"prefix of {k} events"
        saw_boundary += expected == "boundary"
    assert saw_boundary >= 1


def test_phase_gate_says_stay_before_a_hybrid_run_has_its_first_plan() -> None:
    spec = RunSpec(goal="g", pattern="hybrid", tasks=COLLECTION)
    at = datetime(2025, 1, 1, tzinfo=UTC)
    state = apply(None, RunSubmitted(seq=1, at=at, run_id="r", spec=spec))
    # Collection has not even started, so it cannot have finished.
    assert phase_gate(state) == "stay"


async def test_phase_gate_never_says_boundary_outside_hybrid_runs() -> None:
    model = ScriptedModel(
        hybrid_handler(replan_in_synthesis=False, replan_in_collection=False)
    )
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="brief the market", tasks=COLLECTION))
        result = await finish(handle)
        events = await journal(handle)
    assert result.status is RunStatus.COMPLETED
    for k in range(1, len(events) + 1):
        assert phase_gate(replay(events[:k])) == "stay"


def test_phase_gate_on_hand_made_states_counts_failed_collection_as_finished() -> None:
    spec = RunSpec(goal="g", pattern="hybrid", tasks=COLLECTION)
    at = datetime(2025, 1, 1, tzinfo=UTC)
    state = apply(None, RunSubmitted(seq=1, at=at, run_id="r", spec=spec))
    steps: list[tuple[Any, str]] = []

    def step(cls: Any, expected: str, **fields: Any) -> None:
        nonlocal state
        event = cls(seq=state.seq + 1, at=at, **fields)
        state = apply(state, event)
        steps.append((event.kind, expected))
        for _ in range(5):
            assert phase_gate(state) == expected, steps

    def version(drafts: list[TaskDraft], phase: Any) -> replan.PlanVersion:
        return build_version(
            state, drafts, trigger=None, reason="", phase=phase, replace_pending=False
        )

    step(PlanCreated, "stay", version=version(COLLECTION, "collection"))
    assert state.phase == "collection"
    step(TaskStarted, "stay", task_id="t1", attempt=1)
    step(TaskStarted, "stay", task_id="t2", attempt=1)
    step(TaskFinished, "stay", task_id="t1", outcome=TaskOutcome(success=True))
    # A transient failure puts t2 back to pending: collection is not done.
    transient = TaskOutcome(success=False, transient=True)
    step(TaskFinished, "stay", task_id="t2", outcome=transient)
    step(TaskStarted, "stay", task_id="t2", attempt=2)
    # The last attempt fails for good: nothing is left to collect.
    step(TaskFinished, "boundary", task_id="t2", outcome=TaskOutcome(success=False))
    step(
        MilestoneReviewed,
        "boundary",
        index=1,
        verdict=Verdict(decision="continue"),
        by="model",
    )
    step(PlanCreated, "stay", version=version(SYNTHESIS, "synthesis"), boundary=True)
    assert state.phase == "synthesis"
    step(TaskStarted, "stay", task_id="t3", attempt=1)
    step(TaskFinished, "stay", task_id="t3", outcome=TaskOutcome(success=True))
    step(TaskStarted, "stay", task_id="t4", attempt=1)
    step(TaskFinished, "stay", task_id="t4", outcome=TaskOutcome(success=True))
    step(RunFinished, "stay", status=RunStatus.COMPLETED)
