"""A role that gives no usable answer at a review or a replan does not throw the
run away: the review continues, the replan is refused, the run goes on."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from scripts import (
    SYNTHESIS,
    Answer,
    chain,
    first_then_continue,
    fresh_tasks,
    keep_going,
    replan_verdict,
    run_to_end,
    scripted,
    spec,
    with_finding,
)

from replan import (
    Comparison,
    Critique,
    Limits,
    ModelAuthenticationError,
    ModelError,
    ModelRefusal,
    ModelRequest,
    ReplanOutcome,
    RunSpec,
    RunStatus,
    ScriptedModel,
    Supervisor,
    Synthesis,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    TokenUsage,
    TransientModelError,
    apply,
)
from replan._render import event_lines, run_report
from replan.messages import GateOpened, ModelCallFailed

USAGE = TokenUsage(input_tokens=5, output_tokens=2, calls=1)
REFUSED_ERROR = ReplanOutcome.REFUSED_ERROR


def malformed(request: ModelRequest) -> Any:
    """An answer that does not validate: the model port's ModelOutputError."""
    return {"decision": "maybe", "tasks": "none", "aligned": "yes", "winner": "c"}


def crashing(request: ModelRequest) -> Any:
    raise RuntimeError(f"the {request.role} fell over")


def denied(request: ModelRequest) -> Any:
    raise ModelAuthenticationError("the API key was rejected")


def bad_request(request: ModelRequest) -> Any:
    raise ModelError("HTTP 400: the prompt is too long")


def timing_out(request: ModelRequest) -> Any:
    raise TransientModelError("the request timed out", usage=USAGE)


def refusing(request: ModelRequest) -> Any:
    raise ModelRefusal("the model refused to answer", reason="refusal")


async def test_a_review_whose_reviewer_answers_malformed_continues_the_plan() -> None:
    model = scripted(execute=with_finding, milestone=malformed, usage=USAGE)

    done = await run_to_end(model, spec(chain(3, milestone_at=[1])))

    result = done.result
    assert result.status is RunStatus.COMPLETED
    assert result.output == SYNTHESIS
    assert set(done.statuses().values()) == {"completed"}
    # Two calls per review: a malformed answer is asked once more, with the
    # problem shown, before the review goes on without a verdict.
    calls = model.calls_for("reviewer", "milestone")
    assert len(calls) == 2 * 2
    assert "answer_problem" not in calls[0].context
    assert "not a valid Verdict" in calls[1].context["answer_problem"]
    reviews = done.reviews()
    assert [(r.index, r.by, r.verdict.decision) for r in reviews] == [
        (1, "error", "continue"),
        (2, "error", "continue"),
    ]
    assert "ModelOutputError" in reviews[0].verdict.rationale
    assert "reviewer/milestone" in reviews[0].verdict.rationale
    assert result.iterations == 2
    failures = result.model_failures
    assert [(f.role, f.purpose, f.error_type) for f in failures] == [
        ("reviewer", "milestone", "ModelOutputError")
    ] * 2
    # Both calls' tokens are the run's, journaled before each review.
    assert result.usage.by_role["reviewer"] == USAGE + USAGE + USAGE + USAGE
    first_failure = next(
        i for i, e in enumerate(done.events) if isinstance(e, ModelCallFailed)
    )
    assert first_failure < done.events.index(reviews[0])
    assert done.replayed == result


async def test_a_review_whose_model_refuses_to_answer_continues_the_plan() -> None:
    model = scripted(execute=with_finding, milestone=refusing)

    done = await run_to_end(model, spec(chain(3, milestone_at=[1])))

    assert done.result.status is RunStatus.COMPLETED
    assert [r.by for r in done.reviews()] == ["error", "error"]
    assert "ModelRefusal" in done.reviews()[0].verdict.rationale
    assert done.replayed == done.result


async def test_a_reviewer_that_times_out_on_every_attempt_is_gone_without() -> None:
    model = scripted(execute=with_finding, milestone=timing_out)

    done = await run_to_end(
        model, spec(chain(3, milestone_at=[1]), max_task_attempts=3)
    )

    result = done.result
    assert result.status is RunStatus.COMPLETED
    assert [r.by for r in done.reviews()] == ["error", "error"]
    assert "reviewer failed 3 time(s)" in done.reviews()[0].verdict.rationale
    # Every attempt is journaled with what it cost.
    assert len(model.calls_for("reviewer", "milestone")) == 2 * 3
    assert [f.error_type for f in result.model_failures] == ["TransientModelError"] * 6
    assert result.usage.by_role["reviewer"] == sum([USAGE] * 5, USAGE)
    assert done.replayed == result


async def test_a_reviewer_that_always_crashes_cannot_keep_a_run_going_forever() -> None:
    model = scripted(execute=with_finding, milestone=crashing)

    done = await run_to_end(
        model, spec(chain(6), milestone_every=1, max_iterations=3, max_task_attempts=2)
    )

    result = done.result
    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason == "max_iterations: 3 milestone reviews held"
    reviews = done.reviews()
    assert [r.by for r in reviews] == ["error"] * 3
    assert "reviewer failed 2 time(s)" in reviews[0].verdict.rationale
    # Each review asked the crashing role max_task_attempts times.
    assert len(model.calls_for("reviewer", "milestone")) == 3 * 2
    assert done.replayed == result


async def test_a_contract_review_without_a_verdict_runs_the_fixed_plan_to_its_end() -> (
    None
):
    model = scripted(execute=with_finding, milestone=malformed)
    run_spec = spec(chain(3, milestone_at=[1, 2])).model_copy(
        update={"pattern": "contract"}
    )

    done = await run_to_end(model, run_spec)

    assert done.result.status is RunStatus.COMPLETED
    assert [r.by for r in done.reviews()] == ["error"] * 3
    # Nothing to escalate: no validation gate opened.
    assert not any(isinstance(e, GateOpened) for e in done.events)
    assert done.replayed == done.result


@pytest.mark.parametrize(
    ("reason", "answers"),
    [
        pytest.param(
            "the planner could not answer (ModelOutputError)",
            {"replan": malformed},
            id="planner-malformed",
        ),
        pytest.param(
            "planner failed 2 time(s)", {"replan": crashing}, id="planner-crashing"
        ),
        pytest.param(
            "the ranker could not answer (ModelOutputError)",
            {"alignment": malformed},
            id="alignment-malformed",
        ),
        pytest.param(
            "ranker failed 2 time(s)", {"alignment": crashing}, id="alignment-crashing"
        ),
    ],
)
async def test_a_replan_without_a_usable_answer_is_refused_and_the_run_goes_on(
    reason: str, answers: dict[str, Answer]
) -> None:
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        **answers,
    )

    done = await run_to_end(model, spec(chain(3, milestone_at=[1])))

    result = done.result
    assert result.status is RunStatus.COMPLETED
    assert done.outcomes() == [REFUSED_ERROR]
    (record,) = result.replans
    assert record.reason.startswith(reason)
    assert record.trigger is not None
    if "alignment" in answers:
        # The change that went unchecked is kept with the refusal.
        assert record.proposed is not None
        assert record.proposed.removed == ["t2", "t3"]
    else:
        assert record.proposed is None
    # The run went on with its first plan, every task of which completed.
    assert [v.version for v in result.versions] == [1]
    assert done.statuses() == {"t1": "completed", "t2": "completed", "t3": "completed"}
    assert result.replans_applied == 0
    assert done.replayed == result


async def test_a_planner_that_always_fails_to_replan_is_refused_at_every_review() -> (
    None
):
    model = scripted(
        execute=with_finding, milestone=lambda r: replan_verdict(), replan=malformed
    )

    done = await run_to_end(model, spec(chain(6), milestone_every=1, max_iterations=4))

    result = done.result
    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason == "max_iterations: 4 milestone reviews held"
    assert done.outcomes() == [REFUSED_ERROR] * 4
    assert len(result.model_failures) == 4
    assert done.replayed == result


async def test_a_refused_replan_keeps_its_failed_calls_in_the_run_usage() -> None:
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        replan=malformed,
        usage=USAGE,
    )

    done = await run_to_end(model, spec(chain(3, milestone_at=[1])))

    # One failure, for the answer still malformed once asked again; the
    # tokens of both calls.
    (failure,) = done.result.model_failures
    assert (failure.role, failure.purpose) == ("planner", "replan")
    assert failure.usage == USAGE + USAGE
    assert done.result.usage.by_role["planner"] == USAGE + USAGE
    assert done.result.replanning_tokens == 2 * USAGE.total_tokens
    assert done.replayed == done.result


# K candidates: critique, tournament, evolve ------------------------------------


def candidates_model(**overrides: Answer) -> ScriptedModel:
    def candidate(request: ModelRequest) -> Any:
        index = request.context.get("candidate", 0)
        return fresh_tasks(1, tag=f"c{index}-")

    answers: dict[str, Answer] = {
        "replan": candidate,
        "critiques": lambda r: Critique(critique="fine"),
        "compare": lambda r: Comparison(winner="b"),
        "evolve": lambda r: fresh_tasks(1, tag="evolved-"),
    }
    answers.update(overrides)
    return scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        **answers,
    )


@pytest.mark.parametrize(
    ("overrides", "role"),
    [
        pytest.param({"replan": malformed}, "planner", id="planner"),
        pytest.param({"critiques": malformed}, "reviewer", id="critic"),
        pytest.param({"compare": malformed}, "ranker", id="tournament"),
        pytest.param({"compare": crashing}, "ranker", id="tournament-crashing"),
    ],
)
async def test_a_candidate_replan_whose_planner_critic_or_ranker_fails_is_refused(
    overrides: dict[str, Answer], role: str
) -> None:
    model = candidates_model(**overrides)

    done = await run_to_end(
        model, spec(chain(3, milestone_at=[1]), replan_candidates=2)
    )

    assert done.result.status is RunStatus.COMPLETED
    assert done.outcomes() == [REFUSED_ERROR]
    assert role in done.result.replans[0].reason
    assert model.calls_for("evolver") == []
    assert [v.version for v in done.result.versions] == [1]
    assert done.replayed == done.result


@pytest.mark.parametrize("evolve", [malformed, crashing], ids=["malformed", "crash"])
async def test_an_evolver_without_a_usable_answer_leaves_the_tournament_winner(
    evolve: Answer,
) -> None:
    model = candidates_model(evolve=evolve)

    done = await run_to_end(
        model, spec(chain(3, milestone_at=[1]), replan_candidates=2)
    )

    result = done.result
    assert result.status is RunStatus.COMPLETED
    assert done.outcomes() == [ReplanOutcome.APPLIED]
    # The ranker preferred "b" (candidate 1): it stands, unrefined, and was
    # checked for drift like any proposal.
    version = result.versions[-1]
    added = [t.key for t in version.tasks_after if t.id in version.added]
    assert added == ["c1-1"]
    assert len(model.calls_for("ranker", "alignment")) == 1
    if evolve is malformed:
        (failure,) = result.model_failures
        assert (failure.role, failure.purpose) == ("evolver", "evolve")
    assert done.replayed == result


# What still ends the run --------------------------------------------------------


def hybrid_model(boundary: Answer) -> ScriptedModel:
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

    return ScriptedModel(handler)


@pytest.mark.parametrize("boundary", [malformed, crashing], ids=["malformed", "crash"])
async def test_a_hybrid_boundary_whose_planner_fails_ends_the_run_failed(
    boundary: Answer,
) -> None:
    run_spec = RunSpec(
        goal="brief the market",
        pattern="hybrid",
        tasks=[TaskDraft(key="a", description="collect")],
    )

    done = await run_to_end(hybrid_model(boundary), run_spec)

    result = done.result
    assert result.status is RunStatus.FAILED
    assert result.stop_reason is not None
    assert "planner" in result.stop_reason
    # The collection's results are kept.
    assert done.statuses() == {"t1": "completed"}
    assert done.replayed == result


async def test_a_first_plan_whose_planner_answers_malformed_ends_the_run_failed() -> (
    None
):
    model = scripted(plan=malformed)

    done = await run_to_end(model, RunSpec(goal="map the market", pattern="discovery"))

    assert done.result.status is RunStatus.FAILED
    assert done.result.stop_reason is not None
    assert done.result.stop_reason.startswith(
        "the planner could not answer (ModelOutputError)"
    )
    assert done.replayed == done.result


async def test_a_synthesis_that_answers_malformed_ends_the_run_failed() -> None:
    model = scripted(synthesis=malformed)

    done = await run_to_end(model, spec(chain(2)))

    assert done.result.status is RunStatus.FAILED
    assert done.result.stop_reason is not None
    assert done.result.stop_reason.startswith("the executor could not answer")
    assert done.replayed == done.result


@pytest.mark.parametrize(
    "answers",
    [
        pytest.param({"milestone": denied}, id="review"),
        pytest.param(
            {"milestone": first_then_continue(replan_verdict()), "replan": denied},
            id="replan",
        ),
        pytest.param(
            {"milestone": first_then_continue(replan_verdict()), "alignment": denied},
            id="alignment",
        ),
    ],
)
async def test_a_fatal_model_failure_at_a_review_or_a_replan_still_fails_the_run(
    answers: dict[str, Answer],
) -> None:
    model = scripted(execute=with_finding, **answers)

    done = await run_to_end(model, spec(chain(3, milestone_at=[1])))

    assert done.result.status is RunStatus.FAILED
    assert done.result.stop_reason == "the API key was rejected"
    assert done.result.replans == []
    assert done.replayed == done.result


@pytest.mark.parametrize(
    "answers",
    [
        pytest.param({"milestone": bad_request}, id="review"),
        pytest.param(
            {"milestone": first_then_continue(replan_verdict()), "replan": bad_request},
            id="replan",
        ),
    ],
)
async def test_a_bad_request_at_a_review_or_a_replan_still_fails_the_run(
    answers: dict[str, Answer],
) -> None:
    # Not about one answer: every call would fail alike (an unknown model, a
    # prompt too long), so the run does not go on without reviews or replans.
    model = scripted(execute=with_finding, **answers)

    done = await run_to_end(model, spec(chain(3, milestone_at=[1])))

    assert done.result.status is RunStatus.FAILED
    assert done.result.stop_reason is not None
    assert done.result.stop_reason.endswith(
        "could not answer (ModelError): HTTP 400: the prompt is too long"
    )
    assert done.result.replans == []
    assert done.replayed == done.result


async def test_a_reviewer_role_that_stops_still_fails_the_run() -> None:
    model = scripted(execute=with_finding, milestone=crashing)

    with_stop = Limits(max_task_attempts=3)
    run_spec = spec(chain(3, milestone_at=[1])).model_copy(update={"limits": with_stop})
    async with Supervisor(model, max_restarts=0) as sup:
        handle = await sup.submit(run_spec)
        result = await handle.result()

    assert result.status is RunStatus.FAILED
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("the reviewer role stopped")
    assert TaskStatus.PENDING in {t.status for t in result.tasks}


# What a person reads --------------------------------------------------------------


async def test_progress_and_report_show_the_missing_verdict_and_the_refusal() -> None:
    def replan_then_malformed(request: ModelRequest) -> Any:
        if request.context["milestone_index"] == 1:
            return replan_verdict()
        return malformed(request)

    model = scripted(
        execute=with_finding, milestone=replan_then_malformed, replan=malformed
    )
    done = await run_to_end(model, spec(chain(3, milestone_at=[1])))

    state = None
    progress: list[str] = []
    for event in done.events:
        state = apply(state, event)
        progress.extend(event_lines(event, state))
    assert state is not None
    heads = [line for line in progress if not line.startswith(" ")]
    reviewed = heads.index(
        "milestone 1 reviewed by the model: replan "
        "(contradiction, confidence 1, 0 sources)"
    )
    assert heads[reviewed + 1 : reviewed + 3] == [
        "model call failed (planner/replan): ModelOutputError",
        "replan refused_error (contradiction)",
    ]
    missing = progress.index("milestone 2 not reviewed: continue")
    assert progress[missing - 3] == (
        "model call failed (reviewer/milestone): ModelOutputError"
    )
    assert progress[missing + 1] == (
        "    no verdict, the run continues on its plan: the reviewer could not answer"
    )
    report = run_report(state)
    assert "status   completed" in report
    assert "  1. refused_error  contradiction  confidence 1" in report


async def test_a_run_cancelled_while_its_planner_replans_ends_cancelled() -> None:
    asked = anyio.Event()

    async def stuck(request: ModelRequest) -> Any:
        asked.set()
        await anyio.sleep_forever()

    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        replan=stuck,
    )
    with anyio.fail_after(10):
        async with Supervisor(model) as sup:
            handle = await sup.submit(spec(chain(3, milestone_at=[1])))
            await asked.wait()
            await handle.cancel()
            result = await handle.result()

    assert result.status is RunStatus.CANCELLED
    assert result.replans == []
