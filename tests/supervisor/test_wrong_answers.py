"""A model that answers with the wrong type: the failure says which role and
purpose, and the answer's tokens still count."""

from __future__ import annotations

from typing import Any

import anyio
from scripts import chain, independent, run_to_end, scripted, spec, with_finding

from replan import (
    MemoryStore,
    ModelRequest,
    ModelResponse,
    PlanProposal,
    Supervisor,
    TaskOutcome,
    TokenUsage,
    Verdict,
)

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


async def test_a_task_answered_with_the_wrong_type_fails_for_good_not_transiently() -> (
    None
):
    model = scripted(execute=not_an_outcome, usage=USAGE)

    done = await run_to_end(model, spec(chain(2)))

    task = done.task("t1")
    assert task.result is not None
    assert not task.result.transient
    # Not retried: the same model would answer the same way.
    assert task.attempts == 1
    assert len(model.calls_for("executor", "execute")) == 1
    assert done.statuses() == {"t1": "failed", "t2": "skipped"}
    assert done.result.status.value == "aborted"
    assert (done.result.stop_reason or "").startswith("no task completed")
    assert model.calls_for("executor", "synthesize") == []


class BareAnswers:
    """A model of a user's own that hands back its answer itself, not in a
    ``ModelResponse``: for the reviewer only, or for every role."""

    def __init__(self, *, every_role: bool = False) -> None:
        self.inner = scripted(execute=with_finding)
        self.every_role = every_role

    async def generate(self, request: ModelRequest) -> ModelResponse:
        response = await self.inner.generate(request)
        if self.every_role or request.role == "reviewer":
            return response.output  # type: ignore[return-value]
        return response


async def test_a_model_returning_no_model_response_fails_the_run_naming_it() -> None:
    async with Supervisor(BareAnswers(), MemoryStore(), max_restarts=0) as sup:
        with anyio.fail_after(10):
            handles = [await sup.submit(spec(independent(1))) for _ in range(2)]
            results = [await handle.result() for handle in handles]

    # Every call of such a model fails alike: the run ends, saying what the
    # model did, rather than crash the role (here, stop it for every run).
    for result in results:
        assert result.status.value == "failed"
        assert result.stop_reason == (
            "the reviewer could not answer (ModelError): reviewer/milestone: "
            "the model's generate() returned Verdict, not a ModelResponse"
        )


class PlainGenerate:
    """A model whose ``generate`` is a plain function, not a coroutine one."""

    def generate(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(output=PlanProposal(tasks=[]))


async def test_a_model_whose_generate_is_not_async_fails_the_run_saying_so() -> None:
    async with Supervisor(PlainGenerate(), MemoryStore(), max_restarts=0) as sup:
        with anyio.fail_after(10):
            result = await (await sup.submit(spec(independent(1)))).result()

    # Awaited, its answer was a TypeError taken for a crash of the executor,
    # which stopped the role for every run.
    assert result.status.value == "aborted"
    (task,) = result.tasks
    assert task.result is not None
    assert (
        "executor/execute: the model's generate() returned ModelResponse, not an "
        "awaitable: define it as `async def generate(self, request)`"
    ) in (task.result.reason or "")


async def test_a_task_whose_model_returns_no_model_response_fails_naming_it() -> None:
    async with Supervisor(
        BareAnswers(every_role=True), MemoryStore(), max_restarts=0
    ) as sup:
        handle = await sup.submit(spec(independent(2), max_task_attempts=1))
        with anyio.fail_after(10):
            result = await handle.result()

    assert result.status.value == "aborted"
    for task in result.tasks:
        assert task.status.value == "failed"
        assert task.result is not None
        assert task.result.reason is not None
        assert "executor/execute: the model's generate() returned TaskOutcome" in (
            task.result.reason
        )
