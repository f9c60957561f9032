"""The offline demo scenario, run in-process on both anyio backends."""

from __future__ import annotations

from typing import Literal

from replan import (
    GateResolution,
    ReplanOutcome,
    RunResult,
    RunState,
    RunStatus,
    ScriptedModel,
    Supervisor,
    TaskStatus,
    Trigger,
)
from replan._demo import demo_model, demo_spec
from replan.messages import GateOpened

TRANSFORMER_TASKS = {
    "t2": "Extract key findings from the top results",
    "t3": "Identify common themes across the findings",
    "t4": "Draft a summary of the field",
}


async def run_demo(
    decision: Literal["approve", "reject"],
    pattern: Literal["contract", "discovery", "hybrid"] = "discovery",
) -> tuple[RunResult, RunState, ScriptedModel]:
    model = demo_model()
    async with Supervisor(model=model) as sup:
        handle = await sup.submit(demo_spec().model_copy(update={"pattern": pattern}))
        async for event in handle.events():
            if isinstance(event, GateOpened):
                await sup.gates.resolve(
                    event.request.gate_id,
                    GateResolution(decision=decision, by="test"),
                )
        result = await handle.result()
        return result, handle.state, model


async def test_the_demo_replans_once_for_a_scope_shift_approved_at_the_gate() -> None:
    result, state, _ = await run_demo("approve")

    assert result.status is RunStatus.COMPLETED
    assert [r.outcome for r in result.replans] == [ReplanOutcome.APPLIED]
    assert result.replans[0].trigger is Trigger.SCOPE_SHIFT
    assert [g.resolution.decision for g in state.gates.values() if g.resolution] == [
        "approve"
    ]
    assert [v.version for v in result.versions] == [1, 2]
    first, second = result.versions
    assert [t.description for t in first.tasks_after] == [
        "Search recent papers on transformer efficiency",
        *TRANSFORMER_TASKS.values(),
    ]
    assert second.trigger is Trigger.SCOPE_SHIFT
    assert second.approved_by == "test"
    assert second.preserved == ["t1"]
    removed = {t.id: t.description for t in second.tasks_before}
    assert {i: removed[i] for i in second.removed} == TRANSFORMER_TASKS
    added = [t for t in second.tasks_after if t.id in second.added]
    assert [t.key for t in added] == [
        "ssm_literature",
        "efficient_transformers",
        "compare",
        "field_summary",
    ]
    assert "state space model" in added[0].description
    assert result.output is not None
    assert "state space models" in result.output
    assert any("Mamba" in source for source in state.sources)


async def test_the_new_tasks_run_and_the_replaced_ones_never_do() -> None:
    result, _, model = await run_demo("approve")

    status = {t.id: t.status for t in result.tasks}
    assert {i: status[i] for i in TRANSFORMER_TASKS} == dict.fromkeys(
        TRANSFORMER_TASKS, TaskStatus.SUPERSEDED
    )
    assert [status[i] for i in ("t1", "t5", "t6", "t7", "t8")] == [
        TaskStatus.COMPLETED
    ] * 5
    executed = [c.context["task"].id for c in model.calls_for("executor", "execute")]
    assert sorted(executed) == ["t1", "t5", "t6", "t7", "t8"]


async def test_only_the_first_milestone_needs_the_reviewer_model() -> None:
    result, _, model = await run_demo("approve")

    assert len(model.calls_for("reviewer", "milestone")) == 1
    assert result.iterations == 3  # the later reviews were the cheap heuristic
    assert len(model.calls_for("planner", "replan")) == 1
    assert len(model.calls_for("executor", "synthesize")) == 1


async def test_the_demo_reports_token_usage_for_every_role_it_called() -> None:
    result, _, model = await run_demo("approve")

    assert set(result.usage.by_role) == {"planner", "executor", "reviewer", "ranker"}
    assert result.usage.total.calls == len(model.calls)
    assert all(u.input_tokens > 0 for u in result.usage.by_role.values())
    assert all(u.output_tokens > 0 for u in result.usage.by_role.values())


async def test_two_demo_runs_give_the_same_result_apart_from_the_run_id() -> None:
    first, _, _ = await run_demo("approve")
    second, _, _ = await run_demo("approve")

    assert first.run_id != second.run_id
    assert first.model_dump(exclude={"run_id"}) == second.model_dump(exclude={"run_id"})


async def test_rejecting_the_gate_finishes_the_original_transformer_plan() -> None:
    result, _, _ = await run_demo("reject")

    assert result.status is RunStatus.COMPLETED
    assert [r.outcome for r in result.replans] == [ReplanOutcome.REJECTED_BY_HUMAN]
    assert [v.version for v in result.versions] == [1]
    assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 4
    assert result.output is not None
    assert "attention-based models only" in result.output


async def test_the_demo_script_crosses_a_hybrid_runs_boundary() -> None:
    # scripted:demo answers runs of every pattern (replan run --pattern,
    # the daemon's default model), a hybrid run's boundary too.
    result, _, model = await run_demo("approve", pattern="hybrid")

    assert result.status is RunStatus.COMPLETED, result.stop_reason
    assert len(model.calls_for("planner", "boundary")) == 1
    phases = {t.key: (t.phase, t.status) for t in result.tasks}
    assert phases == {
        "search": ("collection", TaskStatus.COMPLETED),
        "extract": ("collection", TaskStatus.COMPLETED),
        "themes": ("collection", TaskStatus.COMPLETED),
        "summary": ("collection", TaskStatus.COMPLETED),
        "compare": ("synthesis", TaskStatus.COMPLETED),
        "field_summary": ("synthesis", TaskStatus.COMPLETED),
    }
    assert result.output is not None
    assert "state space models" in result.output
