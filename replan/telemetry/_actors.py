"""Actor spans (started in the worker, under the sender's context) and model-call spans.

Context does not cross an anyio channel by itself: the envelope carries the
sender's W3C context, and :func:`serving` starts the actor's span as its child.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from .._errors import ModelError
from ..messages import (
    EXECUTOR_CRASHED,
    AlignmentReply,
    Comparison,
    Critique,
    CritiqueReply,
    ExecuteReply,
    ExecuteRequest,
    ExploreReply,
    ExploreRequest,
    GateRequest,
    GateResolution,
    PlanRequest,
    RankReply,
    ReviewReply,
    SynthesizeRequest,
    TaskOutcome,
    TokenUsage,
    ToolCall,
)
from ..messages._gate import POLICY_TIMEOUT
from . import _names as n
from ._content import input_messages, output_messages
from ._guard import end
from ._propagation import carried_context
from ._telemetry import Telemetry, truncate

_ACTIVE: ContextVar[Telemetry | None] = ContextVar("replan_telemetry", default=None)
"""The telemetry of the actor span being served (read by model-call spans)."""

_EXPLORE_IDS = (
    ("hypothesis_id", n.EXPLORE_HYPOTHESIS),
    ("a_id", n.EXPLORE_A),
    ("b_id", n.EXPLORE_B),
)
"""Context keys of an explore request naming the hypotheses it is about."""

_PURPOSES: dict[type, str] = {
    ExecuteRequest: "execute",
    SynthesizeRequest: "synthesize",
}


def _describe_request(
    role: str, request: object, run_id: str | None
) -> tuple[str, dict[str, AttributeValue]] | None:
    """The span name and first attributes of a request; None for no span."""
    attrs: dict[str, AttributeValue] = {n.GEN_AI_AGENT_NAME: role}
    if run_id is not None:
        attrs[n.GEN_AI_CONVERSATION_ID] = run_id
    match request:
        case PlanRequest(purpose=purpose):
            attrs[n.GEN_AI_OPERATION_NAME] = n.OP_PLAN
            attrs[n.PURPOSE] = purpose
            return n.SPAN_PLAN, attrs
        case GateRequest():
            attrs[n.GATE_ID] = request.gate_id
            attrs[n.GATE_REASON] = truncate(request.reason)
            if request.expires_at is not None:
                timeout = request.expires_at - request.created_at
                attrs[n.GATE_TIMEOUT_S] = timeout.total_seconds()
            return n.SPAN_GATE, attrs
        case ExecuteRequest(task=task):
            attrs[n.TASK_ID] = task.id
            attrs[n.TASK_ATTEMPT] = task.attempts
        case ExploreRequest(purpose=purpose, context=context):
            # What an explore call asks (gaps, critique, compare...), and of
            # which hypotheses, rather than the request kind alone.
            attrs[n.GEN_AI_OPERATION_NAME] = n.OP_INVOKE_AGENT
            attrs[n.PURPOSE] = purpose
            for key, name in _EXPLORE_IDS:
                value = context.get(key)
                if isinstance(value, str):
                    attrs[name] = value
            return n.SPAN_AGENT_PREFIX + role, attrs
    attrs[n.GEN_AI_OPERATION_NAME] = n.OP_INVOKE_AGENT
    kind = getattr(request, "kind", "")
    attrs[n.PURPOSE] = _PURPOSES.get(type(request), kind.removesuffix("_request"))
    return n.SPAN_AGENT_PREFIX + role, attrs


def gate_outcome(by: str) -> str:
    """A gate's ``replan.gate.outcome``: ``timed_out`` when nobody answered
    (the policy's default applied), else ``resolved``."""
    return n.TIMED_OUT if by == POLICY_TIMEOUT else n.RESOLVED


def task_outcome(outcome: TaskOutcome) -> str:
    """An attempt's ``replan.task.outcome``: ``completed``, ``failed``,
    ``transient_failure``, or ``crashed`` (its executor raised)."""
    if outcome.success:
        return "completed"
    if outcome.reason and outcome.reason.startswith(EXECUTOR_CRASHED):
        return "crashed"
    return "transient_failure" if outcome.transient else "failed"


def _evaluation(
    span: Span,
    name: str,
    score: float,
    label: str | None = None,
    explanation: str = "",
    extra: dict[str, AttributeValue] | None = None,
) -> None:
    attrs: dict[str, AttributeValue] = {
        n.GEN_AI_EVALUATION_NAME: name,
        n.GEN_AI_EVALUATION_SCORE_VALUE: score,
    }
    if label is not None:
        attrs[n.GEN_AI_EVALUATION_SCORE_LABEL] = label
    if explanation:
        attrs[n.GEN_AI_EVALUATION_EXPLANATION] = truncate(explanation)
    if extra:
        attrs.update(extra)
    span.add_event(n.EVENT_EVALUATION, attrs)


def describe_reply(span: Span, reply: object) -> None:
    """Outcome attributes and evaluation events of an actor's answer."""
    match reply:
        case ExecuteReply():
            span.set_attribute(n.TASK_OUTCOME, task_outcome(reply.outcome))
        case ReviewReply(verdict=verdict):
            _evaluation(
                span,
                "milestone",
                verdict.confidence,
                verdict.decision,
                verdict.rationale,
            )
            event: dict[str, AttributeValue] = {
                n.REPLAN_DECISION: verdict.decision,
                n.REPLAN_DECIDED_BY: "model",
                n.REPLAN_CONFIDENCE: verdict.confidence,
            }
            if verdict.trigger is not None:
                event[n.REPLAN_TRIGGER] = verdict.trigger.value
            span.add_event(n.EVENT_DECISION, event)
        case CritiqueReply(critiques=critiques):
            for index, critique in enumerate(critiques):
                for lens, score in critique.scores.items():
                    _evaluation(
                        span,
                        lens,
                        score,
                        explanation=critique.critique,
                        extra={n.CANDIDATE_INDEX: index},
                    )
        case AlignmentReply(alignment=alignment):
            aligned = sum(alignment.aligned)
            total = len(alignment.aligned)
            _evaluation(
                span,
                "goal_alignment",
                aligned / total if total else 1.0,
                f"{aligned}/{total} aligned",
                alignment.rationale,
            )
        case RankReply(wins=wins, order=order):
            for rank, index in enumerate(order, start=1):
                _evaluation(
                    span,
                    "tournament",
                    float(wins[index]),
                    f"rank {rank}",
                    extra={n.CANDIDATE_INDEX: index},
                )
        case ExploreReply(output=Critique() as critique):
            for lens, score in critique.scores.items():
                _evaluation(span, lens, score, explanation=critique.critique)
        case ExploreReply(output=Comparison() as comparison):
            _evaluation(
                span,
                "comparison",
                1.0 if comparison.winner == "a" else 0.0,
                comparison.winner,
                comparison.rationale,
            )
        case GateResolution(decision=decision, by=by):
            span.set_attribute(n.GATE_DECISION, decision)
            span.set_attribute(n.GATE_DECIDED_BY, by)
            span.set_attribute(n.GATE_OUTCOME, gate_outcome(by))


class ActorSpan:
    """The span of one request being handled; record the answer with :meth:`replied`.

    An unbounded wait inside the handler (a tool call's gate with no
    timeout) splits it: :func:`actor_span_suspended` ends it ``suspended``
    and goes on in a new span of the same name, linked to the old one.
    """

    __slots__ = ("_attrs", "_name", "_telemetry", "_token", "span")

    def __init__(
        self,
        span: Span,
        telemetry: Telemetry | None = None,
        name: str = "",
        attrs: dict[str, AttributeValue] | None = None,
    ) -> None:
        self.span = span
        self._telemetry = telemetry
        self._name = name
        self._attrs = attrs or {}
        self._token: object | None = None
        """The context this span's split attached (detached at the end)."""

    def replied(self, reply: object) -> None:
        describe_reply(self.span, reply)

    def _make_current(self, span: Span, parent: context.Context | None) -> None:
        # In the handler's task, over the context it started with: the
        # tokens stay last-in first-out.
        if self._token is not None:
            context.detach(self._token)  # type: ignore[arg-type]
        self._token = context.attach(trace.set_span_in_context(span, parent))

    def suspend(self, reason: str) -> SpanContext | None:
        """End the span ``suspended``. Until :meth:`resume` it stays current
        as a context only: what the wait sends (the gate's request) is
        traced under it, and nothing records a span in this task."""
        span = self.span
        if not span.is_recording():
            return None
        span.set_attribute(n.ACTOR_OUTCOME, n.SUSPENDED)
        span.set_attribute(n.SUSPEND_REASON, truncate(reason))
        end(span)
        ended = span.get_span_context()
        self.span = trace.INVALID_SPAN
        self._make_current(trace.NonRecordingSpan(ended), None)
        return ended

    def resume(self, old: SpanContext, parent: context.Context) -> None:
        """Go on in a new span under ``parent``, linked to the suspended one."""
        assert self._telemetry is not None
        self.span = self._telemetry.tracer.start_span(
            self._name,
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=self._attrs,
            links=[Link(old, {n.LINK_KIND: "resumes"})],
        )
        self._make_current(self.span, None)

    def close(self) -> None:
        if self._token is not None:
            context.detach(self._token)  # type: ignore[arg-type]
            self._token = None


_SERVING: ContextVar[ActorSpan | None] = ContextVar("replan_actor_span", default=None)
"""The actor span of the request being handled in this task, if recorded."""


@contextmanager
def actor_span_suspended(
    reason: str, parent: Callable[[], context.Context | None]
) -> Iterator[None]:
    """Around an unbounded wait inside an actor's handler (its own task).

    The handler's span ends ``suspended`` as the wait begins, so that no
    span is held open across it. When the wait is over, the handler goes on
    in a new span of the same name under ``parent()`` (the run's root as it
    is then: the run's trace may have been suspended and resumed meanwhile),
    linked to the old one; with no parent to go on under, untraced. Cut
    short, the handler ends with the suspended span.
    """
    actor = _SERVING.get()
    old = actor.suspend(reason) if actor is not None else None
    yield
    if actor is None or old is None:
        return
    under = parent()
    if under is not None:
        actor.resume(old, under)


@contextmanager
def serving(
    telemetry: Telemetry | None,
    role: str,
    request: object,
    run_id: str | None,
    carrier: dict[str, str],
) -> Iterator[ActorSpan | None]:
    """Handle a request under the sender's context, in the actor's span.

    Yields None (no span) without ``telemetry``, or when the sender's trace
    is not sampled. A gate without a timeout gets an ``await approval`` span
    that ends as it opens: no span is held open across an unbounded wait.
    """
    parent = carried_context(carrier)
    described = None
    if telemetry is not None:
        sender = trace.get_current_span(parent).get_span_context()
        if sender.trace_flags.sampled:
            described = _describe_request(role, request, run_id)
    if described is None:
        token = context.attach(parent)
        try:
            yield None
        finally:
            context.detach(token)
        return
    name, attrs = described
    assert telemetry is not None
    if attrs.get(n.GEN_AI_OPERATION_NAME) in (n.OP_INVOKE_AGENT, n.OP_PLAN):
        attrs[n.GEN_AI_PROVIDER_NAME] = telemetry.provider_name
    span = telemetry.tracer.start_span(
        name, context=parent, kind=SpanKind.INTERNAL, attributes=attrs
    )
    if isinstance(request, GateRequest) and request.expires_at is None:
        # An unbounded wait holds no span open: the gate is recorded as it
        # opens, and the run suspends its trace while nothing else moves.
        span.set_attribute(n.GATE_OUTCOME, n.SUSPENDED)
        end(span)
        span = trace.INVALID_SPAN
    if not span.is_recording():
        active = _ACTIVE.set(telemetry)
        try:
            with current(span, parent):
                yield None
        finally:
            _ACTIVE.reset(active)
        return
    actor = ActorSpan(span, telemetry, name, attrs)
    active = _ACTIVE.set(telemetry)
    serving_token = _SERVING.set(actor)
    token = context.attach(trace.set_span_in_context(span, parent))
    try:
        yield actor
    except Exception as exc:
        _failed(actor.span, exc)
        actor.span.set_attribute(n.ACTOR_OUTCOME, "crashed")
        if isinstance(request, ExecuteRequest):
            actor.span.set_attribute(n.TASK_OUTCOME, "crashed")
        raise
    except BaseException:
        actor.span.set_attribute(n.ACTOR_OUTCOME, "cancelled")
        raise
    finally:
        actor.close()
        context.detach(token)
        end(actor.span)
        _SERVING.reset(serving_token)
        _ACTIVE.reset(active)


def _failed(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.set_attribute(n.ERROR_TYPE, type(exc).__qualname__)


@contextmanager
def current(span: Span, parent: context.Context | None = None) -> Iterator[Span]:
    """Make ``span`` current for the block and end it after.

    An exception is recorded with status ERROR; a cancellation is not an
    error (the caller gave up, or the supervisor is stopping) and is noted
    in ``replan.actor.outcome`` instead.
    """
    token = context.attach(trace.set_span_in_context(span, parent))
    try:
        yield span
    except Exception as exc:
        _failed(span, exc)
        span.set_attribute(n.ACTOR_OUTCOME, "crashed")
        raise
    except BaseException:
        span.set_attribute(n.ACTOR_OUTCOME, "cancelled")
        raise
    finally:
        context.detach(token)
        end(span)


# Model calls -----------------------------------------------------------------------


def _ignore(response: Any) -> None:
    return None


def _spent(span: Span, usage: TokenUsage) -> None:
    span.set_attribute(n.GEN_AI_USAGE_INPUT_TOKENS, usage.input_tokens)
    span.set_attribute(n.GEN_AI_USAGE_OUTPUT_TOKENS, usage.output_tokens)


def _temperature(model: object, request: Any) -> float:
    """The temperature the model sends (an adapter may set its own)."""
    temperature_for = getattr(model, "temperature_for", None)
    if callable(temperature_for):
        value = temperature_for(request)
        if isinstance(value, int | float):
            return float(value)
    return float(request.temperature)


def _model_name(model: object, role: str) -> str:
    model_for = getattr(model, "model_for", None)
    if callable(model_for):
        name = model_for(role)
        if isinstance(name, str) and name:
            return name
    name = getattr(model, "name", None)
    return name if isinstance(name, str) and name else "unknown"


def _prompt_of(model: object, request: Any) -> list[Any]:
    """What ``model`` is shown for ``request``, as far as it tells.

    A model with ``prompt_messages(request)`` (``OpenAIModel``) renders its
    prompt; any other is taken to see the request's messages, or else its
    structured context.
    """
    render = getattr(model, "prompt_messages", None)
    if callable(render):
        try:
            return list(render(request))
        except Exception:  # the call itself reports a prompt it cannot render
            pass
    return request.messages or [{"role": "user", "content": request.context}]


def model_call_traced(model: object) -> bool:
    """Would :func:`model_call` make a span here? (False: skip it entirely.)"""
    return (
        _ACTIVE.get() is not None
        and trace.get_current_span().is_recording()
        and not getattr(model, "otel_instrumented", False)
    )


@contextmanager
def model_call(model: object, request: Any) -> Iterator[Callable[[Any], None]]:
    """A ``chat <model>`` CLIENT span around one model call.

    Yields a function to call with the ``ModelResponse``. No span when the
    actor span is not recording, or when the model's client is instrumented
    itself (``model.otel_instrumented``): its own span then carries the call
    and its tokens, nested under the actor span, so tokens are counted once.
    """
    telemetry = _ACTIVE.get()
    if (
        telemetry is None
        or not trace.get_current_span().is_recording()
        or getattr(model, "otel_instrumented", False)
    ):
        yield _ignore
        return
    role = str(request.role)
    model_name = _model_name(model, role)
    attrs: dict[str, AttributeValue] = {
        n.GEN_AI_OPERATION_NAME: n.OP_CHAT,
        n.GEN_AI_PROVIDER_NAME: str(getattr(model, "provider_name", None) or "unknown"),
        n.GEN_AI_REQUEST_MODEL: model_name,
        n.GEN_AI_REQUEST_TEMPERATURE: _temperature(model, request),
        n.GEN_AI_AGENT_NAME: role,
        n.PURPOSE: str(request.purpose),
        n.GEN_AI_OUTPUT_TYPE: "json",
    }
    if request.run_id is not None:
        attrs[n.GEN_AI_CONVERSATION_ID] = request.run_id
    if request.task_id is not None:
        attrs[n.TASK_ID] = request.task_id
    prompt: list[Any] = []
    if telemetry.capture_content:
        prompt = _prompt_of(model, request)
        attrs[n.GEN_AI_INPUT_MESSAGES] = input_messages(prompt)
    span = telemetry.tracer.start_span(
        n.SPAN_CHAT_PREFIX + model_name, kind=SpanKind.CLIENT, attributes=attrs
    )
    with current(span):

        def answered(response: Any) -> None:
            _spent(span, response.usage)
            if response.model:
                span.set_attribute(n.GEN_AI_RESPONSE_MODEL, response.model)
            if telemetry.capture_content:
                reask = getattr(response, "reask", None)
                if reask:
                    # What the answer replied to: the prompt and the re-ask.
                    span.set_attribute(
                        n.GEN_AI_INPUT_MESSAGES, input_messages(prompt + reask)
                    )
                span.set_attribute(n.GEN_AI_OUTPUT_MESSAGES, output_messages(response))

        try:
            yield answered
        except ModelError as exc:
            # A failed call may still have cost tokens (a re-asked answer).
            if exc.usage is not None:
                _spent(span, exc.usage)
            raise


# Tool calls ------------------------------------------------------------------------


ToolDone = Callable[[str, str, BaseException | None], None]
"""``done(outcome, content, error)``: how a tool call ended, for its span."""


def _tool_ignore(outcome: str, content: str, error: BaseException | None) -> None:
    return None


@contextmanager
def tool_call(
    call: ToolCall, description: str, side_effect: bool, key: str, run_id: str
) -> Iterator[ToolDone]:
    """An ``execute_tool <name>`` span around one tool call of the executor.

    Yields a function to call with the outcome (``ran``, ``failed``,
    ``reused``), what the model reads, and the tool's exception if it
    raised. No span outside a recording actor span. The span covers the
    tool's run only, never a wait for a person's approval (which may be
    unbounded).
    """
    telemetry = _ACTIVE.get()
    if telemetry is None or not trace.get_current_span().is_recording():
        yield _tool_ignore
        return
    attrs: dict[str, AttributeValue] = {
        n.GEN_AI_OPERATION_NAME: n.OP_EXECUTE_TOOL,
        n.GEN_AI_CONVERSATION_ID: run_id,
        n.GEN_AI_TOOL_NAME: call.name,
        n.GEN_AI_TOOL_CALL_ID: call.id,
        n.GEN_AI_TOOL_TYPE: "function",
        n.TOOL_SIDE_EFFECT: side_effect,
        n.TOOL_IDEMPOTENCY_KEY: key,
    }
    if description:
        attrs[n.GEN_AI_TOOL_DESCRIPTION] = truncate(description)
    if telemetry.capture_content:
        attrs[n.GEN_AI_TOOL_CALL_ARGUMENTS] = truncate(call.arguments)
    span = telemetry.tracer.start_span(
        n.SPAN_TOOL_PREFIX + call.name, kind=SpanKind.INTERNAL, attributes=attrs
    )
    with current(span):

        def done(outcome: str, content: str, error: BaseException | None) -> None:
            span.set_attribute(n.TOOL_OUTCOME, outcome)
            if telemetry.capture_content:
                span.set_attribute(n.GEN_AI_TOOL_CALL_RESULT, truncate(content))
            if error is not None:
                span.record_exception(error)
                span.set_status(
                    Status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
                )
                span.set_attribute(n.ERROR_TYPE, type(error).__qualname__)

        try:
            yield done
        except BaseException:
            span.set_attribute(n.TOOL_OUTCOME, "cancelled")
            raise
