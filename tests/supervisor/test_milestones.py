"""Reviews happen at milestones only, and the heuristic spares the model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import pytest
from scripts import (
    DelegatingStore,
    chain,
    clean,
    executed_ids,
    keep_going,
    replan_verdict,
    run_to_end,
    same_size_chain,
    scripted,
    spec,
    task_of,
    with_finding,
)

from replan import (
    MemoryStore,
    ModelRequest,
    RunStatus,
    Supervisor,
    TaskOutcome,
    TaskStatus,
)
from replan.messages import Event, MilestoneReviewed, TaskFinished
from replan.store import RunSummary


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


class BatchLog(DelegatingStore):
    """Keeps the kinds of each append's events, in order."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.batches: list[list[str]] = []

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        await super().append(run_id, events, summary)
        self.batches.append([e.kind for e in events])


async def test_a_replan_verdict_is_journaled_before_the_planner_is_asked() -> None:
    # A continue verdict is acted on at once and rides with the next starts;
    # a replan verdict is followed by model calls, so it is journaled first.
    store = BatchLog()
    planner_saw: list[list[list[str]]] = []

    def replan_after_seeing_the_journal(request: ModelRequest) -> Any:
        planner_saw.append([list(b) for b in store.batches])
        return same_size_chain(request)

    def continue_then_replan(request: ModelRequest) -> Any:
        if request.context["milestone_index"] == 2:
            return replan_verdict()
        return keep_going(request)

    model = scripted(
        execute=with_finding,
        milestone=continue_then_replan,
        replan=replan_after_seeing_the_journal,
    )
    plan = chain(6, milestone_at=[2, 4])
    with anyio.fail_after(10):
        async with Supervisor(model, store) as sup:
            result = await (await sup.submit(spec(plan, milestone_every=100))).result()
    assert result.status is RunStatus.COMPLETED
    assert [r.outcome.value for r in result.replans] == ["applied"]
    (seen,) = planner_saw
    assert seen[-1][-1] == "milestone_reviewed"  # journaled, on its own
    reviews = [b for b in store.batches if "milestone_reviewed" in b]
    assert len(reviews) == 3  # continue, replan, and the end of the plan
    assert reviews[0][-2:] == ["milestone_reviewed", "task_started"]
    assert reviews[1][-1] == "milestone_reviewed"
