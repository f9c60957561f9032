"""Plans from the planner: an invalid one is asked for once more, naming why.

A first plan, a hybrid boundary or a revision that is no valid plan (a
cycle, a key used twice, a dependency on nothing, a first plan without
tasks) gets one more request with the problem in ``plan_problem``. A second
invalid answer fails the run (first plan, boundary) or is refused as invalid
(a revision: the run goes on with its plan).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from scripts import (
    GOAL,
    all_aligned,
    chain,
    clean,
    first_then_continue,
    fresh_tasks,
    keep_going,
    replan_verdict,
    run_to_end,
    scripted,
    spec,
    synthesize,
    with_finding,
)

from replan import (
    Limits,
    ModelRequest,
    PlanProposal,
    ReplanOutcome,
    RunSpec,
    ScriptedModel,
    TaskDraft,
    TokenUsage,
)
from replan.messages import PlanCreated, RunStatus

CYCLE = PlanProposal(
    tasks=[
        TaskDraft(key="a", description="a", depends_on=["b"]),
        TaskDraft(key="b", description="b", depends_on=["a"]),
    ],
    rationale="a plan that cannot start",
)
UNKNOWN = PlanProposal(
    tasks=[TaskDraft(key="a", description="a", depends_on=["nowhere"])],
    rationale="a plan that needs a task nobody planned",
)
TWICE = PlanProposal(
    tasks=[TaskDraft(key="a", description="a"), TaskDraft(key="a", description="b")],
    rationale="a plan with one key for two tasks",
)
EMPTY = PlanProposal(tasks=[], rationale="nothing to do")
GOOD = PlanProposal(tasks=chain(2), rationale="two steps")


def answers(*proposals: PlanProposal) -> Callable[[ModelRequest], PlanProposal]:
    """Answer each call with the next proposal; the last one ever after."""
    queue: Iterator[PlanProposal] = iter(proposals)
    last = proposals[-1]

    def answer(request: ModelRequest) -> PlanProposal:
        nonlocal last
        last = next(queue, last)
        return last

    return answer


def planned(plan: Callable[[ModelRequest], Any]) -> ScriptedModel:
    return scripted(plan=plan, usage=TokenUsage(input_tokens=10, output_tokens=5))


@pytest.mark.parametrize(
    ("invalid", "problem"),
    [
        (CYCLE, "tasks a, b depend on each other in a cycle"),
        (UNKNOWN, "task 'a' depends on unknown 'nowhere'"),
        (TWICE, "task key 'a' appears twice"),
        (EMPTY, "the planner proposed no tasks"),
    ],
    ids=["cycle", "unknown-dependency", "duplicate-key", "no-tasks"],
)
async def test_an_invalid_first_plan_is_asked_for_once_more_naming_the_problem(
    invalid: PlanProposal, problem: str
) -> None:
    model = planned(answers(invalid, GOOD))

    done = await run_to_end(model, RunSpec(goal=GOAL, pattern="discovery"))

    assert done.result.status is RunStatus.COMPLETED
    first, second = model.calls_for("planner", "plan")
    assert "plan_problem" not in first.context
    assert second.context["plan_problem"] == problem
    assert [t.key for t in done.result.tasks] == ["s1", "s2"]
    # Both answers cost tokens, and the journal says so.
    assert done.result.usage.by_role["planner"].total_tokens == 30
    assert done.replayed == done.result


async def test_a_second_invalid_first_plan_fails_the_run() -> None:
    model = planned(answers(CYCLE, UNKNOWN, GOOD))

    done = await run_to_end(model, RunSpec(goal=GOAL, pattern="discovery"))

    assert done.result.status is RunStatus.FAILED
    assert done.result.stop_reason == (
        "the first plan is invalid: task 'a' depends on unknown 'nowhere'"
    )
    assert len(model.calls_for("planner", "plan")) == 2
    assert not any(isinstance(e, PlanCreated) for e in done.events)
    assert done.result.usage.by_role["planner"].total_tokens == 30
    assert done.replayed == done.result


async def test_an_unachievable_goal_is_not_asked_again() -> None:
    unachievable = PlanProposal(rationale="out of reach", achievable=False)
    model = planned(answers(unachievable, GOOD))

    done = await run_to_end(model, RunSpec(goal=GOAL, pattern="discovery"))

    assert done.result.status is RunStatus.ABORTED
    assert done.result.stop_reason == (
        "the planner found the goal unachievable: out of reach"
    )
    assert len(model.calls_for("planner", "plan")) == 1


def hybrid_model(*boundaries: PlanProposal) -> ScriptedModel:
    boundary = answers(*boundaries)

    def handler(request: ModelRequest) -> Any:
        match request.role, request.purpose:
            case "planner", "boundary":
                return boundary(request)
            case "executor", "execute":
                return clean(request)
            case "executor", "synthesize":
                return synthesize(request)
            case "reviewer", "milestone":
                return keep_going(request)
        raise AssertionError(f"unexpected {request.role}/{request.purpose}")

    return ScriptedModel(handler)


async def test_an_invalid_boundary_plan_is_asked_for_once_more() -> None:
    model = hybrid_model(TWICE, fresh_tasks(2, "syn"))

    done = await run_to_end(model, RunSpec(goal=GOAL, pattern="hybrid", tasks=chain(2)))

    assert done.result.status is RunStatus.COMPLETED
    first, second = model.calls_for("planner", "boundary")
    assert "plan_problem" not in first.context
    assert second.context["plan_problem"] == "task key 'a' appears twice"
    synthesis = [t.key for t in done.result.tasks if t.phase == "synthesis"]
    assert synthesis == ["syn1", "syn2"]
    assert done.replayed == done.result


async def test_a_second_invalid_boundary_plan_fails_the_run() -> None:
    model = hybrid_model(CYCLE)

    done = await run_to_end(model, RunSpec(goal=GOAL, pattern="hybrid", tasks=chain(2)))

    assert done.result.status is RunStatus.FAILED
    assert done.result.stop_reason == (
        "the boundary plan is invalid: tasks a, b depend on each other in a cycle"
    )
    assert len(model.calls_for("planner", "boundary")) == 2
    assert done.replayed == done.result


async def test_an_unachievable_boundary_aborts_at_once_keeping_the_collection() -> None:
    unachievable = PlanProposal(rationale="the sources disagree", achievable=False)
    model = hybrid_model(unachievable, fresh_tasks(2, "syn"))

    done = await run_to_end(model, RunSpec(goal=GOAL, pattern="hybrid", tasks=chain(2)))

    assert done.result.status is RunStatus.ABORTED
    assert done.result.stop_reason == (
        "the planner found the goal unachievable at the boundary: the sources disagree"
    )
    assert len(model.calls_for("planner", "boundary")) == 1
    assert done.statuses() == {"t1": "completed", "t2": "completed"}
    assert model.calls_for("executor", "synthesize") == []
    assert done.replayed == done.result


async def test_an_invalid_revision_is_asked_for_once_more_from_the_planner_alone() -> (
    None
):
    # Three candidates are ranked and evolved into one revision; the evolver's
    # revision is invalid, so the planner alone is asked for a fixed one.
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        replan=answers(
            fresh_tasks(1, "x"),
            fresh_tasks(1, "y"),
            fresh_tasks(1, "z"),
            fresh_tasks(2, "fixed"),
        ),
        evolve=lambda r: UNKNOWN,
        alignment=all_aligned,
    )
    run_spec = spec(chain(3), milestone_every=1, max_concurrency=1)
    run_spec = run_spec.model_copy(
        update={"limits": Limits(milestone_every=1, replan_candidates=3)}
    )

    done = await run_to_end(model, run_spec)

    assert done.outcomes() == [ReplanOutcome.APPLIED]
    asks = model.calls_for("planner", "replan")
    assert len(asks) == 4
    assert all("plan_problem" not in a.context for a in asks[:3])
    assert asks[3].context["plan_problem"] == "task 'a' depends on unknown 'nowhere'"
    assert "candidate" not in asks[3].context
    assert len(model.calls_for("evolver", "evolve")) == 1
    revised = done.result.versions[-1]
    assert [t.key for t in revised.tasks_after if t.id in revised.added] == [
        "fixed1",
        "fixed2",
    ]
    assert done.result.status is RunStatus.COMPLETED
    assert done.replayed == done.result


async def test_a_second_invalid_revision_is_refused_and_the_plan_kept() -> None:
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        replan=answers(CYCLE, TWICE, fresh_tasks(1)),
    )

    done = await run_to_end(model, spec(chain(3), milestone_every=1))

    assert done.outcomes() == [ReplanOutcome.REFUSED_INVALID]
    assert done.result.replans[0].reason == (
        "invalid proposal: task key 'a' appears twice"
    )
    assert len(model.calls_for("planner", "replan")) == 2
    assert len(done.result.versions) == 1
    assert done.statuses() == {"t1": "completed", "t2": "completed", "t3": "completed"}
    assert done.replayed == done.result


async def test_a_usage_that_reports_no_calls_counts_each_answer_as_one_call() -> None:
    # ``planned`` scripts TokenUsage(input_tokens=10, output_tokens=5), as a
    # user writes it: without ``calls``. Every answer is still one call.
    model = planned(answers(CYCLE, GOOD))

    done = await run_to_end(model, RunSpec(goal=GOAL, pattern="discovery"))

    assert done.result.status is RunStatus.COMPLETED
    by_role = done.result.usage.by_role
    assert by_role["planner"].calls == len(model.calls_for("planner", "plan")) == 2
    assert by_role["executor"].calls == len(model.calls_for("executor")) == 3
    assert done.result.usage.total.calls == len(model.calls)
    assert done.replayed == done.result
