"""Hard limits end a run ``limit_reached`` (never an exception); the budget
reserve refuses replans."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from scripts import (
    chain,
    clean,
    executed_ids,
    first_then_continue,
    fresh_tasks,
    independent,
    replan_verdict,
    run_to_end,
    scripted,
    spec,
    task_of,
    with_finding,
)

from replan import (
    MemoryStore,
    ModelRequest,
    ModelResponse,
    ReplanOutcome,
    RunStatus,
    ScriptedModel,
    Supervisor,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    TokenUsage,
    replay,
    tool,
)
from replan.messages import ToolCall
from replan.supervisor._budget import RunMeter

PER_CALL = TokenUsage(input_tokens=6, output_tokens=4)
"""Every scripted call uses 10 tokens."""


def no_call_started_past(model: ScriptedModel, budget: int) -> bool:
    """Calls are sequential here, so call ``i`` started after ``10 * i`` tokens."""
    return all(10 * i < budget for i in range(len(model.calls)))


@pytest.mark.parametrize(
    ("token_budget", "outcome"),
    [
        pytest.param(100, ReplanOutcome.REFUSED_BUDGET, id="past-the-reserve"),
        pytest.param(1_000, ReplanOutcome.APPLIED, id="control-ample-budget"),
    ],
)
async def test_a_replan_past_the_budget_reserve_is_refused_and_the_run_goes_on(
    token_budget: int, outcome: ReplanOutcome
) -> None:
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        replan=lambda r: fresh_tasks(2),
        usage=PER_CALL,
    )
    # Review 1 comes after 4 executions and its own call: 50 tokens, past the
    # 40 allowed before the 60% reserve of 100, below the budget itself.
    run_spec = spec(
        chain(6),
        milestone_every=4,
        token_budget=token_budget,
        replan_reserve=0.6,
    )

    done = await run_to_end(model, run_spec)

    result = done.result
    assert done.outcomes() == [outcome]
    assert result.status is RunStatus.COMPLETED
    assert result.usage.total.total_tokens < token_budget
    if outcome is ReplanOutcome.REFUSED_BUDGET:
        assert model.calls_for("planner", "replan") == []
        assert "reserve" in result.replans[0].reason
        assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 6
        assert executed_ids(model) == [f"t{i}" for i in range(1, 7)]
    else:
        assert len(model.calls_for("planner", "replan")) == 1


async def test_the_budget_reserve_counts_the_tokens_of_attempts_still_running() -> None:
    # Three tasks have each made a model call (10 tokens) and wait at a tool
    # when the milestone's reviewer asks to replan: the journal knows of 20
    # tokens (t1's call and the review), the run has used 50, past the 40
    # allowed before the 60% reserve of 100. The replan is refused.
    arrived = 0
    all_waiting, release = anyio.Event(), anyio.Event()

    @tool
    async def wait(n: int) -> str:
        """Wait until the test lets the attempt go on."""
        nonlocal arrived
        arrived += 1
        if arrived == 3:
            all_waiting.set()
        await release.wait()
        return "done"

    def execute(request: ModelRequest) -> Any:
        task = task_of(request)
        if task.key == "a":
            return TaskOutcome(success=True, summary="a", findings=["news"])
        if not request.transcript:
            call = ToolCall(id="c", name="wait", arguments='{"n": 1}')
            return ModelResponse(usage=PER_CALL, tool_calls=[call])
        return TaskOutcome(success=True, summary=task.key)

    async def review(request: ModelRequest) -> Any:
        await all_waiting.wait()
        return first_then_continue(replan_verdict())(request)

    model = scripted(
        execute=execute,
        milestone=review,
        replan=lambda r: fresh_tasks(2),
        usage=PER_CALL,
    )
    tasks = [TaskDraft(key="a", description="survey", milestone=True)] + [
        TaskDraft(key=k, description=f"look up {k}") for k in "bcd"
    ]
    async with Supervisor(model, MemoryStore(), tools=[wait]) as sup:
        handle = await sup.submit(spec(tasks, token_budget=100, replan_reserve=0.6))
        with anyio.fail_after(10):
            async for event in handle.events():
                if event.kind in ("replan_refused", "replan_applied"):
                    break
            release.set()
            result = await handle.result()
        replayed = await sup.replay(handle.run_id)

    [refused] = result.replans
    assert refused.outcome is ReplanOutcome.REFUSED_BUDGET
    assert refused.reason == (
        "50 tokens used of the 40 allowed before the replan reserve"
    )
    assert model.calls_for("planner", "replan") == []
    assert result.status is RunStatus.COMPLETED
    assert replayed == result


@pytest.mark.parametrize(
    "budget",
    [
        pytest.param(35, id="passed"),
        pytest.param(40, id="used-to-the-last-token"),
    ],
)
async def test_a_spent_token_budget_ends_the_run_before_another_model_call(
    budget: int,
) -> None:
    model = scripted(execute=clean, usage=PER_CALL)

    done = await run_to_end(
        model, spec(chain(6), token_budget=budget, max_concurrency=1)
    )

    result = done.result
    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("token_budget")
    # 0, 10, 20 and 30 tokens were used before calls 1-4; none after 40,
    # which spends a budget of 40 as surely as one of 35.
    assert len(model.calls) == 4
    assert no_call_started_past(model, budget)
    assert result.usage.total.total_tokens == 40
    assert executed_ids(model) == ["t1", "t2", "t3", "t4"]
    assert model.calls_for("executor", "synthesize") == []
    assert done.replayed == result


def test_the_live_meter_is_spent_once_it_reaches_the_budget() -> None:
    # The meter stops calls between journal writes (tool loops, tasks
    # running together): it must agree with the journal's own check.
    meter = RunMeter(100, used=99)
    assert meter.spent_reason() is None
    meter.charge(TokenUsage(output_tokens=1))
    assert meter.spent_reason() == "token_budget: 100 of 100 tokens used"
    assert meter.left() == 0


@pytest.mark.parametrize(
    "candidates",
    [
        pytest.param(1, id="one-candidate"),
        pytest.param(2, id="two-candidates"),
        pytest.param(3, id="three-candidates"),
    ],
)
async def test_no_model_call_starts_inside_a_replan_once_the_budget_is_spent(
    candidates: int,
) -> None:
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        replan=lambda r: fresh_tasks(2),
        usage=PER_CALL,
    )
    # Regression: the planner's usage used to reach the journal only with the
    # replan's outcome, so ranker/alignment started past the budget.
    # 3 executions + the review = 40 < 45: the replan may start; the
    # planner's first answer brings usage to 50, past the budget.
    run_spec = spec(
        chain(3),
        milestone_every=3,
        token_budget=45,
        replan_reserve=0.0,
        replan_candidates=candidates,
    )

    done = await run_to_end(model, run_spec)

    result = done.result
    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("token_budget")
    assert no_call_started_past(model, 45)
    assert len(model.calls_for("planner", "replan")) == 1
    assert model.calls_for("ranker", "alignment") == []
    assert result.usage.total.total_tokens == 10 * len(model.calls)


async def test_max_iterations_ends_the_run_at_the_next_milestone() -> None:
    model = scripted(execute=with_finding)

    done = await run_to_end(model, spec(chain(5), milestone_every=1, max_iterations=2))

    result = done.result
    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("max_iterations")
    assert len(model.calls_for("reviewer", "milestone")) == 2
    assert result.iterations == 2
    assert executed_ids(model) == ["t1", "t2", "t3"]
    assert model.calls_for("executor", "synthesize") == []


async def test_milestones_the_cheap_checks_decide_count_not_toward_max_iterations() -> (
    None
):
    model = scripted(execute=clean)
    contract = spec(chain(30), milestone_every=1, max_iterations=2).model_copy(
        update={"pattern": "contract"}
    )

    done = await run_to_end(model, contract)

    result = done.result
    assert result.status is RunStatus.COMPLETED
    assert result.iterations == 30
    assert {r.by for r in done.reviews()} == {"heuristic"}
    assert model.calls_for("reviewer", "milestone") == []
    assert done.replayed == result


def findings_at(*task_ids: str) -> Any:
    """Clean results, but for ``task_ids``, which the reviewer must judge."""

    def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).id in task_ids:
            return with_finding(request)
        return clean(request)

    return execute


async def test_max_iterations_ends_the_run_when_one_review_too_many_is_needed() -> None:
    model = scripted(execute=findings_at("t2", "t4", "t6"))

    done = await run_to_end(model, spec(chain(8), milestone_every=1, max_iterations=2))

    result = done.result
    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason == "max_iterations: 2 milestone reviews held"
    assert len(model.calls_for("reviewer", "milestone")) == 2
    assert [r.by for r in done.reviews()] == ["heuristic", "model"] * 2 + ["heuristic"]
    assert executed_ids(model) == ["t1", "t2", "t3", "t4", "t5", "t6"]
    assert done.replayed == result
    # The count is rebuilt from who decided each review, as any journal says.
    assert replay(done.events).reviews == 2


async def test_max_task_executions_stops_after_exactly_that_many_attempts() -> None:
    model = scripted(execute=clean)

    done = await run_to_end(
        model, spec(independent(5), max_task_executions=3, max_concurrency=4)
    )

    result = done.result
    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("max_task_executions")
    assert len(executed_ids(model)) == 3
    assert result.task_executions == 3
    statuses = [t.status for t in result.tasks]
    assert statuses.count(TaskStatus.COMPLETED) == 3
    assert statuses.count(TaskStatus.PENDING) == 2


async def test_retries_count_against_max_task_executions() -> None:
    def execute(request: ModelRequest) -> TaskOutcome:
        return TaskOutcome(success=False, transient=True, reason="timeout")

    model = scripted(execute=execute)

    done = await run_to_end(
        model, spec(chain(1), max_task_executions=3, max_task_attempts=10)
    )

    assert done.result.status is RunStatus.LIMIT_REACHED
    assert done.result.stop_reason is not None
    assert done.result.stop_reason.startswith("max_task_executions")
    assert executed_ids(model) == ["t1"] * 3


async def test_a_deadline_ends_a_stuck_run_promptly() -> None:
    async def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).id == "t2":
            await anyio.sleep(30)
        return clean(request)

    model = scripted(execute=execute)

    done = await run_to_end(model, spec(chain(3), deadline_s=0.2))

    result = done.result
    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("deadline_s")
    assert done.elapsed_s < 2
    assert done.task("t1").status is TaskStatus.COMPLETED
    # The attempt cut short never finished.
    assert done.task("t2").status is TaskStatus.PENDING
    assert done.replayed == result


@tool
async def ping(n: int) -> str:
    """Ping."""
    return "pong"


@pytest.mark.parametrize("end", ["budget", "cancel", "deadline"])
async def test_the_calls_of_attempts_still_running_at_the_end_count_in_the_usage(
    end: str,
) -> None:
    # Four tasks loop on a tool call (a model call each step) until the run
    # ends: every one of those calls is in the run's usage, however it ends.
    cost = TokenUsage(input_tokens=100, calls=1)
    calls = 0

    async def loop(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        await anyio.sleep(0.02)
        calls += 1  # answered (one cut short by the end costs nothing)
        return ModelResponse(
            usage=cost,
            tool_calls=[ToolCall(id="c", name="ping", arguments='{"n": 1}')],
        )

    limits: dict[str, Any] = {"max_concurrency": 4, "max_tool_steps": 100}
    if end == "budget":
        limits["token_budget"] = 1000
    if end == "deadline":
        limits["deadline_s"] = 0.3
    model = scripted(execute=loop, usage=cost)
    async with Supervisor(model, MemoryStore(), tools=[ping]) as sup:
        handle = await sup.submit(spec(independent(4), **limits))
        if end == "cancel":
            await anyio.sleep(0.3)
            await handle.cancel()
        with anyio.fail_after(10):
            result = await handle.result()
        replayed = await sup.replay(handle.run_id)
    expected = {
        "budget": RunStatus.LIMIT_REACHED,
        "cancel": RunStatus.CANCELLED,
        "deadline": RunStatus.LIMIT_REACHED,
    }
    assert result.status is expected[end]
    executor = result.usage.by_role["executor"]
    assert executor.calls == calls
    assert executor.input_tokens == 100 * calls
    assert replayed == result
