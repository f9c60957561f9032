"""``Limits.call_timeout_s``: a request to a role other than a task attempt that
takes too long is cut short, its model call cancelled.

A request cut short counts as a failed attempt (retried up to
``max_task_attempts``); when every attempt is cut short, a review continues
and a replan is refused, while the first plan and the synthesis fail the run.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from explore_scripts import ExploreScript, Idea, explore_spec, run_explore, scores
from scripts import (
    Answer,
    chain,
    first_then_continue,
    replan_verdict,
    run_to_end,
    scripted,
    spec,
    synthesize,
    with_finding,
)

from replan import (
    ConfigurationError,
    Critique,
    Limits,
    MemoryStore,
    ModelRequest,
    PlanProposal,
    ReplanOutcome,
    RunSpec,
    RunStatus,
    Supervisor,
    TaskDraft,
    TokenUsage,
    Verdict,
)

TIMEOUT_S = 0.2
USAGE = TokenUsage(input_tokens=5, output_tokens=2, calls=1)


class Hanging:
    """Hangs (until cancelled) on the listed calls, counted from 1, and
    answers the others as ``answer`` does; it counts the calls it saw and
    the hung ones that were cancelled."""

    def __init__(self, answer: Answer, *, hang: set[int] | None = None) -> None:
        self.answer = answer
        self.hang = hang
        self.calls = 0
        self.cancelled = 0

    async def __call__(self, request: ModelRequest) -> Any:
        self.calls += 1
        if self.hang is None or self.calls in self.hang:
            try:
                await anyio.sleep_forever()
            finally:
                self.cancelled += 1
        return self.answer(request)


def timed(run_spec: RunSpec, timeout_s: float = TIMEOUT_S, **limits: Any) -> RunSpec:
    updated = run_spec.limits.model_copy(update={"call_timeout_s": timeout_s, **limits})
    return run_spec.model_copy(update={"limits": updated})


async def test_a_reviewer_that_hangs_is_cut_short_and_the_review_continues() -> None:
    reviewer = Hanging(first_then_continue(replan_verdict()))
    model = scripted(execute=with_finding, milestone=reviewer)

    done = await run_to_end(
        model, timed(spec(chain(3, milestone_at=[1])), max_task_attempts=2)
    )

    result = done.result
    assert result.status is RunStatus.COMPLETED
    assert set(done.statuses().values()) == {"completed"}
    reviews = done.reviews()
    assert [r.by for r in reviews] == ["error", "error"]
    assert reviews[0].verdict.decision == "continue"
    assert "call_timeout_s: the reviewer gave no answer within 0.2s" in (
        reviews[0].verdict.rationale
    )
    # Each review asked max_task_attempts times, and every hung call was
    # cancelled: nothing runs on for nobody.
    assert reviewer.calls == 2 * 2
    assert reviewer.cancelled == reviewer.calls
    failures = result.model_failures
    assert [(f.role, f.purpose, f.error_type) for f in failures] == [
        ("reviewer", "milestone", "ActorTimeout")
    ] * 4
    assert failures[0].message == "call_timeout_s: no answer within 0.2s"
    assert failures[0].transient
    assert done.replayed == result


async def test_a_reviewer_cut_short_once_is_asked_again_and_its_verdict_counts() -> (
    None
):
    reviewer = Hanging(first_then_continue(replan_verdict()), hang={1})
    model = scripted(execute=with_finding, milestone=reviewer)

    done = await run_to_end(model, timed(spec(chain(3, milestone_at=[1]))))

    assert done.result.status is RunStatus.COMPLETED
    first = done.reviews()[0]
    assert (first.by, first.verdict.decision) == ("model", "replan")
    assert done.outcomes() == [ReplanOutcome.APPLIED]
    (failure,) = done.result.model_failures
    assert failure.error_type == "ActorTimeout"
    assert done.replayed == done.result


async def test_the_tokens_of_a_request_cut_short_are_journaled() -> None:
    # The first answer is malformed (its tokens are spent), the re-ask hangs:
    # no reply tells what the attempt used, the run's meter does.
    answers = iter([{"decision": "maybe"}])

    async def malformed_then_hang(request: ModelRequest) -> Any:
        answer = next(answers, None)
        if answer is not None:
            return answer
        await anyio.sleep_forever()

    model = scripted(execute=with_finding, milestone=malformed_then_hang, usage=USAGE)

    done = await run_to_end(
        model, timed(spec(chain(3, milestone_at=[1])), max_task_attempts=2)
    )

    result = done.result
    assert result.status is RunStatus.COMPLETED
    failures = result.model_failures
    assert [f.error_type for f in failures] == ["ActorTimeout"] * 4
    # The first attempt of the first review spent one call's tokens.
    assert [f.usage for f in failures] == [USAGE] + [TokenUsage()] * 3
    assert result.usage.by_role["reviewer"] == USAGE
    assert done.replayed == result


@pytest.mark.parametrize(
    ("purpose", "candidates"),
    [
        pytest.param("replan", 1, id="planner"),
        pytest.param("alignment", 1, id="alignment"),
        pytest.param("critiques", 2, id="critic"),
        pytest.param("compare", 2, id="tournament"),
    ],
)
async def test_a_replan_whose_role_hangs_is_refused_and_the_run_goes_on(
    purpose: str, candidates: int
) -> None:
    hanging = Hanging(lambda r: None)
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        **{purpose: hanging},
    )

    done = await run_to_end(
        model,
        timed(spec(chain(3, milestone_at=[1])), replan_candidates=candidates),
    )

    result = done.result
    assert result.status is RunStatus.COMPLETED
    assert done.outcomes() == [ReplanOutcome.REFUSED_ERROR]
    assert result.replans[0].reason.startswith("call_timeout_s: the ")
    assert [v.version for v in result.versions] == [1]
    assert hanging.cancelled == hanging.calls == 2
    assert done.replayed == result


async def test_an_evolver_that_hangs_leaves_the_tournament_winner() -> None:
    evolver = Hanging(lambda r: None)
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        evolve=evolver,
    )

    done = await run_to_end(
        model, timed(spec(chain(3, milestone_at=[1])), replan_candidates=2)
    )

    assert done.result.status is RunStatus.COMPLETED
    assert done.outcomes() == [ReplanOutcome.APPLIED]
    assert evolver.cancelled == evolver.calls == 2
    assert done.replayed == done.result


async def test_a_first_plan_that_hangs_fails_the_run_naming_the_limit() -> None:
    planner = Hanging(lambda r: None)
    model = scripted(plan=planner)

    done = await run_to_end(
        model, timed(RunSpec(goal="map the market", pattern="discovery"))
    )

    result = done.result
    assert result.status is RunStatus.FAILED
    assert result.stop_reason == (
        "call_timeout_s: the planner gave no answer within 0.2s, 2 time(s)"
    )
    assert planner.cancelled == planner.calls == 2
    assert done.replayed == result


async def test_a_synthesis_that_hangs_fails_the_run_naming_the_limit() -> None:
    synthesis = Hanging(synthesize)
    model = scripted(synthesis=synthesis)

    done = await run_to_end(model, timed(spec(chain(2)), max_task_attempts=1))

    result = done.result
    assert result.status is RunStatus.FAILED
    assert result.stop_reason == (
        "call_timeout_s: the executor gave no answer within 0.2s, 1 time(s)"
    )
    assert done.statuses() == {"t1": "completed", "t2": "completed"}
    assert synthesis.cancelled == 1
    assert done.replayed == result


async def test_the_time_a_request_waits_for_a_worker_is_not_its_call_time() -> None:
    # One planner for four runs: each plan takes 0.1s, well within the
    # limit, though the last run's request waits 0.3s for the planner.
    async def plan(request: ModelRequest) -> PlanProposal:
        await anyio.sleep(0.1)
        return PlanProposal(tasks=[TaskDraft(key="a", description="a")])

    model = scripted(plan=plan)
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore(), workers={"planner": 1}) as sup:
            handles = [
                await sup.submit(timed(RunSpec(goal=f"goal {i}"), 0.25))
                for i in range(4)
            ]
            results = [await handle.result() for handle in handles]

    assert [r.status for r in results] == [RunStatus.COMPLETED] * 4
    assert [r.model_failures for r in results] == [[]] * 4
    assert len(model.calls_for("planner", "plan")) == 4


async def test_a_request_cut_short_leaves_no_worker_busy() -> None:
    reviewer = Hanging(lambda r: Verdict(decision="continue"))
    model = scripted(execute=with_finding, milestone=reviewer)

    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore()) as sup:
            handle = await sup.submit(timed(spec(chain(3, milestone_at=[1]))))
            result = await handle.result()
            stats = {s.role: s for s in sup.pool_statistics()}

    assert result.status is RunStatus.COMPLETED
    assert stats["reviewer"].busy == 0
    assert stats["reviewer"].restarts == 0
    assert reviewer.cancelled == reviewer.calls


async def test_a_mix_of_crash_and_timeout_names_the_last_failure() -> None:
    calls = 0

    async def crash_then_hang(request: ModelRequest) -> Any:
        nonlocal calls
        calls += 1
        if calls % 2:
            raise RuntimeError("the reviewer fell over")
        await anyio.sleep_forever()

    model = scripted(execute=with_finding, milestone=crash_then_hang)

    done = await run_to_end(model, timed(spec(chain(3, milestone_at=[1]))))

    rationale = done.reviews()[0].verdict.rationale
    assert "reviewer failed 2 time(s); last: call_timeout_s: no answer" in rationale
    assert done.replayed == done.result


def test_call_timeout_s_is_checked_like_the_other_limits() -> None:
    assert Limits().call_timeout_s is None
    for bad in (0, -1, float("nan"), 10**9):
        with pytest.raises(ConfigurationError, match="call_timeout_s"):
            Limits(call_timeout_s=bad)
    # A spec read from JSON (the daemon's, the CLI's) takes it as any limit.
    read = RunSpec.model_validate_json(
        '{"goal": "g", "limits": {"call_timeout_s": 2.5}}'
    )
    assert read.limits.call_timeout_s == 2.5


async def test_an_explore_call_that_hangs_is_recorded_and_the_run_goes_on() -> None:
    ideas = [
        Idea("Solo cooks leave because every recipe serves four", strength=0.9),
        Idea("Leftovers pile up and make planning feel wasteful", strength=0.7),
        Idea("Cooks without a weekly budget lose their reason to plan", strength=0.6),
    ]
    cancelled: list[str] = []

    async def hanging_review(request: ModelRequest) -> Any:
        if request.context["hypothesis_id"] != "H2":
            return Critique(scores=scores())
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.append("H2")

    script = ExploreScript(generated=ideas, broken={"critique": hanging_review})
    run_spec = explore_spec(max_iterations=1)
    outcome = await run_explore(timed(run_spec, max_task_attempts=1), script)

    result = outcome.result
    assert result.status is RunStatus.COMPLETED
    brief = result.brief
    assert brief is not None
    assert any(
        e.startswith("reviewer/critique: call_timeout_s: the reviewer gave no answer")
        for e in brief.errors
    )
    assert "H2" in {r.hypothesis_id for r in brief.rejected}
    assert cancelled
    assert len(cancelled) == sum(
        e.startswith("reviewer/critique: call_timeout_s") for e in brief.errors
    )
    assert outcome.replayed == result
