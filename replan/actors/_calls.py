from __future__ import annotations

from collections.abc import Callable
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
from ..messages._base import built
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
    once: bool = False,
) -> tuple[T, ModelCall]:
    """Ask ``model`` for one ``output_type`` answer and report the usage.

    The request carries the structured ``context``; adapters for real models
    render the role's prompt from it, scripted models answer from it directly.
    A malformed answer is asked once more (see :func:`answer`), unless
    ``once``: the caller re-asks itself (an explore call). The usage
    reported covers both calls.

    Raises:
        ModelError: the model answered with the wrong type, or its answer
            failed for good (a second malformed one is ``final``).
    """
    # Copied as validation copies it (the model may change its request's
    # context), not checked again: once per model call.
    request = built(
        ModelRequest,
        {
            "role": role,
            "purpose": purpose,
            "output_type": output_type,
            "temperature": float(temperature),
            "run_id": run_id,
            "task_id": task_id,
            "context": dict(context),
        },
    )
    response = await (generate(model, request) if once else answer(model, request))
    output = response.output
    if not isinstance(output, output_type):
        raise wrong_answer(request, output_type, output, response.usage)
    call = built(ModelCall, {"role": role, "purpose": purpose, "usage": response.usage})
    return output, call


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
    return made_at(error, request)


def made_at(error: ModelError, request: ModelRequest) -> ModelError:
    """``error``, marked with where its call was made (role, purpose, task)."""
    error.role, error.purpose, error.task_id = (
        request.role,
        request.purpose,
        request.task_id,
    )
    return error


async def answer(model: Model, request: ModelRequest) -> ModelResponse:
    """:func:`generate`, asked once more when the answer is malformed.

    DESIGN §5: malformed output is retried once, then recorded as an error.
    An adapter that re-asks by itself marks its error ``final``
    (``OpenAIModel``): it is not asked a third time. A model that does not
    (a ``ScriptedModel``, a user's own) is asked again here, with the problem
    in the request's context as ``answer_problem``, or the same prompt could
    get the same answer. The response (or the error of a second malformed
    answer, then ``final``) carries the tokens of both calls: a rejected
    answer costs as much as an accepted one.
    """
    try:
        return await generate(model, request)
    except ModelOutputError as exc:
        if exc.final:
            raise
        first = exc
    again = request.model_copy(
        update={"context": with_problem(request.context, _brief(first))}
    )
    # Until the re-ask answers, the first answer's tokens are the run's
    # (the supervisor's model keeps them): a request cut short meanwhile
    # (a stop after a drain's grace, the run's end) gives no reply to
    # report them.
    reported = (
        None
        if first.usage is None
        else hold(
            model,
            [ModelCall(role=request.role, purpose=request.purpose, usage=first.usage)],
            run_id=request.run_id,
            task_id=request.task_id,
            context=request.context,
        )
    )
    try:
        response = await generate(model, again)
    except ModelError as exc:
        if reported is not None:
            reported()  # the error carries them
        if first.usage is not None:
            exc.usage = first.usage if exc.usage is None else first.usage + exc.usage
        if isinstance(exc, ModelOutputError):
            exc.final = True  # asked twice: a caller does not ask again
        raise
    if reported is not None:
        reported()  # the response carries them
    if first.usage is None:
        return response
    return response.model_copy(update={"usage": first.usage + response.usage})


def hold(
    model: Model,
    calls: list[ModelCall],
    *,
    run_id: str | None,
    task_id: str | None,
    context: dict[str, Any],
) -> Callable[[], None] | None:
    """Have the supervisor's model (``MeteredModel.unreported``) keep the
    tokens of ``calls``, answered and not reported yet, for the run while
    the next call is out; returns what releases them once a reply or an
    error reports them. None for a model that keeps nothing."""
    unreported = getattr(model, "unreported", None)
    if unreported is None or not calls:
        return None
    releases = [
        unreported(
            call.usage,
            role=call.role,
            purpose=call.purpose,
            run_id=run_id,
            task_id=task_id,
            context=context,
        )
        for call in calls
    ]

    def reported() -> None:
        for release in releases:
            if release is not None:
                release()

    return reported


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
        made_at(exc, request)
        raise


class Allowance:
    """The tokens a handler may still spend on its model calls, and the
    calls it has made (``calls``, for its reply)."""

    def __init__(self, tokens: int | None) -> None:
        self._left = tokens
        self.calls: list[ModelCall] = []

    @property
    def spent(self) -> bool:
        return self._left is not None and self._left <= 0

    def charge(self, call: ModelCall) -> None:
        if self._left is not None:
            self._left -= call.usage.total_tokens

    async def call(self, model: Model, *, output_type: type[T], **request: Any) -> T:
        """:func:`call_model`, recorded and charged.

        Raises:
            ModelError: as :func:`call_model`; it carries the tokens of the
                calls made before it too, since it ends the handler's
                request and no reply will report them.
        """
        # The calls made so far are reported with this one's answer (or
        # error): until then, the supervisor's model keeps their tokens for
        # the run, should the request be cut short (see ``answer``).
        reported = hold(
            model,
            self.calls,
            run_id=request.get("run_id"),
            task_id=request.get("task_id"),
            context=request.get("context", {}),
        )
        try:
            output, call = await call_model(model, output_type=output_type, **request)
        except ModelError as exc:
            if reported is not None:
                reported()
            if self.calls:
                exc.usage = sum(
                    (c.usage for c in self.calls), exc.usage or TokenUsage()
                )
            raise
        if reported is not None:
            reported()
        self.calls.append(call)
        self.charge(call)
        return output


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
                once=True,  # re-asked below, each malformed answer recorded
            )
        except (TransientModelError, BudgetExhausted) as exc:
            _spent_before(exc, calls)
            raise
        except MALFORMED as exc:
            if isinstance(exc, ModelError) and exc.fatal:
                _spent_before(exc, calls)
                raise  # rejected credentials: no later call will do better
            errors.append(
                f"{role}/{request.purpose}: {_failed_how(exc)}: {_brief(exc)}"
            )
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
            context = with_problem(request.context, _brief(exc))
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
        context = with_problem(request.context, problem)
    return ExploreReply(errors=errors, calls=calls)


def _failed_how(exc: Exception) -> str:
    """How an explore call failed, for its error: ``refused``, ``malformed
    output`` (an answer of the wrong shape or type), or ``failed`` (no answer
    to read: an HTTP error, a redirect, the server's own error, a body that
    is no chat completion)."""
    if isinstance(exc, ModelRefusal):
        return "refused"
    if isinstance(exc, ModelOutputError):
        return "failed" if exc.no_completion else "malformed output"
    return "failed" if isinstance(exc, ModelError) else "malformed output"


def _spent_before(exc: ModelError, calls: list[ModelCall]) -> None:
    """Add what the answers before ``exc`` used (a malformed one whose re-ask
    failed) to its usage: the error is all the run hears of the request."""
    if calls:
        exc.usage = sum((c.usage for c in calls), exc.usage or TokenUsage())


def with_problem(context: dict[str, Any], problem: str) -> dict[str, Any]:
    """The context of a re-ask: what was wrong with the last answer, as
    ``answer_problem`` (the prompts show it; a scripted model can read it)."""
    return {**context, "answer_problem": problem}


def _brief(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "output"
        return f"{where}: {first['msg']}"
    # Its lines folded, not its first alone: an adapter's "not a valid X,
    # even after a re-ask:" has what was wrong on the lines below.
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines) if lines else type(exc).__name__
