"""Replans with K candidates: critique each, rank by tournament, evolve the best."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

import replan
from replan import (
    Alignment,
    Comparison,
    Critique,
    Limits,
    ModelRequest,
    PlanProposal,
    ReplanOutcome,
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
)

CHAIN = [
    TaskDraft(key="a", description="measure", milestone=True),
    TaskDraft(key="b", description="fit", depends_on=["a"]),
    TaskDraft(key="c", description="report", depends_on=["b"]),
]
EVOLVED = [
    TaskDraft(key="evolved-1", description="refit", depends_on=["t1"]),
    TaskDraft(key="evolved-2", description="report again", depends_on=["evolved-1"]),
]


def candidate(index: int) -> PlanProposal:
    return PlanProposal(
        tasks=[
            TaskDraft(
                key=f"cand{index}", description=f"option {index}", depends_on=["t1"]
            )
        ],
        rationale=f"candidate {index}",
    )


def critique(index: int) -> Critique:
    return Critique(scores={"feasibility": index / 10}, critique=f"critique {index}")


def scripted(beats: Callable[[int, int], bool]) -> ScriptedModel:
    """``beats(i, j)``: candidate i wins its comparison against j."""

    def handler(request: ModelRequest) -> Any:
        ctx = request.context
        match (request.role, request.purpose):
            case ("planner", "replan"):
                return candidate(ctx.get("candidate", 0))
            case ("reviewer", "critique"):
                return critique(ctx["candidate_index"])
            case ("ranker", "compare"):
                return Comparison(
                    winner="a" if beats(ctx["a_index"], ctx["b_index"]) else "b"
                )
            case ("evolver", "evolve"):
                return PlanProposal(tasks=EVOLVED, rationale="evolved")
            case ("executor", "execute"):
                task = ctx["task"]
                findings = ["the fit is off"] if task.key == "a" else []
                return TaskOutcome(success=True, summary="ok", findings=findings)
            case ("executor", "synthesize"):
                return Synthesis(output="done")
            case ("reviewer", "milestone"):
                if ctx["milestone_index"] == 1:
                    return Verdict(
                        decision="replan",
                        trigger=Trigger.CONTRADICTION,
                        rationale="the fit is off",
                    )
                return Verdict(decision="continue")
            case ("ranker", "alignment"):
                return Alignment(aligned=[True] * len(ctx["proposed"]))
        raise AssertionError(f"unexpected request {request.role}/{request.purpose}")

    return ScriptedModel(handler)


async def run(model: ScriptedModel, candidates: int) -> replan.RunResult:
    spec = RunSpec(
        goal="fit the model", tasks=CHAIN, limits=Limits(replan_candidates=candidates)
    )
    async with Supervisor(model) as sup:
        handle = await sup.submit(spec)
        with anyio.fail_after(10):
            return await handle.result()


def one_is_best(i: int, j: int) -> bool:
    """Candidate 1 beats everyone; otherwise the lower index wins."""
    if 1 in (i, j):
        return i == 1
    return i < j


async def test_three_candidates_are_planned_critiqued_and_compared_pairwise() -> None:
    model = scripted(one_is_best)
    result = await run(model, 3)

    assert result.status is RunStatus.COMPLETED
    replans = model.calls_for("planner", "replan")
    assert [c.context["candidate"] for c in replans] == [0, 1, 2]
    assert all(c.context["candidates"] == 3 for c in replans)
    assert all(c.temperature == 0.0 for c in replans)
    critiques = model.calls_for("reviewer", "critique")
    assert [c.context["candidate_index"] for c in critiques] == [0, 1, 2]
    assert [c.context["candidate"] for c in critiques] == [
        candidate(i) for i in range(3)
    ]
    compares = model.calls_for("ranker", "compare")
    pairs = sorted((c.context["a_index"], c.context["b_index"]) for c in compares)
    assert pairs == [(0, 1), (0, 2), (1, 2)]
    for call in compares:
        assert call.context["a"] == candidate(call.context["a_index"])
        assert call.context["b"] == candidate(call.context["b_index"])
    # Every call of the replan is accounted for in the run's usage.
    usage = result.usage.by_role
    assert usage["planner"].calls == 3
    assert usage["reviewer"].calls == 3 + len(model.calls_for("reviewer", "milestone"))
    assert usage["ranker"].calls == 3 + 1  # the comparisons and the alignment check
    assert usage["evolver"].calls == 1


async def test_the_evolver_refines_the_tournament_winner_with_its_critique() -> None:
    model = scripted(one_is_best)
    await run(model, 3)

    (evolve,) = model.calls_for("evolver", "evolve")
    assert evolve.context["candidate"] == candidate(1)
    assert evolve.context["critiques"] == [critique(1)]


async def test_the_applied_version_is_the_evolvers_output_not_a_candidate() -> None:
    model = scripted(one_is_best)
    result = await run(model, 3)

    assert [r.outcome for r in result.replans] == [ReplanOutcome.APPLIED]
    version = result.versions[-1]
    by_id = {t.id: t for t in result.tasks}
    assert [by_id[i].key for i in version.added] == ["evolved-1", "evolved-2"]
    assert not any(t.key.startswith("cand") for t in result.tasks)
    assert all(by_id[i].status is TaskStatus.COMPLETED for i in version.added)
    # The alignment check judged what was applied.
    (alignment,) = model.calls_for("ranker", "alignment")
    assert alignment.context["proposed"] == EVOLVED


async def test_an_evolver_giving_up_on_the_goal_leaves_the_winner_applied() -> None:
    # Only the planner judges whether the goal can be reached: a refinement
    # that says it cannot is no refinement, and aborts nothing.
    model = scripted(one_is_best)
    inner = model.generate

    async def generate(request: ModelRequest) -> Any:
        if request.role == "evolver":
            answer = PlanProposal(tasks=[], rationale="hopeless", achievable=False)
            return replan.ModelResponse(output=answer)
        return await inner(request)

    model.generate = generate  # type: ignore[method-assign]
    result = await run(model, 3)

    assert result.status is RunStatus.COMPLETED
    assert [r.outcome for r in result.replans] == [ReplanOutcome.APPLIED]
    version = result.versions[-1]
    by_id = {t.id: t for t in result.tasks}
    assert [by_id[i].key for i in version.added] == ["cand1"]


# Four candidates: 0 beats 1; 1 beats 2; 2 beats 0 and 3; 3 beats 0 and 1.
# Wins: [1, 1, 2, 2]: candidates 2 and 3 tie at the top.
FOUR_WAY = {(0, 1), (1, 2), (2, 0), (2, 3), (3, 0), (3, 1)}


@pytest.mark.parametrize(
    ("beats", "winner"),
    [
        pytest.param(lambda i, j: (i, j) in FOUR_WAY, 2, id="tie-between-2-and-3"),
        pytest.param(lambda i, j: i > j, 3, id="highest-index-wins-all"),
    ],
)
async def test_a_tie_in_the_tournament_goes_to_the_lower_index(
    beats: Callable[[int, int], bool], winner: int
) -> None:
    model = scripted(beats)
    await run(model, 4)

    assert len(model.calls_for("ranker", "compare")) == 6
    (evolve,) = model.calls_for("evolver", "evolve")
    assert evolve.context["candidate"] == candidate(winner)
    assert evolve.context["critiques"] == [critique(winner)]


async def test_a_single_candidate_is_applied_without_critique_ranking_or_evolving() -> (
    None
):
    model = scripted(one_is_best)
    result = await run(model, 1)

    (replan_call,) = model.calls_for("planner", "replan")
    assert "candidate" not in replan_call.context
    assert model.calls_for("reviewer", "critique") == []
    assert model.calls_for("ranker", "compare") == []
    assert model.calls_for("evolver") == []
    version = result.versions[-1]
    by_id = {t.id: t for t in result.tasks}
    assert [by_id[i].key for i in version.added] == ["cand0"]
