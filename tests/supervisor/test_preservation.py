"""Replans never touch finished work: a property over random runs, and the
purity of ``apply``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as label
from hypothesis import strategies as st
from scripts import (
    GOAL,
    all_aligned,
    replan_verdict,
    scripted,
    task_of,
)

from replan import (
    Alignment,
    GatePolicy,
    Limits,
    MemoryStore,
    ModelRequest,
    PlanProposal,
    RunSpec,
    RunStatus,
    Supervisor,
    Synthesis,
    Task,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    Trigger,
    Verdict,
    apply,
    replay,
)
from replan.messages import (
    Event,
    MilestoneReviewed,
    PlanCreated,
    ReplanApplied,
    ReplanOutcome,
    ReplanRecord,
    RunFinished,
    RunSubmitted,
    TaskFinished,
    TaskStarted,
    UsageRecorded,
)
from replan.supervisor import RunState, build_version

FINISHED = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.SKIPPED})

# Scenarios -------------------------------------------------------------------


@dataclass(frozen=True)
class ReviewPlan:
    """What the reviewer answers at one milestone."""

    decision: str
    trigger: Trigger | None = None
    confidence: float = 1.0
    sources: int = 0
    affect: int = 0
    """How many pending tasks an obsolescence verdict names."""


@dataclass(frozen=True)
class DraftPlan:
    after: frozenset[int]
    """Earlier drafts of the same proposal this one depends on."""
    on_completed: tuple[int, ...]
    """Completed tasks (picked by index) this one depends on."""
    aligned: bool


@dataclass(frozen=True)
class ProposalPlan:
    drafts: tuple[DraftPlan, ...]
    achievable: bool


@dataclass(frozen=True)
class Scenario:
    plan: tuple[frozenset[int], ...]
    """The first plan: each task's dependencies among earlier tasks."""
    reviews: tuple[ReviewPlan, ...]
    proposals: tuple[ProposalPlan, ...]
    outcomes: tuple[str, ...]
    """Task outcomes, picked by task number and attempt."""
    limits: Limits
    on_timeout: str


def dependencies(index: int) -> st.SearchStrategy[frozenset[int]]:
    if index == 0:
        return st.just(frozenset())
    return st.frozensets(st.integers(0, index - 1), max_size=2)


@st.composite
def dag(draw: st.DrawFn, min_size: int, max_size: int) -> tuple[frozenset[int], ...]:
    size = draw(st.integers(min_size, max_size))
    return tuple(draw(dependencies(i)) for i in range(size))


# Hypothesis leans towards the first choices: replans and findings come first,
# so that most runs apply or refuse a few replans.
reviews = st.one_of(
    st.builds(
        ReviewPlan,
        decision=st.just("replan"),
        trigger=st.sampled_from([*Trigger, None]),
        confidence=st.sampled_from([1.0, 0.7, 0.5]),
        sources=st.integers(0, 3).map(lambda n: 3 - n),
        affect=st.integers(0, 3).map(lambda n: 3 - n),
    ),
    st.sampled_from(
        [ReviewPlan("continue"), ReviewPlan("complete"), ReviewPlan("abort")]
    ),
)


@st.composite
def proposals(draw: st.DrawFn) -> ProposalPlan:
    shape = draw(dag(0, 4))
    drafts = tuple(
        DraftPlan(
            after=after,
            on_completed=draw(st.lists(st.integers(0, 20), max_size=2).map(tuple)),
            aligned=draw(st.integers(0, 4).map(lambda n: n < 4)),
        )
        for after in shape
    )
    return ProposalPlan(drafts, achievable=draw(st.integers(0, 9).map(lambda n: n < 9)))


OUTCOME_KINDS = [
    *["finding"] * 6,
    *["clean"] * 3,
    "empty",
    "fail",
    "transient",
    "crash",
]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    return Scenario(
        plan=draw(dag(2, 6)),
        reviews=tuple(draw(st.lists(reviews, min_size=1, max_size=10))),
        proposals=tuple(draw(st.lists(proposals(), min_size=1, max_size=4))),
        outcomes=tuple(
            draw(st.lists(st.sampled_from(OUTCOME_KINDS), min_size=1, max_size=16))
        ),
        limits=Limits(
            max_replans=draw(st.sampled_from([3, 2, 1, 0])),
            milestone_every=draw(st.integers(1, 3)),
            max_task_attempts=draw(st.integers(1, 3)),
            max_concurrency=draw(st.integers(1, 3)),
            replan_candidates=draw(st.integers(1, 2)),
            gate_timeout_s=0.005,
        ),
        on_timeout=draw(st.sampled_from(["approve", "reject"])),
    )


# The scripted world of one scenario ------------------------------------------


@dataclass
class World:
    scenario: Scenario
    reviews_held: int = 0
    proposals_made: int = 0
    returned: dict[str, TaskOutcome | None] = field(default_factory=dict)
    """The last outcome the executor returned per task (None: it crashed)."""

    def execute(self, request: ModelRequest) -> TaskOutcome:
        task = task_of(request)
        number = int(task.id[1:])
        outcomes = self.scenario.outcomes
        kind = outcomes[(number * 3 + task.attempts) % len(outcomes)]
        if kind == "crash":
            self.returned[task.id] = None
            raise RuntimeError(f"executor crashed on {task.id}")
        outcome = {
            "clean": TaskOutcome(success=True, summary=f"{task.id} done"),
            "finding": TaskOutcome(
                success=True, summary=f"{task.id} done", findings=[f"{task.id}!"]
            ),
            "empty": TaskOutcome(success=True, summary=""),
            "fail": TaskOutcome(success=False, reason=f"{task.id} failed"),
            "transient": TaskOutcome(success=False, transient=True, reason="429"),
        }[kind]
        self.returned[task.id] = outcome
        return outcome

    def milestone(self, request: ModelRequest) -> Verdict:
        plans = self.scenario.reviews
        plan = plans[self.reviews_held] if self.reviews_held < len(plans) else None
        self.reviews_held += 1
        if plan is None or plan.decision in ("continue", "complete", "abort"):
            decision = plan.decision if plan else "continue"
            return Verdict(decision=decision, rationale=f"scripted {decision}")  # type: ignore[arg-type]
        pending = [t.id for t in request.context["pending"]]
        return replan_verdict(
            plan.trigger,
            confidence=plan.confidence,
            corroborating_sources=plan.sources,
            affected_tasks=pending[: plan.affect],
        )

    def replan(self, request: ModelRequest) -> PlanProposal:
        plans = self.scenario.proposals
        plan = plans[self.proposals_made % len(plans)]
        self.proposals_made += 1
        completed = [t.id for t in request.context["completed"]]
        tag = f"p{self.proposals_made}-"
        drafts = []
        for index, draft in enumerate(plan.drafts):
            depends = [f"{tag}{i}" for i in sorted(draft.after)]
            if completed:
                depends += sorted(
                    {completed[k % len(completed)] for k in draft.on_completed}
                )
            drafts.append(
                TaskDraft(
                    key=f"{tag}{index}",
                    description=f"revised {tag}{index}",
                    depends_on=depends,
                )
            )
        return PlanProposal(
            tasks=drafts, rationale="scripted revision", achievable=plan.achievable
        )

    def alignment(self, request: ModelRequest) -> Alignment:
        proposed: list[TaskDraft] = request.context["proposed"]
        flags = {
            f"p{n + 1}-{i}": d.aligned
            for n in range(self.proposals_made)
            for i, d in enumerate(
                self.scenario.proposals[n % len(self.scenario.proposals)].drafts
            )
        }
        if not all(d.key in flags for d in proposed):
            return all_aligned(request)
        return Alignment(aligned=[flags[d.key] for d in proposed])


def first_plan(shape: tuple[frozenset[int], ...]) -> list[TaskDraft]:
    return [
        TaskDraft(
            key=f"s{i}",
            description=f"step {i}",
            depends_on=[f"s{d}" for d in sorted(after)],
        )
        for i, after in enumerate(shape)
    ]


async def run_scenario(scenario: Scenario) -> None:
    world = World(scenario)
    model = scripted(
        execute=world.execute,
        milestone=world.milestone,
        replan=world.replan,
        alignment=world.alignment,
    )
    spec = RunSpec(
        goal=GOAL,
        pattern="discovery",
        tasks=first_plan(scenario.plan),
        limits=scenario.limits,
        gate_policy=GatePolicy(on_timeout=scenario.on_timeout),  # type: ignore[arg-type]
    )
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(spec)
            result = await handle.result()
            events = await sup.store.read(handle.run_id)
            replayed = await sup.replay(handle.run_id)

    assert result.status.final
    label(f"run {result.status.value}")
    for record in result.replans:
        label(f"replan {record.outcome.value}")
    assert replayed == result
    assert replay(events).result() == result

    # Fold the journal event by event and watch every task's transitions.
    finished: dict[str, Task] = {}
    state: RunState | None = None
    for event in events:
        before, state = state, apply(state, event)
        if before is None:
            continue
        for task_id, task in state.tasks.items():
            old = before.tasks.get(task_id)
            if task.status is TaskStatus.SUPERSEDED and (
                old is None or old.status is not TaskStatus.SUPERSEDED
            ):
                assert old is not None
                assert superseded_lawfully(before, event, old), (
                    f"{task_id} was {old.status} when {event.kind} superseded it"
                )
            if task_id in finished:
                assert essence(task) == essence(finished[task_id]), (
                    f"{event.kind} changed finished task {task_id}"
                )
            elif task.status in FINISHED:
                finished[task_id] = task

    final = {t.id: t for t in result.tasks}
    for task_id, task in finished.items():
        assert essence(final[task_id]) == essence(task)
    # Results are the executor's own answers, unchanged (a crash has none).
    for task_id, task in final.items():
        if task.status is TaskStatus.COMPLETED:
            assert task.result == world.returned[task_id]
        if task.status is TaskStatus.FAILED and world.returned.get(task_id):
            assert task.result == world.returned[task_id]


def superseded_lawfully(before: RunState, event: Event, task: Task) -> bool:
    """Whether ``event`` may supersede ``task`` (as it was ``before``).

    A replan or a ``complete`` verdict supersedes pending tasks. After
    ``complete`` nothing new starts, so an attempt in flight that fails
    transiently (or whose executor crashed) is superseded by its own finish
    instead of going back to pending for a retry.
    """
    if task.status is TaskStatus.PENDING:
        return isinstance(event, ReplanApplied) or (
            isinstance(event, MilestoneReviewed)
            and event.verdict.decision == "complete"
        )
    return (
        task.status is TaskStatus.IN_PROGRESS
        and before.completing
        and isinstance(event, TaskFinished)
        and event.task_id == task.id
        and not event.outcome.success
    )


def essence(task: Task) -> tuple[object, ...]:
    return (task.status, task.result, task.description, task.depends_on)


@given(scenarios())
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
def test_replans_never_change_finished_tasks_and_only_supersede_pending_ones(
    scenario: Scenario,
) -> None:
    anyio.run(run_scenario, scenario, backend="asyncio")


# apply is pure ---------------------------------------------------------------

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_apply_returns_new_states_and_never_mutates_its_input() -> None:
    spec = RunSpec(
        goal=GOAL,
        tasks=[
            TaskDraft(key="a", description="a"),
            TaskDraft(key="b", description="b", depends_on=["a"]),
            TaskDraft(key="c", description="c"),
            TaskDraft(key="d", description="d", depends_on=["c"]),
        ],
    )
    events: list[Event] = []

    def step(state: RunState | None, event: Event) -> RunState:
        before = state.model_dump() if state is not None else None
        after = apply(state, event)
        if state is not None:
            assert state.model_dump() == before, f"apply mutated on {event.kind}"
            assert after is not state
            assert after.seq == state.seq + 1
        events.append(event)
        return after

    def at(seq: int) -> datetime:
        return T0 + timedelta(seconds=seq)

    state = step(None, RunSubmitted(seq=1, at=at(1), run_id="r1", spec=spec))
    version = build_version(
        state,
        spec.tasks or [],
        trigger=None,
        reason="",
        phase="main",
        replace_pending=False,
    )
    state = step(state, PlanCreated(seq=2, at=at(2), version=version))
    state = step(state, TaskStarted(seq=3, at=at(3), task_id="t1", attempt=1))
    state = step(state, TaskStarted(seq=4, at=at(4), task_id="t3", attempt=1))
    done = TaskOutcome(success=True, summary="a done", findings=["a!"])
    state = step(state, TaskFinished(seq=5, at=at(5), task_id="t1", outcome=done))
    failed = TaskOutcome(success=False, reason="c is impossible")
    state = step(state, TaskFinished(seq=6, at=at(6), task_id="t3", outcome=failed))
    assert state.tasks["t4"].status is TaskStatus.SKIPPED
    state = step(
        state,
        UsageRecorded(
            seq=7,
            at=at(7),
            role="reviewer",
            purpose="milestone",
            usage=state.usage.total,
        ),
    )
    verdict = replan_verdict()
    state = step(
        state, MilestoneReviewed(seq=8, at=at(8), index=1, verdict=verdict, by="model")
    )
    revised = build_version(
        state,
        [TaskDraft(key="e", description="e", depends_on=["t1"])],
        trigger=Trigger.CONTRADICTION,
        reason="revised",
        phase="main",
        replace_pending=True,
    )
    record = ReplanRecord(
        trigger=Trigger.CONTRADICTION,
        outcome=ReplanOutcome.APPLIED,
        reason="revised",
        confidence=1.0,
        version=revised.version,
        proposed=revised,
    )
    state = step(state, ReplanApplied(seq=9, at=at(9), record=record, version=revised))
    assert state.tasks["t2"].status is TaskStatus.SUPERSEDED
    assert state.tasks["t5"].status is TaskStatus.PENDING
    state = step(
        state,
        MilestoneReviewed(
            seq=10,
            at=at(10),
            index=2,
            by="model",
            verdict=Verdict(decision="complete"),
        ),
    )
    assert state.tasks["t5"].status is TaskStatus.SUPERSEDED
    final = step(
        state,
        RunFinished(
            seq=11,
            at=at(11),
            status=RunStatus.COMPLETED,
            synthesis=Synthesis(output="out"),
        ),
    )

    # Folding the same events again gives the same state, and left the
    # intermediate states alone.
    assert replay(events) == final
    assert replay(events[:6]).tasks["t4"].status is TaskStatus.SKIPPED
    assert final.tasks["t1"].result == done
    assert final.tasks["t3"].result == failed


@pytest.mark.parametrize(
    ("outcome", "finished"),
    [
        pytest.param(TaskOutcome(success=True, summary="a done"), ["t1"], id="done"),
        pytest.param(
            TaskOutcome(success=False, reason="a is gone"),
            ["t1", "t2"],
            id="failed-and-skipped",
        ),
    ],
)
def test_apply_refuses_a_replan_that_replaces_a_finished_task(
    outcome: TaskOutcome, finished: list[str]
) -> None:
    # build_version never proposes this; a journal edited by hand, or
    # written by a faulty version, could.
    spec = RunSpec(
        goal=GOAL,
        tasks=[
            TaskDraft(key="a", description="a"),
            TaskDraft(key="b", description="b", depends_on=["a"]),
            TaskDraft(key="c", description="c"),
        ],
    )
    state = apply(None, RunSubmitted(seq=1, at=T0, run_id="r1", spec=spec))
    version = build_version(
        state,
        spec.tasks or [],
        trigger=None,
        reason="",
        phase="main",
        replace_pending=False,
    )
    state = apply(state, PlanCreated(seq=2, at=T0, version=version))
    state = apply(state, TaskStarted(seq=3, at=T0, task_id="t1", attempt=1))
    state = apply(state, TaskFinished(seq=4, at=T0, task_id="t1", outcome=outcome))
    assert all(state.tasks[t].status in FINISHED for t in finished)
    revised = build_version(
        state,
        [TaskDraft(key="x", description="x")],
        trigger=Trigger.CONTRADICTION,
        reason="revised",
        phase="main",
        replace_pending=True,
    )
    record = ReplanRecord(
        trigger=Trigger.CONTRADICTION,
        outcome=ReplanOutcome.APPLIED,
        reason="revised",
        confidence=1.0,
        version=revised.version,
    )
    honest = ReplanApplied(seq=5, at=T0, record=record, version=revised)
    assert apply(state, honest).tasks["t1"] == state.tasks["t1"]
    for task_id in finished:
        forged = revised.model_copy(update={"removed": [*revised.removed, task_id]})
        with pytest.raises(ValueError, match=f"not {task_id}"):
            apply(state, honest.model_copy(update={"version": forged}))
