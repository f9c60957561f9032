"""A model that answers with the wrong type: the failure says which role and
purpose, and the answer's tokens still count."""

from __future__ import annotations

from typing import Any

from scripts import independent, run_to_end, scripted, spec, with_finding

from replan import ModelRequest, ModelResponse, TaskOutcome, TokenUsage, Verdict

USAGE = TokenUsage(input_tokens=7, output_tokens=3, calls=1)


def not_a_verdict(request: ModelRequest) -> Any:
    # What a model adapter might hand back: a response of the wrong type.
    outcome = TaskOutcome(success=True, summary="this is no verdict")
    return ModelResponse(output=outcome, usage=USAGE)


async def test_a_reviewer_answering_the_wrong_type_fails_the_run_naming_it() -> None:
    model = scripted(execute=with_finding, milestone=not_a_verdict, usage=USAGE)

    done = await run_to_end(model, spec(independent(1)))

    # An adapter that answers with the wrong type would do so on every call:
    # unlike a malformed answer, the run does not go on without reviews.
    assert done.result.status.value == "failed"
    assert done.result.stop_reason == (
        "the reviewer could not answer (ModelError): reviewer/milestone: "
        "expected Verdict, got TaskOutcome"
    )
    (failure,) = done.result.model_failures
    assert (failure.role, failure.purpose) == ("reviewer", "milestone")
    # The rejected answer's tokens are the run's, like any other answer's.
    assert failure.usage == USAGE
    assert done.result.usage.by_role["reviewer"] == USAGE
    assert done.replayed == done.result


def not_an_outcome(request: ModelRequest) -> Any:
    return ModelResponse(output=Verdict(decision="continue"), usage=USAGE)


async def test_an_executor_answering_the_wrong_type_records_where() -> None:
    model = scripted(execute=not_an_outcome, usage=USAGE)

    done = await run_to_end(model, spec(independent(1), max_task_attempts=1))

    task = done.task("t1")
    assert task.status.value == "failed"
    assert task.result is not None
    assert "executor/execute: expected TaskOutcome, got Verdict" in (
        task.result.reason or ""
    )
    (failure,) = done.result.model_failures
    assert (failure.role, failure.purpose, failure.task_id) == (
        "executor",
        "execute",
        "t1",
    )
    # Counted once: with the attempt's calls, not again with the failure.
    assert len(model.calls_for("executor", "execute")) == 1
    executor_calls = len(model.calls_for("executor"))
    assert done.result.usage.by_role["executor"].total_tokens == 10 * executor_calls
    assert done.replayed == done.result
