"""What each role and purpose of a plan run is asked (the README's table).

A scripted model answers from ``request.context`` alone, so the keys each
request carries, and the output type it asks for, are part of the API.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from scripts import GOAL, chain, run_to_end

from replan import (
    Alignment,
    Comparison,
    Critique,
    Limits,
    ModelRequest,
    PlanProposal,
    RunSpec,
    ScriptedModel,
    Synthesis,
    TaskDraft,
    TaskOutcome,
    Trigger,
    Verdict,
)
from replan.messages import RunStatus

BASE = {"goal", "metadata", "context"}
REVISION = {"completed", "pending", "findings", "trigger", "verdict"}
TABLE: dict[tuple[str, str], tuple[type[BaseModel], set[str]]] = {
    ("planner", "plan"): (PlanProposal, set()),
    ("planner", "replan"): (PlanProposal, REVISION | {"candidate", "candidates"}),
    ("planner", "boundary"): (PlanProposal, {"completed", "findings"}),
    ("executor", "execute"): (
        TaskOutcome,
        {"task", "dependency_results", "attempt"},
    ),
    ("executor", "synthesize"): (Synthesis, {"completed"}),
    ("reviewer", "milestone"): (
        Verdict,
        {"completed", "pending", "findings", "milestone_index"},
    ),
    ("reviewer", "critique"): (Critique, REVISION | {"candidate", "candidate_index"}),
    ("ranker", "alignment"): (Alignment, {"proposed"}),
    ("ranker", "compare"): (Comparison, REVISION | {"a", "b", "a_index", "b_index"}),
    ("evolver", "evolve"): (PlanProposal, REVISION | {"candidate", "critiques"}),
}
"""The README's table: role and purpose -> output type and context keys
besides ``goal``, ``metadata`` and ``context`` (and ``request_id``)."""


def answer(request: ModelRequest) -> Any:
    """Every row of the table once: an invalid first plan, a milestone that
    replans with two candidates, a hybrid boundary."""
    ctx = request.context
    match request.role, request.purpose:
        case "planner", "plan":
            if "plan_problem" not in ctx:
                return PlanProposal(tasks=[], rationale="nothing yet")
            return PlanProposal(
                tasks=[
                    TaskDraft(key="a", description="measure", milestone=True),
                    TaskDraft(key="b", description="fit", depends_on=["a"]),
                ]
            )
        case "planner", "boundary":
            return PlanProposal(tasks=[TaskDraft(key="s", description="summarize")])
        case "planner", "replan":
            return PlanProposal(
                tasks=[TaskDraft(key="r", description="refit", depends_on=["t1"])]
            )
        case "evolver", "evolve":
            return ctx["candidate"]
        case "executor", "execute":
            found = ["the fit is off"] if ctx["task"].key == "a" else []
            return TaskOutcome(success=True, summary="ok", findings=found)
        case "executor", "synthesize":
            return Synthesis(output="done")
        case "reviewer", "milestone":
            if ctx["milestone_index"] == 1 and "s" not in {
                t.key for t in ctx["completed"]
            }:
                return Verdict(
                    decision="replan",
                    trigger=Trigger.CONTRADICTION,
                    rationale="the fit is off",
                )
            return Verdict(decision="continue")
        case "reviewer", "critique":
            return Critique(scores={"feasibility": 0.5}, critique="plausible")
        case "ranker", "compare":
            return Comparison(winner="a")
        case "ranker", "alignment":
            return Alignment(aligned=[True] * len(ctx["proposed"]))
    raise AssertionError(f"unexpected {request.role}/{request.purpose}")


async def test_every_plan_run_request_carries_the_documented_context() -> None:
    model = ScriptedModel(answer)
    planned = RunSpec(
        goal=GOAL,
        context=["prices from 2024"],
        metadata={"ticket": 7},
        limits=Limits(replan_candidates=2),
    )
    hybrid = planned.model_copy(
        update={"pattern": "hybrid", "tasks": chain(1), "limits": Limits()}
    )

    for spec in (planned, hybrid):
        done = await run_to_end(model, spec)
        assert done.result.status is RunStatus.COMPLETED, done.result.stop_reason

    assert {(c.role, c.purpose) for c in model.calls} == set(TABLE)
    for call in model.calls:
        output, keys = TABLE[call.role, call.purpose]  # type: ignore[index]
        where = (call.role, call.purpose)
        assert call.output_type is output, where
        ctx = call.context
        assert (ctx["goal"], ctx["metadata"]) == (GOAL, {"ticket": 7}), where
        assert ctx["context"] == ["prices from 2024"], where
        extra = {"request_id"} if call.purpose != "execute" else set()
        if call.purpose == "plan" and call is not model.calls_for("planner")[0]:
            extra.add("plan_problem")
        assert set(ctx) == BASE | keys | extra, where
    _, second = model.calls_for("planner", "plan")
    assert second.context["plan_problem"] == "the planner proposed no tasks"
    replans = model.calls_for("planner", "replan")
    assert [(c.context["candidate"], c.context["candidates"]) for c in replans] == [
        (0, 2),
        (1, 2),
    ]
