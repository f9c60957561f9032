"""What each verdict does, and the guards a replan verdict must pass."""

from __future__ import annotations

import anyio
import pytest
from scripts import (
    GOAL,
    SYNTHESIS,
    chain,
    executed_ids,
    first_then_continue,
    fresh_tasks,
    replan_verdict,
    run_to_end,
    scripted,
    spec,
    task_of,
    with_finding,
)

from replan import (
    Alignment,
    ModelRequest,
    PlanProposal,
    ReplanOutcome,
    RunStatus,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    TokenUsage,
    Trigger,
    Verdict,
)
from replan.messages import MilestoneReviewed, TaskStarted

USAGE = TokenUsage(input_tokens=10, output_tokens=5, calls=1)


def fan_out(dependents: int) -> list[TaskDraft]:
    """t1, then ``dependents`` tasks (t2...) that all wait for it."""
    return [
        TaskDraft(key="root", description="survey the field"),
        *(
            TaskDraft(key=f"d{i}", description=f"follow-up {i}", depends_on=["root"])
            for i in range(1, dependents + 1)
        ),
    ]


# complete ----------------------------------------------------------------------


async def test_complete_supersedes_every_pending_task_and_ends_with_synthesis() -> None:
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(
            Verdict(decision="complete", rationale="the question is answered")
        ),
    )

    done = await run_to_end(model, spec(chain(5), milestone_every=2))

    result = done.result
    assert done.statuses() == {
        "t1": "completed",
        "t2": "completed",
        "t3": "superseded",
        "t4": "superseded",
        "t5": "superseded",
    }
    assert executed_ids(model) == ["t1", "t2"]
    assert result.status is RunStatus.COMPLETED
    assert result.stop_reason is None
    assert result.output == SYNTHESIS
    (synthesis,) = model.calls_for("executor", "synthesize")
    assert [t.id for t in synthesis.context["completed"]] == ["t1", "t2"]
    assert len(model.calls_for("reviewer", "milestone")) == 1
    assert done.replayed == result


async def test_complete_ends_the_run_even_while_another_task_is_in_flight() -> None:
    # Regression: the finishing task used to make a new milestone, and a
    # replan verdict there added and ran new tasks after `complete`.
    release = anyio.Event()

    async def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).key == "slow":
            await release.wait()
        return with_finding(request)

    def milestone(request: ModelRequest) -> Verdict:
        if request.context["milestone_index"] == 1:
            release.set()
            return Verdict(decision="complete", rationale="the question is answered")
        return replan_verdict()

    model = scripted(
        execute=execute, milestone=milestone, replan=lambda r: fresh_tasks(2)
    )
    drafts = [
        TaskDraft(key="fast", description="the quick answer"),
        TaskDraft(key="slow", description="a long survey"),
        TaskDraft(key="more", description="more detail", depends_on=["fast"]),
    ]

    done = await run_to_end(model, spec(drafts, milestone_every=1))

    completed_at = next(
        i
        for i, e in enumerate(done.events)
        if isinstance(e, MilestoneReviewed) and e.verdict.decision == "complete"
    )
    assert not any(isinstance(e, TaskStarted) for e in done.events[completed_at:])
    assert len(model.calls_for("reviewer", "milestone")) == 1
    assert model.calls_for("planner", "replan") == []
    assert len(done.result.versions) == 1
    assert done.task("t3").status is TaskStatus.SUPERSEDED
    assert done.result.status is RunStatus.COMPLETED
    assert done.result.output == SYNTHESIS


async def test_after_complete_a_transient_failure_in_flight_is_not_retried() -> None:
    # Regression: the failed attempt went back to pending and started again,
    # although `complete` had superseded every pending task.
    release = anyio.Event()

    async def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).key == "slow":
            await release.wait()
            return TaskOutcome(success=False, transient=True, reason="rate limited")
        return with_finding(request)

    def milestone(request: ModelRequest) -> Verdict:
        release.set()
        return Verdict(decision="complete", rationale="the question is answered")

    model = scripted(execute=execute, milestone=milestone)
    drafts = [
        TaskDraft(key="fast", description="the quick answer", milestone=True),
        TaskDraft(key="slow", description="a long survey"),
    ]

    done = await run_to_end(model, spec(drafts, max_task_attempts=3))

    assert executed_ids(model) == ["t1", "t2"]
    slow = done.task("t2")
    assert slow.status is TaskStatus.SUPERSEDED
    assert slow.attempts == 1
    assert slow.result is not None
    assert slow.result.reason == "rate limited"
    assert done.result.status is RunStatus.COMPLETED
    assert done.replayed == done.result


# abort -------------------------------------------------------------------------


async def test_abort_ends_aborted_with_the_rationale_and_keeps_completed_results() -> (
    None
):
    rationale = "the market this goal is about no longer exists"
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(Verdict(decision="abort", rationale=rationale)),
    )

    done = await run_to_end(model, spec(chain(4), milestone_every=2))

    result = done.result
    assert result.status is RunStatus.ABORTED
    assert result.stop_reason == rationale
    assert result.output is None
    assert model.calls_for("executor", "synthesize") == []
    assert executed_ids(model) == ["t1", "t2"]
    for task_id in ("t1", "t2"):
        task = done.task(task_id)
        assert task.status is TaskStatus.COMPLETED
        assert task.result == TaskOutcome(
            success=True,
            summary=f"{task_id} done",
            findings=[f"finding of {task_id}"],
        )
    assert done.task("t3").status is TaskStatus.PENDING
    assert done.task("t4").status is TaskStatus.PENDING
    assert done.replayed == result


async def test_abort_keeps_the_results_of_tasks_that_finished_during_the_review() -> (
    None
):
    # s2..s4 run beside the milestone's review and return while the reviewer
    # still thinks; it then aborts: their results are partial results too.
    returned = 0
    all_returned = anyio.Event()

    async def execute(request: ModelRequest) -> TaskOutcome:
        nonlocal returned
        if task_of(request).key != "s1":
            await anyio.sleep(0.05)
            returned += 1
            if returned == 3:
                all_returned.set()
        return with_finding(request)

    async def slow_abort(request: ModelRequest) -> Verdict:
        await all_returned.wait()
        await anyio.sleep(0.05)  # their reports are in the run's inbox
        return Verdict(decision="abort", rationale="infeasible")

    drafts = [
        TaskDraft(key="s1", description="s1", milestone=True),
        *(TaskDraft(key=f"s{i}", description=f"s{i}") for i in range(2, 5)),
    ]
    model = scripted(execute=execute, milestone=slow_abort, usage=USAGE)
    done = await run_to_end(model, spec(drafts, milestone_every=10))
    result = done.result
    assert result.status is RunStatus.ABORTED
    assert sorted(executed_ids(model)) == ["t1", "t2", "t3", "t4"]
    for task_id in ("t1", "t2", "t3", "t4"):
        task = done.task(task_id)
        assert task.status is TaskStatus.COMPLETED
        assert task.result is not None
        assert task.result.summary == f"{task_id} done"
    # Every attempt's tokens are the run's too.
    assert result.usage.by_role["executor"].calls == 4
    assert done.replayed == result


async def test_an_unachievable_replan_aborts_the_run_with_its_partial_results() -> None:
    rationale = "the market this goal is about no longer exists"
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        replan=lambda r: PlanProposal(tasks=[], rationale=rationale, achievable=False),
    )

    done = await run_to_end(model, spec(chain(4), milestone_every=2))

    result = done.result
    assert result.status is RunStatus.ABORTED
    assert result.stop_reason is not None
    assert rationale in result.stop_reason
    assert done.outcomes() == [ReplanOutcome.ABORTED_INFEASIBLE]
    assert result.replans[0].reason == rationale
    assert len(result.versions) == 1
    assert result.output is None
    assert executed_ids(model) == ["t1", "t2"]
    assert done.statuses() == {
        "t1": "completed",
        "t2": "completed",
        "t3": "pending",
        "t4": "pending",
    }
    assert done.replayed == result


# obsolescence -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("affected", "outcome"),
    [
        pytest.param(["t2"], ReplanOutcome.REFUSED_THRESHOLD, id="one-pending"),
        pytest.param(
            ["t1", "t2"], ReplanOutcome.REFUSED_THRESHOLD, id="one-pending-one-done"
        ),
        pytest.param(["t2", "t3"], ReplanOutcome.APPLIED, id="two-pending"),
    ],
)
async def test_obsolescence_needs_at_least_two_affected_pending_tasks(
    affected: list[str], outcome: ReplanOutcome
) -> None:
    verdict = replan_verdict(
        Trigger.OBSOLESCENCE,
        rationale="a vendor report covers these",
        affected_tasks=affected,
    )
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(verdict),
        replan=lambda r: fresh_tasks(1),
    )

    done = await run_to_end(
        model, spec(fan_out(3), milestone_every=1, max_concurrency=1)
    )

    assert done.outcomes() == [outcome]
    if outcome is ReplanOutcome.APPLIED:
        assert len(model.calls_for("planner", "replan")) == 1
        assert [done.task(t).status.value for t in ("t2", "t3", "t4")] == [
            "superseded"
        ] * 3
        assert done.task("t5").status is TaskStatus.COMPLETED
    else:
        assert "obsolescence" in done.result.replans[0].reason
        assert model.calls_for("planner", "replan") == []
        assert len(done.result.versions) == 1
        assert [done.task(t).status.value for t in ("t2", "t3", "t4")] == [
            "completed"
        ] * 3
    assert done.result.status is RunStatus.COMPLETED


# new critical path --------------------------------------------------------------


@pytest.mark.parametrize(
    ("confidence", "sources", "outcome", "why"),
    [
        pytest.param(
            0.69, 5, ReplanOutcome.REFUSED_THRESHOLD, "confidence", id="low-confidence"
        ),
        pytest.param(
            0.95, 1, ReplanOutcome.REFUSED_THRESHOLD, "corroborat", id="uncorroborated"
        ),
        pytest.param(0.7, 2, ReplanOutcome.APPLIED, "", id="both-met"),
    ],
)
async def test_a_new_critical_path_needs_enough_confidence_and_corroboration(
    confidence: float, sources: int, outcome: ReplanOutcome, why: str
) -> None:
    verdict = replan_verdict(
        Trigger.NEW_CRITICAL_PATH,
        rationale="a published dataset answers the question directly",
        confidence=confidence,
        corroborating_sources=sources,
    )
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(verdict),
        replan=lambda r: fresh_tasks(1),
    )

    done = await run_to_end(
        model,
        spec(
            fan_out(2),
            milestone_every=1,
            max_concurrency=1,
            min_confidence=0.7,
            min_corroboration=2,
        ),
    )

    assert done.outcomes() == [outcome]
    (record,) = done.result.replans
    assert record.confidence == confidence
    planned = len(model.calls_for("planner", "replan"))
    if outcome is ReplanOutcome.APPLIED:
        assert planned == 1
        assert record.version == 2
    else:
        assert why in record.reason
        assert planned == 0
        assert len(done.result.versions) == 1
    assert done.result.status is RunStatus.COMPLETED


# goal drift ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("aligned", "outcome"),
    [
        pytest.param([False, False, True], ReplanOutcome.REFUSED_DRIFT, id="2-of-3"),
        pytest.param([False, True, False], ReplanOutcome.REFUSED_DRIFT, id="2-of-3b"),
        pytest.param([False, False, True, True], ReplanOutcome.APPLIED, id="half"),
        pytest.param([True, True, True], ReplanOutcome.APPLIED, id="none"),
    ],
)
async def test_a_replan_where_more_than_half_the_new_tasks_drift_is_refused(
    aligned: list[bool], outcome: ReplanOutcome
) -> None:
    def alignment(request: ModelRequest) -> Alignment:
        assert len(request.context["proposed"]) == len(aligned)
        return Alignment(aligned=aligned)

    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        replan=lambda r: fresh_tasks(len(aligned)),
        alignment=alignment,
    )

    done = await run_to_end(
        model, spec(fan_out(3), milestone_every=1, max_concurrency=1)
    )

    assert done.outcomes() == [outcome]
    assert len(model.calls_for("ranker", "alignment")) == 1
    (record,) = done.result.replans
    pending_then = ("t2", "t3", "t4")
    if outcome is ReplanOutcome.REFUSED_DRIFT:
        # The plan is unchanged: nothing superseded, nothing added.
        assert len(done.result.versions) == 1
        assert [done.task(t).status.value for t in pending_then] == ["completed"] * 3
        assert len(done.result.tasks) == 4
        assert record.proposed is not None
        assert len(record.proposed.added) == len(aligned)
    else:
        assert len(done.result.versions) == 2
        assert [done.task(t).status.value for t in pending_then] == ["superseded"] * 3
        assert len(done.result.tasks) == 4 + len(aligned)
    assert done.result.status is RunStatus.COMPLETED


# what a replan sees and records ------------------------------------------------


async def test_the_planner_gets_the_original_goal_verbatim_when_it_replans() -> None:
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(
            replan_verdict(rationale="prices moved: rethink the survey")
        ),
        replan=lambda r: fresh_tasks(1),
    )

    done = await run_to_end(model, spec(chain(4), milestone_every=2))

    (call,) = model.calls_for("planner", "replan")
    assert call.context["goal"] == GOAL
    assert done.outcomes() == [ReplanOutcome.APPLIED]


async def test_a_plan_version_keeps_the_last_three_findings() -> None:
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        replan=lambda r: fresh_tasks(1),
    )

    done = await run_to_end(model, spec(chain(6), milestone_every=5, max_concurrency=1))

    first, revised = done.result.versions
    assert first.findings_at_replan == []
    assert revised.findings_at_replan == [
        "finding of t3",
        "finding of t4",
        "finding of t5",
    ]
    assert done.replayed == done.result


# invalid -------------------------------------------------------------------------


async def test_a_replan_verdict_without_a_trigger_is_refused_as_invalid() -> None:
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict(trigger=None)),
    )

    done = await run_to_end(
        model, spec(fan_out(2), milestone_every=1, max_concurrency=1)
    )

    assert done.outcomes() == [ReplanOutcome.REFUSED_INVALID]
    assert done.result.replans[0].trigger is None
    assert model.calls_for("planner", "replan") == []
    assert model.calls_for("ranker", "alignment") == []
    assert len(done.result.versions) == 1
    assert done.result.status is RunStatus.COMPLETED


async def test_a_proposal_with_an_unknown_dependency_is_refused_as_invalid() -> None:
    def replan(request: ModelRequest) -> PlanProposal:
        return PlanProposal(
            tasks=[TaskDraft(key="x", description="x", depends_on=["nowhere"])]
        )

    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        replan=replan,
    )

    done = await run_to_end(
        model, spec(fan_out(2), milestone_every=1, max_concurrency=1)
    )

    assert done.outcomes() == [ReplanOutcome.REFUSED_INVALID]
    assert len(done.result.versions) == 1
    assert done.statuses() == {"t1": "completed", "t2": "completed", "t3": "completed"}
