from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .._errors import (
    BudgetExhausted,
    ModelError,
    ModelOutputError,
    ModelRefusal,
    TransientModelError,
)
from ..explore import critique_problem
from ..llm import Model, ModelRequest, ModelResponse, Role
from ..messages import (
    Comparison,
    ContextAnalysis,
    Critique,
    ExploreReply,
    ExploreRequest,
    HypothesisBatch,
    ModelCall,
    TokenUsage,
    ValidationBatch,
)
from ..telemetry import model_call, model_call_traced
from ._runtime import ActorContext

T = TypeVar("T", bound=BaseModel)


async def call_model(
    model: Model,
    *,
    role: Role,
    purpose: str,
    output_type: type[T],
    context: dict[str, Any],
    temperature: float,
    run_id: str | None,
    task_id: str | None = None,
) -> tuple[T, ModelCall]:
    """Ask ``model`` for one ``output_type`` answer and report the call's usage.

    The request carries the structured ``context``; adapters for real models
    render the role's prompt from it, scripted models answer from it directly.

    Raises:
        ModelError: the model answered with the wrong type.
    """
    request = ModelRequest(
        role=role,
        purpose=purpose,
        output_type=output_type,
        temperature=temperature,
        run_id=run_id,
        task_id=task_id,
        context=context,
    )
    response = await generate(model, request)
    output = response.output
    if not isinstance(output, output_type):
        raise wrong_answer(request, output_type, output, response.usage)
    return output, ModelCall(role=role, purpose=purpose, usage=response.usage)


def wrong_answer(
    request: ModelRequest,
    expected: type,
    output: object,
    usage: TokenUsage | None = None,
) -> ModelError:
    """The error for an answer of the wrong type: it says where it happened
    and keeps the answer's tokens (``usage``, unless the caller counted them
    already), which were spent all the same."""
    error = ModelError(
        f"{request.role}/{request.purpose}: expected {expected.__name__}, "
        f"got {type(output).__name__}",
        usage=usage,
    )
    error.role, error.purpose, error.task_id = (
        request.role,
        request.purpose,
        request.task_id,
    )
    return error


async def generate(model: Model, request: ModelRequest) -> ModelResponse:
    """``model.generate`` in its model-call span, with any model error marked
    with where it happened."""
    if not model_call_traced(model):
        # No span to make: spare the context manager on every call.
        return await _generate(model, request)
    with model_call(model, request) as answered:
        response = await _generate(model, request)
        answered(response)
    return response


async def _generate(model: Model, request: ModelRequest) -> ModelResponse:
    try:
        return await model.generate(request)
    except ModelError as exc:
        exc.role, exc.purpose, exc.task_id = (
            request.role,
            request.purpose,
            request.task_id,
        )
        raise


class Allowance:
    """The tokens a handler may still spend on its model calls."""

    def __init__(self, tokens: int | None) -> None:
        self._left = tokens

    @property
    def spent(self) -> bool:
        return self._left is not None and self._left <= 0

    def charge(self, call: ModelCall) -> None:
        if self._left is not None:
            self._left -= call.usage.total_tokens


_EXPLORE_OUTPUTS: dict[str, type[BaseModel]] = {
    "gaps": ContextAnalysis,
    "hypotheses": HypothesisBatch,
    "validation": ValidationBatch,
    "critique": Critique,
    "compare": Comparison,
    "evolve": HypothesisBatch,
}

MALFORMED: tuple[type[Exception], ...] = (ModelError, ValidationError, TypeError)
"""What counts as malformed output: the wrong type (a model adapter's
``ModelError``, a scripted answer of the wrong type) or one that fails
validation. A transient model error is not malformed: it crashes the call and
the run retries it like any crash."""


async def explore_call(
    model: Model,
    role: Role,
    request: ExploreRequest,
    ctx: ActorContext,
    temperature: float,
) -> ExploreReply:
    """One explore model call, asked once more when the answer is malformed
    (unless the adapter asked again already: ``ModelOutputError.final``); a
    refusal is not asked again.

    A second malformed answer is reported in ``errors`` rather than raised:
    an explore run records it and goes on without that answer. A fatal model
    error (rejected credentials) is raised: it ends the run.
    """
    output_type = _EXPLORE_OUTPUTS[request.purpose]
    if request.temperature is not None:
        temperature = request.temperature
    errors: list[str] = []
    calls: list[ModelCall] = []
    allowance = Allowance(request.token_allowance)
    context = request.context
    for _attempt in range(2):
        if allowance.spent:
            break
        try:
            output, call = await call_model(
                model,
                role=role,
                purpose=request.purpose,
                output_type=output_type,
                context=context,
                temperature=temperature,
                run_id=ctx.run_id,
            )
        except (TransientModelError, BudgetExhausted):
            raise
        except MALFORMED as exc:
            if isinstance(exc, ModelError) and exc.fatal:
                raise  # rejected credentials: no later call will do better
            what = "refused" if isinstance(exc, ModelRefusal) else "malformed output"
            errors.append(f"{role}/{request.purpose}: {what}: {_brief(exc)}")
            usage = exc.usage if isinstance(exc, ModelError) else None
            if usage is not None:
                # A rejected answer costs as much as an accepted one.
                call = ModelCall(role=role, purpose=request.purpose, usage=usage)
                calls.append(call)
                allowance.charge(call)
            if isinstance(exc, ModelOutputError) and exc.final:
                break  # the adapter asked again already: a third try is waste
            if isinstance(exc, ModelRefusal):
                break  # the same prompt again would be refused again
            continue
        calls.append(call)
        allowance.charge(call)
        problem = (
            critique_problem(output, request.lenses)
            if isinstance(output, Critique)
            else None
        )
        if problem is None:
            return ExploreReply(output=output, calls=calls)  # type: ignore[arg-type]
        errors.append(f"{role}/{request.purpose}: malformed output: {problem}")
        # The answer was valid JSON, so no adapter saw the problem: say it,
        # or the same prompt would get the same answer.
        context = {**request.context, "answer_problem": problem}
    return ExploreReply(errors=errors, calls=calls)


def _brief(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "output"
        return f"{where}: {first['msg']}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
