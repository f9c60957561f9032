"""The pure decisions, tested without any I/O."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import product
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replan import (
    Alignment,
    Limits,
    ReplanOutcome,
    RunSpec,
    Task,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    TokenUsage,
    Trigger,
    Verdict,
)
from replan.messages import (
    PlanCreated,
    ReplanApplied,
    ReplanRecord,
    RunSubmitted,
    TaskFinished,
    TaskStarted,
    UsageRecorded,
)
from replan.supervisor import (
    RunState,
    apply,
    budget_spent,
    build_version,
    drifted,
    guard_replan,
    heuristic_verdict,
    milestone_due,
    ready_tasks,
)
from replan.supervisor import _tables as tables
from replan.supervisor._decide import ReadyWalk

NOW = datetime(2026, 11, 21, tzinfo=UTC)


def _state(n_tasks: int = 4, *, chain: bool = True, **limits: Any) -> RunState:
    """A run of ``n_tasks`` planned tasks, each depending on the one before
    unless ``chain`` is false."""
    spec = RunSpec(
        goal="g",
        tasks=[
            TaskDraft(
                key=f"k{i}",
                description=f"task {i}",
                depends_on=[f"k{i - 1}"] if i and chain else [],
            )
            for i in range(n_tasks)
        ],
        limits=Limits(**limits),
    )
    state = apply(None, RunSubmitted(seq=1, at=NOW, run_id="r", spec=spec))
    assert spec.tasks is not None
    version = build_version(
        state, spec.tasks, trigger=None, reason="", phase="main", replace_pending=False
    )
    return apply(state, PlanCreated(seq=2, at=NOW, version=version))


def _finish(state: RunState, task_id: str, outcome: TaskOutcome) -> RunState:
    task = state.tasks[task_id]
    state = apply(
        state,
        TaskStarted(
            seq=state.seq + 1, at=NOW, task_id=task_id, attempt=task.attempts + 1
        ),
    )
    return apply(
        state, TaskFinished(seq=state.seq + 1, at=NOW, task_id=task_id, outcome=outcome)
    )


OK = TaskOutcome(success=True, summary="done")


def test_only_tasks_whose_dependencies_completed_are_ready() -> None:
    state = _state(3)
    assert [t.id for t in ready_tasks(state)] == ["t1"]
    state = _finish(state, "t1", OK)
    assert [t.id for t in ready_tasks(state)] == ["t2"]


def _replanned(state: RunState, count: int, on: list[str]) -> RunState:
    """``state`` after a replan putting ``count`` chained tasks, the first
    depending on ``on``, in place of the pending ones."""
    drafts = [
        TaskDraft(
            key=f"n{state.seq}-{i}",
            description="new",
            depends_on=[f"n{state.seq}-{i - 1}"] if i else on,
        )
        for i in range(count)
    ]
    version = build_version(
        state,
        drafts,
        trigger=Trigger.CONTRADICTION,
        reason="r",
        phase="main",
        replace_pending=True,
    )
    record = ReplanRecord(
        trigger=Trigger.CONTRADICTION,
        outcome=ReplanOutcome.APPLIED,
        reason="r",
        confidence=1.0,
        version=version.version,
        proposed=version,
    )
    return apply(
        state, ReplanApplied(seq=state.seq + 1, at=NOW, record=record, version=version)
    )


@given(
    st.integers(1, 12),
    st.booleans(),
    st.lists(st.tuples(st.sampled_from("sfxtr"), st.integers(0, 30)), max_size=60),
)
def test_the_drivers_walk_finds_the_ready_tasks_a_whole_walk_finds(
    size: int, chain: bool, steps: list[tuple[str, int]]
) -> None:
    _walk_along(size, chain, steps)


@given(
    st.integers(1, 40),
    st.booleans(),
    st.lists(st.tuples(st.sampled_from("sfxtr"), st.integers(0, 30)), max_size=80),
)
def test_the_drivers_walk_of_a_large_table_finds_what_a_whole_walk_finds(
    size: int, chain: bool, steps: list[tuple[str, int]]
) -> None:
    # Tables past 3 tasks become TaskTables of chunks of 4: the walk follows
    # the tasks that changed, by the chunks, as it does past 256 tasks.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tables, "SMALL", 3)
        patch.setattr(tables, "CHUNK", 4)
        patch.setattr(tables, "_SHIFT", 2)
        patch.setattr(tables, "_MASK", 3)
        _walk_along(size, chain, steps)


def _walk_along(size: int, chain: bool, steps: list[tuple[str, int]]) -> None:
    # One walk follows the run from state to state, as the driver's does:
    # starts, successes, failures (their dependents skipped), transient
    # failures (the task pending again) and replans (tasks superseded and
    # added at the end of the table). Each state is walked twice, as the
    # driver may when nothing it was offered started.
    walk = ReadyWalk()
    state = _state(size, chain=chain)
    for action, pick in steps:
        assert [t.id for t in walk(state)] == [t.id for t in ready_tasks(state)]
        if pick % 4 == 0:
            assert [t.id for t in walk(state)] == [t.id for t in ready_tasks(state)]
        elif pick % 4 == 1:
            # A walk the driver stops after the first task it takes.
            next(iter(walk(state)), None)
        ready = ready_tasks(state)
        running = [
            t for t in state.tasks.values() if t.status is TaskStatus.IN_PROGRESS
        ]
        if action == "s" and ready:
            task = ready[pick % len(ready)]
            state = apply(
                state,
                TaskStarted(
                    seq=state.seq + 1,
                    at=NOW,
                    task_id=task.id,
                    attempt=task.attempts + 1,
                ),
            )
        elif action in "fxt" and running:
            task = running[pick % len(running)]
            outcome = {
                "f": OK,
                "x": TaskOutcome(success=False, summary="no", reason="broken"),
                "t": TaskOutcome(success=False, summary="no", transient=True),
            }[action]
            state = apply(
                state,
                TaskFinished(
                    seq=state.seq + 1, at=NOW, task_id=task.id, outcome=outcome
                ),
            )
        elif action == "r":
            done = [
                t.id for t in state.tasks.values() if t.status is TaskStatus.COMPLETED
            ]
            state = _replanned(state, 1 + pick % 3, done[-1:])
    assert [t.id for t in walk(state)] == [t.id for t in ready_tasks(state)]


@pytest.mark.parametrize(
    ("trigger", "confidence", "sources", "affected", "expected"),
    [
        (Trigger.CONTRADICTION, 0.1, 0, [], None),
        (Trigger.SCOPE_SHIFT, 0.1, 0, [], None),
        (Trigger.OBSOLESCENCE, 1.0, 0, ["t2"], ReplanOutcome.REFUSED_THRESHOLD),
        (Trigger.OBSOLESCENCE, 1.0, 0, ["t2", "t3"], None),
        (Trigger.OBSOLESCENCE, 1.0, 0, ["t2", "t99"], ReplanOutcome.REFUSED_THRESHOLD),
        (Trigger.NEW_CRITICAL_PATH, 0.69, 5, [], ReplanOutcome.REFUSED_THRESHOLD),
        (Trigger.NEW_CRITICAL_PATH, 0.7, 1, [], ReplanOutcome.REFUSED_THRESHOLD),
        (Trigger.NEW_CRITICAL_PATH, 0.7, 2, [], None),
        (None, 1.0, 5, [], ReplanOutcome.REFUSED_INVALID),
    ],
)
def test_guards_apply_the_trigger_thresholds(
    trigger: Trigger | None,
    confidence: float,
    sources: int,
    affected: list[str],
    expected: ReplanOutcome | None,
) -> None:
    state = _finish(_state(4), "t1", OK)
    verdict = Verdict(
        decision="replan",
        trigger=trigger,
        confidence=confidence,
        corroborating_sources=sources,
        affected_tasks=affected,
    )
    refusal = guard_replan(state, verdict)
    assert (refusal[0] if refusal else None) == expected


def test_the_budget_guard_refuses_once_usage_passes_the_reserve_line() -> None:
    state = _state(2, token_budget=1000, replan_reserve=0.2)
    verdict = Verdict(decision="replan", trigger=Trigger.CONTRADICTION)
    under = apply(
        state,
        UsageRecorded(
            seq=state.seq + 1,
            at=NOW,
            role="executor",
            purpose="execute",
            usage=TokenUsage(input_tokens=799),
        ),
    )
    assert guard_replan(under, verdict) is None
    over = apply(
        under,
        UsageRecorded(
            seq=under.seq + 1,
            at=NOW,
            role="executor",
            purpose="execute",
            usage=TokenUsage(output_tokens=1),
        ),
    )
    refusal = guard_replan(over, verdict)
    assert refusal is not None
    assert refusal[0] is ReplanOutcome.REFUSED_BUDGET


def test_the_budget_guard_counts_the_tokens_the_live_meter_is_ahead_by() -> None:
    # The journal knows of none yet; calls still running have used 800.
    state = _state(2, token_budget=1000, replan_reserve=0.2)
    verdict = Verdict(decision="replan", trigger=Trigger.CONTRADICTION)
    assert guard_replan(state, verdict, used=799) is None
    refusal = guard_replan(state, verdict, used=800)
    assert refusal == (
        ReplanOutcome.REFUSED_BUDGET,
        "800 tokens used of the 800 allowed before the replan reserve",
    )


def _used(state: RunState, tokens: int) -> RunState:
    return apply(
        state,
        UsageRecorded(
            seq=state.seq + 1,
            at=NOW,
            role="executor",
            purpose="execute",
            usage=TokenUsage(input_tokens=tokens),
        ),
    )


def test_the_token_budget_is_spent_once_usage_reaches_it() -> None:
    under = _used(_state(2, token_budget=100), 99)
    assert budget_spent(under) is None
    spent = budget_spent(_used(under, 1))
    assert spent is not None
    assert spent.startswith("token_budget")


@pytest.mark.parametrize(
    ("trigger", "used"),
    [
        pytest.param(Trigger.OBSOLESCENCE, 0, id="before-the-thresholds"),
        pytest.param(Trigger.CONTRADICTION, 90, id="before-the-budget"),
    ],
)
def test_the_ceiling_guard_comes_first(trigger: Trigger, used: int) -> None:
    state = _used(_state(2, max_replans=0, token_budget=100), used)
    verdict = Verdict(decision="replan", trigger=trigger)
    refusal = guard_replan(state, verdict)
    assert refusal is not None
    assert refusal[0] is ReplanOutcome.REFUSED_CEILING


@pytest.mark.parametrize("flags", list(product([True, False], repeat=4)))
def test_drift_means_more_than_half_of_the_new_tasks_off_goal(
    flags: tuple[bool, ...],
) -> None:
    off = flags.count(False)
    assert (drifted(Alignment(aligned=list(flags)), len(flags)) is not None) == (
        off * 2 > len(flags)
    )


def test_missing_alignment_flags_count_as_off_goal() -> None:
    assert drifted(Alignment(aligned=[True]), 3) is not None


def test_clean_results_without_findings_continue_without_the_model() -> None:
    state = _finish(_state(3), "t1", OK)
    verdict = heuristic_verdict(state)
    assert verdict is not None
    assert verdict.decision == "continue"


@pytest.mark.parametrize(
    "outcome",
    [
        TaskOutcome(success=True, summary="done", findings=["news"]),
        TaskOutcome(success=True, summary="  "),
        TaskOutcome(success=False, reason="broken"),
        TaskOutcome(success=False, summary="half of it", reason="broken"),
    ],
)
def test_findings_empty_results_and_failures_need_the_reviewer(
    outcome: TaskOutcome,
) -> None:
    state = _finish(_finish(_state(3), "t1", OK), "t2", outcome)
    assert heuristic_verdict(state) is None


def test_a_plan_that_produced_nothing_aborts() -> None:
    state = _finish(_state(2), "t1", TaskOutcome(success=False, reason="down"))
    verdict = heuristic_verdict(state)
    assert verdict is not None
    assert verdict.decision == "abort"


def test_milestones_come_every_n_completed_tasks_or_at_flagged_tasks() -> None:
    state = _state(5, milestone_every=2)
    state = _finish(state, "t1", OK)
    assert not milestone_due(state, "t1")
    state = _finish(state, "t2", OK)
    assert milestone_due(state, "t2")
    flagged = RunSpec(
        goal="g", tasks=[TaskDraft(key="a", description="a", milestone=True)]
    )
    s = apply(None, RunSubmitted(seq=1, at=NOW, run_id="r", spec=flagged))
    assert flagged.tasks is not None
    s = apply(
        s,
        PlanCreated(
            seq=2,
            at=NOW,
            version=build_version(
                s,
                flagged.tasks,
                trigger=None,
                reason="",
                phase="main",
                replace_pending=False,
            ),
        ),
    )
    assert milestone_due(_finish(s, "t1", OK), "t1")


def test_failed_tasks_do_not_count_toward_milestone_every() -> None:
    state = _state(5, chain=False, milestone_every=2)
    state = _finish(state, "t1", TaskOutcome(success=False, reason="down"))
    assert not milestone_due(state, "t1")
    state = _finish(state, "t2", OK)
    assert not milestone_due(state, "t2")
    state = _finish(state, "t3", OK)
    assert milestone_due(state, "t3")


def test_a_transient_failure_puts_the_task_back_without_filling_the_window() -> None:
    state = _finish(_state(2), "t1", TaskOutcome(success=False, transient=True))
    assert state.tasks["t1"].status is TaskStatus.PENDING
    assert state.window == []


def test_a_replan_version_supersedes_pending_tasks_and_preserves_the_rest() -> None:
    state = _finish(_state(3), "t1", OK)
    drafts = [TaskDraft(key="n", description="new", depends_on=["t1"])]
    version = build_version(
        state,
        drafts,
        trigger=Trigger.CONTRADICTION,
        reason="r",
        phase="main",
        replace_pending=True,
    )
    assert version.removed == ["t2", "t3"]
    assert version.added == ["t4"]
    assert version.preserved == ["t1"]
    assert version.tasks_after[-1].depends_on == ["t1"]


def test_a_replan_may_not_depend_on_a_task_it_supersedes() -> None:
    state = _finish(_state(3), "t1", OK)
    with pytest.raises(ValueError, match="unknown 't2'"):
        build_version(
            state,
            [TaskDraft(key="n", description="n", depends_on=["t2"])],
            trigger=Trigger.CONTRADICTION,
            reason="",
            phase="main",
            replace_pending=True,
        )


def test_apply_rejects_events_out_of_order() -> None:
    state = _state(2)
    with pytest.raises(ValueError, match="expected event seq"):
        apply(state, TaskStarted(seq=state.seq + 2, at=NOW, task_id="t1", attempt=1))


def test_new_tasks_are_what_validating_them_would_build() -> None:
    state = _finish(_state(2), "t1", OK)
    drafts = [
        TaskDraft(key="a", description="first", depends_on=["t1"], milestone=True),
        TaskDraft(
            key="b", description="second", depends_on=["a"], requires_approval=True
        ),
    ]
    version = build_version(
        state,
        drafts,
        trigger=Trigger.CONTRADICTION,
        reason="r",
        phase="synthesis",
        replace_pending=True,
    )
    built = version.tasks_after[-2:]
    common: dict[str, Any] = {"phase": "synthesis", "version": 2}
    validated = [
        Task(
            id="t3",
            key="a",
            description="first",
            depends_on=["t1"],
            milestone=True,
            requires_approval=False,
            **common,
        ),
        Task(
            id="t4",
            key="b",
            description="second",
            depends_on=["t3"],
            milestone=False,
            requires_approval=True,
            **common,
        ),
    ]
    assert built == validated
    for task, expected in zip(built, validated, strict=True):
        assert task.model_fields_set == expected.model_fields_set
        assert task.model_dump_json() == expected.model_dump_json()
    # Each task has a list of its own: a draft's list is never shared.
    assert built[0].depends_on is not drafts[0].depends_on


@given(
    st.lists(st.lists(st.sampled_from("abcdefgh"), max_size=4), min_size=1, max_size=8),
    st.integers(min_value=0, max_value=12),
)
def test_last_findings_are_the_tail_of_all_findings(
    per_task: list[list[str]], count: int
) -> None:
    state = _state(len(per_task), chain=False)
    # Completed in reverse plan order, so completion order is not plan order.
    for index in reversed(range(len(per_task))):
        outcome = TaskOutcome(success=True, findings=per_task[index])
        state = _finish(state, f"t{index + 1}", outcome)

    everything = state.findings()
    assert state.last_findings(count) == (everything[-count:] if count else [])
