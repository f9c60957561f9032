"""Reviews happen at milestones only, and the heuristic spares the model."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from scripts import (
    chain,
    clean,
    executed_ids,
    run_to_end,
    scripted,
    spec,
    task_of,
    with_finding,
)

from replan import ModelRequest, RunStatus, TaskOutcome, TaskStatus
from replan.messages import MilestoneReviewed, TaskFinished


async def test_the_reviewer_is_asked_every_milestone_every_completed_tasks() -> None:
    model = scripted(execute=with_finding)

    done = await run_to_end(model, spec(chain(9), milestone_every=3))

    calls = model.calls_for("reviewer", "milestone")
    assert [c.context["milestone_index"] for c in calls] == [1, 2, 3]
    assert [len(c.context["completed"]) for c in calls] == [3, 6, 9]
    assert [t.id for t in calls[0].context["completed"]] == ["t1", "t2", "t3"]
    assert [t.id for t in calls[1].context["pending"]] == ["t7", "t8", "t9"]
    assert [r.by for r in done.reviews()] == ["model"] * 3
    assert [r.index for r in done.reviews()] == [1, 2, 3]
    assert done.result.iterations == 3
    assert done.result.status is RunStatus.COMPLETED


async def test_each_review_comes_right_after_the_task_that_made_the_milestone() -> None:
    model = scripted(execute=with_finding)

    done = await run_to_end(model, spec(chain(9), milestone_every=3))

    finished_before_review = []
    finished = 0
    for event in done.events:
        if isinstance(event, TaskFinished):
            finished += 1
        elif isinstance(event, MilestoneReviewed):
            finished_before_review.append(finished)
    assert finished_before_review == [3, 6, 9]


async def test_a_milestone_task_triggers_a_review_on_its_own() -> None:
    model = scripted(execute=with_finding)

    done = await run_to_end(model, spec(chain(4, milestone_at=[1]), milestone_every=10))

    calls = model.calls_for("reviewer", "milestone")
    # After t1 (the milestone task), then at the end of the phase.
    assert [len(c.context["completed"]) for c in calls] == [1, 4]
    assert [c.context["milestone_index"] for c in calls] == [1, 2]
    assert done.result.status is RunStatus.COMPLETED


async def test_without_a_milestone_task_the_same_run_is_reviewed_only_at_its_end() -> (
    None
):
    model = scripted(execute=with_finding)

    await run_to_end(model, spec(chain(4), milestone_every=10))

    calls = model.calls_for("reviewer", "milestone")
    assert [len(c.context["completed"]) for c in calls] == [4]


async def test_clean_results_without_findings_never_ask_the_reviewer_model() -> None:
    model = scripted(execute=clean)

    done = await run_to_end(model, spec(chain(9), milestone_every=3))

    assert model.calls_for("reviewer", "milestone") == []
    reviews = done.reviews()
    assert len(reviews) == 3
    assert all(r.by == "heuristic" for r in reviews)
    assert all(r.verdict.decision == "continue" for r in reviews)
    assert "reviewer" not in done.result.usage.by_role
    assert done.result.status is RunStatus.COMPLETED


def odd_second_task(outcome: TaskOutcome) -> Callable[[ModelRequest], TaskOutcome]:
    def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).id == "t2":
            return outcome
        return clean(request)

    return execute


@pytest.mark.parametrize(
    ("second", "reviewed_by"),
    [
        pytest.param(
            TaskOutcome(success=False, reason="the page is gone"),
            # t3 is skipped: the failure is reviewed at the end of the phase.
            ["heuristic", "model"],
            id="failed",
        ),
        pytest.param(
            TaskOutcome(success=True, summary=""),
            ["heuristic", "model", "heuristic"],
            id="empty-summary",
        ),
        pytest.param(
            TaskOutcome(success=True, summary="   \n"),
            ["heuristic", "model", "heuristic"],
            id="blank-summary",
        ),
        pytest.param(
            TaskOutcome(success=True, summary="t2 done"),
            ["heuristic", "heuristic", "heuristic"],
            id="clean-control",
        ),
    ],
)
async def test_a_failed_task_or_an_empty_summary_makes_the_heuristic_defer_to_the_model(
    second: TaskOutcome, reviewed_by: list[str]
) -> None:
    model = scripted(execute=odd_second_task(second))

    done = await run_to_end(model, spec(chain(3), milestone_every=1))

    assert [r.by for r in done.reviews()] == reviewed_by
    calls = model.calls_for("reviewer", "milestone")
    assert len(calls) == reviewed_by.count("model")
    if calls:
        assert calls[0].context["milestone_index"] == 2
    assert done.task("t2").result == second


async def test_when_no_task_completed_and_nothing_is_left_the_heuristic_aborts() -> (
    None
):
    def execute(request: ModelRequest) -> TaskOutcome:
        return TaskOutcome(success=False, reason="no access")

    model = scripted(execute=execute)

    done = await run_to_end(model, spec(chain(3), milestone_every=1))

    assert done.result.status is RunStatus.ABORTED
    assert model.calls_for("reviewer", "milestone") == []
    assert [(r.by, r.verdict.decision) for r in done.reviews()] == [
        ("heuristic", "abort")
    ]
    assert executed_ids(model) == ["t1"]
    assert [t.status for t in done.result.tasks] == [
        TaskStatus.FAILED,
        TaskStatus.SKIPPED,
        TaskStatus.SKIPPED,
    ]
