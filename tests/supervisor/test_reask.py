"""A malformed answer is asked once more, with the problem shown, before a plan
run records it as an error (DESIGN §5), for every role the run asks."""

from __future__ import annotations

from typing import Any

import pytest
from scripts import (
    Answer,
    all_aligned,
    chain,
    critique,
    first_then_continue,
    fresh_tasks,
    keep_going,
    replan_verdict,
    run_to_end,
    same_size_chain,
    scripted,
    spec,
    synthesize,
    with_finding,
)

from replan import (
    Alignment,
    ModelOutputError,
    ModelRefusal,
    ModelRequest,
    ReplanOutcome,
    RunSpec,
    RunStatus,
    ScriptedModel,
    Synthesis,
    TaskDraft,
    TaskOutcome,
    TokenUsage,
)

USAGE = TokenUsage(input_tokens=5, output_tokens=2, calls=1)
MALFORMED = {"decision": "maybe", "tasks": "none", "aligned": "yes", "winner": "c"}


class MalformedFirst:
    """Answers malformed the first time it is asked (``first``), then as
    ``answer`` does; it keeps the requests it saw."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.first: Answer = lambda request: MALFORMED
        self.requests: list[ModelRequest] = []

    def __call__(self, request: ModelRequest) -> Any:
        self.requests.append(request)
        if len(self.requests) == 1:
            return self.first(request)
        return self.answer(request)


def asked_again(first: MalformedFirst) -> None:
    """The second request is the first with the problem shown."""
    one, two = first.requests[:2]
    assert "answer_problem" not in one.context
    problem = two.context["answer_problem"]
    assert f"not a valid {one.output_type.__name__}" in problem
    assert {k: v for k, v in two.context.items() if k != "answer_problem"} == (
        one.context
    )


async def test_a_reviewer_malformed_once_is_asked_again_and_its_verdict_counts() -> (
    None
):
    reviewer = MalformedFirst(first_then_continue(replan_verdict()))
    model = scripted(execute=with_finding, milestone=reviewer, usage=USAGE)

    done = await run_to_end(model, spec(chain(3, milestone_at=[1])))

    result = done.result
    assert result.status is RunStatus.COMPLETED
    asked_again(reviewer)
    # The verdict of the re-ask is the review's: the model's, and it replanned.
    first_review = done.reviews()[0]
    assert (first_review.by, first_review.verdict.decision) == ("model", "replan")
    assert done.outcomes() == [ReplanOutcome.APPLIED]
    # No failure is recorded for an answer the re-ask made good, but both
    # calls' tokens are the run's.
    assert result.model_failures == []
    reviews = len(done.reviews())
    assert len(model.calls_for("reviewer", "milestone")) == reviews + 1
    assert result.usage.by_role["reviewer"] == sum([USAGE] * reviews, USAGE)
    assert done.replayed == result


def replanning(**answers: Answer) -> ScriptedModel:
    return scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        usage=USAGE,
        **answers,
    )


@pytest.mark.parametrize(
    ("purpose", "role", "candidates"),
    [
        pytest.param("replan", "planner", 1, id="replan"),
        pytest.param("alignment", "ranker", 1, id="alignment"),
        pytest.param("critiques", "reviewer", 2, id="critique"),
        pytest.param("compare", "ranker", 2, id="compare"),
        pytest.param("evolve", "evolver", 2, id="evolve"),
    ],
)
async def test_a_replan_role_malformed_once_is_asked_again_and_the_replan_applies(
    purpose: str, role: str, candidates: int
) -> None:
    defaults: dict[str, Answer] = {
        "replan": same_size_chain,
        "alignment": lambda r: {"aligned": [True] * len(r.context["proposed"])},
        "critiques": critique,
        "compare": lambda r: {"winner": "a"},
        "evolve": lambda r: fresh_tasks(2, tag="evolved-"),
    }
    first = MalformedFirst(defaults[purpose])
    model = replanning(**{**defaults, purpose: first})

    done = await run_to_end(
        model,
        spec(chain(3, milestone_at=[1]), replan_candidates=candidates),
    )

    result = done.result
    assert result.status is RunStatus.COMPLETED
    assert done.outcomes() == [ReplanOutcome.APPLIED]
    asked_again(first)
    assert result.model_failures == []
    calls = len(first.requests)
    assert result.usage.by_role[role].calls >= calls
    # Every call the model answered is in the run's usage, the malformed too.
    assert result.usage.total.calls == len(model.calls)
    assert done.replayed == result


def short_by_one(request: ModelRequest) -> Alignment:
    """An alignment check that leaves out the last proposed task's flag."""
    return Alignment(aligned=[True] * (len(request.context["proposed"]) - 1))


async def test_an_alignment_with_a_flag_missing_is_asked_again_with_the_count() -> None:
    # The answer validates as an Alignment, but it does not answer for every
    # proposed task: no adapter can see that, so the ranker asks again,
    # saying how many flags it needs, rather than count a missing flag as
    # a task off the goal.
    ranker = MalformedFirst(all_aligned)
    ranker.first = short_by_one
    model = replanning(replan=lambda r: fresh_tasks(3), alignment=ranker)

    done = await run_to_end(model, spec(chain(3, milestone_at=[1])))

    result = done.result
    assert done.outcomes() == [ReplanOutcome.APPLIED]
    one, two = ranker.requests
    assert "answer_problem" not in one.context
    assert two.context["answer_problem"] == (
        "aligned has 2 flag(s) for 3 proposed task(s): give one per task, in order"
    )
    assert result.model_failures == []
    assert result.usage.by_role["ranker"] == USAGE + USAGE
    assert done.replayed == result


async def test_an_alignment_with_flags_past_the_last_task_is_taken_as_it_is() -> None:
    # The extra flag judges no task: the answer judges every one, and counts.
    def one_too_many(request: ModelRequest) -> Alignment:
        return Alignment(aligned=[True] * (len(request.context["proposed"]) + 1))

    model = replanning(replan=lambda r: fresh_tasks(3), alignment=one_too_many)

    done = await run_to_end(model, spec(chain(3, milestone_at=[1])))

    assert done.outcomes() == [ReplanOutcome.APPLIED]
    assert len(model.calls_for("ranker", "alignment")) == 1


async def test_an_alignment_short_of_flags_twice_refuses_the_replan_as_an_error() -> (
    None
):
    model = replanning(replan=lambda r: fresh_tasks(3), alignment=short_by_one)

    done = await run_to_end(model, spec(chain(3, milestone_at=[1])))

    result = done.result
    assert result.status is RunStatus.COMPLETED
    [refused] = result.replans
    assert refused.outcome is ReplanOutcome.REFUSED_ERROR  # not refused_drift
    assert "aligned has 2 flag(s) for 3 proposed task(s)" in refused.reason
    assert refused.proposed is not None  # the unchecked change is kept
    [failure] = result.model_failures
    assert (failure.role, failure.purpose) == ("ranker", "alignment")
    assert failure.error_type == "ModelOutputError"
    assert len(model.calls_for("ranker", "alignment")) == 2
    assert result.usage.by_role["ranker"] == USAGE + USAGE
    assert done.replayed == result


async def test_a_first_plan_malformed_once_is_asked_again() -> None:
    planner = MalformedFirst(lambda r: fresh_tasks(2))
    model = scripted(plan=planner, usage=USAGE)

    done = await run_to_end(model, RunSpec(goal="map the market", pattern="discovery"))

    result = done.result
    assert result.status is RunStatus.COMPLETED
    asked_again(planner)
    assert [v.version for v in result.versions] == [1]
    assert result.usage.by_role["planner"] == USAGE + USAGE
    assert result.model_failures == []
    assert done.replayed == result


async def test_a_hybrid_boundary_malformed_once_is_asked_again() -> None:
    boundary = MalformedFirst(lambda r: fresh_tasks(1, tag="b"))

    def handler(request: ModelRequest) -> Any:
        match (request.role, request.purpose):
            case ("planner", "boundary"):
                return boundary(request)
            case ("executor", "execute"):
                return TaskOutcome(success=True, summary="collected")
            case ("executor", "synthesize"):
                return Synthesis(output="done")
            case ("reviewer", "milestone"):
                return keep_going(request)
        raise AssertionError(f"unexpected {request.role}/{request.purpose}")

    run_spec = RunSpec(
        goal="brief the market",
        pattern="hybrid",
        tasks=[TaskDraft(key="a", description="collect")],
    )

    done = await run_to_end(ScriptedModel(handler), run_spec)

    assert done.result.status is RunStatus.COMPLETED
    asked_again(boundary)
    assert [v.version for v in done.result.versions] == [1, 2]
    assert done.replayed == done.result


async def test_a_synthesis_malformed_once_is_asked_again() -> None:
    synthesis = MalformedFirst(synthesize)
    model = scripted(synthesis=synthesis, usage=USAGE)

    done = await run_to_end(model, spec(chain(2)))

    assert done.result.status is RunStatus.COMPLETED
    assert done.result.output is not None
    asked_again(synthesis)
    assert done.result.usage.by_role["executor"] == sum([USAGE] * 3, USAGE)
    assert done.replayed == done.result


async def test_a_task_answer_malformed_once_is_asked_again_in_the_same_attempt() -> (
    None
):
    executor = MalformedFirst(with_finding)
    model = scripted(execute=executor, usage=USAGE)

    done = await run_to_end(model, spec(chain(1)))

    result = done.result
    assert result.status is RunStatus.COMPLETED
    asked_again(executor)
    task = done.task("t1")
    assert (task.status.value, task.attempts) == ("completed", 1)
    # The attempt's usage, journaled with its finish, counts both calls.
    assert result.usage.by_role["executor"] == sum([USAGE] * 2, USAGE)
    assert result.model_failures == []
    assert done.replayed == result


async def test_a_task_answer_malformed_twice_fails_the_task_with_both_calls() -> None:
    model = scripted(execute=lambda r: MALFORMED, usage=USAGE)

    done = await run_to_end(model, spec(chain(1)))

    result = done.result
    assert done.task("t1").status.value == "failed"
    assert len(model.calls_for("executor", "execute")) == 2
    (failure,) = result.model_failures
    assert failure.error_type == "ModelOutputError"
    assert failure.usage == USAGE + USAGE
    assert result.usage.by_role["executor"] == USAGE + USAGE
    assert done.replayed == result


async def test_an_answer_the_model_marked_final_is_not_asked_again() -> None:
    # An adapter that re-asked by itself (OpenAIModel) says so: no third try.
    def given_up(request: ModelRequest) -> Any:
        raise ModelOutputError("not a Verdict, even after a re-ask", final=True)

    model = scripted(execute=with_finding, milestone=given_up)

    done = await run_to_end(model, spec(chain(3, milestone_at=[1])))

    assert done.result.status is RunStatus.COMPLETED
    assert [r.by for r in done.reviews()] == ["error", "error"]
    assert len(model.calls_for("reviewer", "milestone")) == 2
    assert done.replayed == done.result


async def test_a_refusal_is_not_asked_again() -> None:
    def refusing(request: ModelRequest) -> Any:
        raise ModelRefusal("no", reason="refusal")

    model = scripted(execute=with_finding, milestone=refusing)

    done = await run_to_end(model, spec(chain(3, milestone_at=[1])))

    assert [r.by for r in done.reviews()] == ["error", "error"]
    assert len(model.calls_for("reviewer", "milestone")) == 2
    assert done.replayed == done.result


@pytest.mark.parametrize(
    ("purpose", "role", "calls"),
    [
        # Candidate 0 answered, candidate 1 twice malformed.
        pytest.param("replan", "planner", 1 + 2, id="planner"),
        # Both candidates proposed; the critique of candidate 1 malformed.
        pytest.param("critiques", "reviewer", 1 + 2, id="critic"),
        # Three candidates: pair (0, 1) answered, pair (0, 2) malformed.
        pytest.param("compare", "ranker", 1 + 2, id="tournament"),
    ],
)
async def test_a_request_failing_after_some_calls_keeps_every_calls_tokens(
    purpose: str, role: str, calls: int
) -> None:
    def later_malformed(answer: Answer, index: Any) -> Answer:
        def answered(request: ModelRequest) -> Any:
            if index(request.context) == 1:
                return MALFORMED
            return answer(request)

        return answered

    answers: dict[str, Answer] = {
        "replan": later_malformed(
            lambda r: fresh_tasks(1, tag=f"c{r.context.get('candidate', 0)}-"),
            lambda c: c.get("candidate"),
        ),
        "critiques": later_malformed(critique, lambda c: c.get("candidate_index")),
        "compare": later_malformed(
            lambda r: {"winner": "a"}, lambda c: c.get("b_index", 0) - 1
        ),
    }
    model = replanning(**{purpose: answers[purpose]})
    candidates = 3 if purpose == "compare" else 2

    done = await run_to_end(
        model, spec(chain(3, milestone_at=[1]), replan_candidates=candidates)
    )

    result = done.result
    assert done.outcomes() == [ReplanOutcome.REFUSED_ERROR]
    made = [c for c in model.calls_for(role) if c.purpose != "milestone"]
    assert len(made) == calls
    (failure,) = result.model_failures
    # The failure carries what the whole request cost: no reply reported the
    # calls that were answered before it.
    assert failure.usage == sum([USAGE] * (calls - 1), USAGE)
    assert result.usage.total.calls == len(model.calls)
    assert done.replayed == result
