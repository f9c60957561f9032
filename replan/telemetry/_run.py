"""One run's trace: the root span, a span per replan decision, suspension.

The driver owns a :class:`RunTrace`. It starts the root when the run starts
(:meth:`RunTrace.running`), opens a ``replan`` span around each replan
decision (:meth:`RunTrace.replanning`), suspends the trace around a gate that
waits without bound (:meth:`RunTrace.waiting`), and sees every event the
driver journals (:meth:`RunTrace.on_events`): decisions, usage and the end of
the run become span attributes and metrics from there, in one place.

Spans are made current in the driver's own task only; tasks the driver starts
inherit the context of the moment they start.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime
from typing import TYPE_CHECKING

import anyio
from opentelemetry import baggage, context, trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from .._errors import LeaseLost
from ..messages import (
    Event,
    GateRequest,
    GateResolved,
    MilestoneReviewed,
    PlanVersion,
    ReplanApplied,
    ReplanRecord,
    ReplanRefused,
    RunFinished,
    RunStatus,
    TaskFinished,
    TaskStarted,
    TokenUsage,
    TraceStarted,
    TraceSuspended,
    UsageRecorded,
    Verdict,
)
from . import _names as n
from ._actors import gate_outcome, task_outcome
from ._guard import end
from ._telemetry import Telemetry, truncate

if TYPE_CHECKING:
    from ..supervisor import RunState

logger = logging.getLogger("replan.telemetry")

Record = Callable[..., Awaitable[object]]
"""The driver's ``record_events``: journals ``(event class, fields)`` pairs."""
Stage = Callable[..., object]
"""The driver's ``stage``: builds ``(event class, fields)`` pairs into events
that go out with its next append."""

_W3C = TraceContextTextMapPropagator()
"""Journaled contexts are W3C whatever propagator the application set."""


def journaled_context(carrier: dict[str, str] | None) -> SpanContext | None:
    """The span context a ``TraceSuspended`` event saved, if it is valid."""
    if not carrier:
        return None
    span_context = trace.get_current_span(_W3C.extract(carrier)).get_span_context()
    return span_context if span_context.is_valid else None


def resumed_root(
    state: RunState,
    *,
    telemetry: Telemetry | None = None,
    segment: int = 1,
) -> Span:
    """Start a run's root span in a new trace, linked to its suspended root.

    The driver does this itself when it starts a run whose journal holds a
    ``TraceSuspended`` event; this function is for code that resumes a run
    some other way. The caller ends the span.
    """
    telemetry = telemetry or Telemetry()
    links = []
    old = journaled_context(state.last_trace or state.suspended_trace)
    if old is not None:
        links.append(Link(old, {n.LINK_KIND: "resumes"}))
    return _start_root(telemetry, state, links, segment)


def _start_root(
    telemetry: Telemetry, state: RunState, links: Sequence[Link], segment: int
) -> Span:
    root = telemetry.tracer.start_span(
        n.SPAN_RUN, context=_baggage_only(), kind=SpanKind.INTERNAL, links=links
    )
    if root.is_recording():
        spec = state.spec
        attrs: dict[str, AttributeValue] = {
            n.GEN_AI_OPERATION_NAME: n.OP_INVOKE_WORKFLOW,
            n.GEN_AI_WORKFLOW_NAME: n.LIBRARY,
            n.GEN_AI_CONVERSATION_ID: state.run_id,
            n.RUN_KIND: spec.kind,
            n.RUN_SEGMENT: segment,
        }
        if spec.kind == "plan":  # an explore run has no pattern
            attrs[n.RUN_PATTERN] = spec.pattern
        for name, value in spec.limits.model_dump(exclude_none=True).items():
            if isinstance(value, int | float):
                attrs[n.LIMIT_PREFIX + name] = value
        root.set_attributes(attrs)
    return root


def _baggage_only() -> context.Context:
    """A context without a span, so that the root starts a trace of its own
    (one trace per run, not a child of whoever submitted), that holds the
    current baggage, as the spans under the root see it."""
    carried = context.Context()
    for name, value in baggage.get_all().items():
        carried = baggage.set_baggage(name, value, carried)
    return carried


class RunTrace:
    """The spans of one run, kept by its driver.

    Args:
        telemetry: the supervisor's tracer and instruments.
        state: the run's state when the driver takes it.
        record: the driver's ``record_events``, to journal a suspension.
        normal_ends: exception types that end a run normally (not errors).
        stage: the driver's ``stage``, to journal each trace segment's start
            with the next append (none: not journaled).
    """

    def __init__(
        self,
        telemetry: Telemetry,
        state: RunState,
        record: Record,
        normal_ends: tuple[type[BaseException], ...] = (),
        stage: Stage | None = None,
    ) -> None:
        self._t = telemetry
        self._state = state
        self._record = record
        self._stage = stage
        self._normal_ends = normal_ends
        self.recording = False
        self._root: Span | None = None
        self._replan: Span | None = None
        self._replan_attrs: dict[str, AttributeValue] = {}
        self._replan_base = (0, 0)
        """Input and output tokens used before the open replan decision."""
        self._decided = False
        self._cut = False
        """The open replan decision was cut short (a cancellation, an error):
        the supervisor's stop suspends it, the run's end concludes it."""
        self._cut_reason: str | None = None
        """Why, when an error cut it short."""
        self._journaled_replan = journaled_context(state.suspended_replan)
        """A decision an earlier process suspended: the next one continues it."""
        self._journaled_replan_usage = state.suspended_replan_usage
        self._suspended_root: SpanContext | None = None
        self._suspended_replan: SpanContext | None = None
        self._token: object | None = None
        self._driver: int | None = None
        """The driver's task: the only one whose context :meth:`_refresh`
        changes (a token is detached in the context it was made in)."""
        self._resolved_meanwhile: list[dict[str, AttributeValue]] = []
        """``replan.gate.resolved`` events of gates answered while the trace
        was suspended, for the root it resumes in."""
        self._idle = False
        """Suspended by :meth:`idle`: only people could move the run."""
        self._stale = False
        """The open spans changed in a task other than the driver's: the
        driver's context catches up at :meth:`sync`."""
        self._segment = 0
        self._started: dict[str, datetime] = {}

    # The run ---------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Keep the run's root span for the block (the driver's ``run``).

        Cancelled from outside (the supervisor stops with the run in flight),
        the trace is suspended and its context journaled, to be linked from
        the trace of the resumed run.
        """
        self._begin()
        try:
            yield
        except anyio.get_cancelled_exc_class():
            if self._root is not None:
                with anyio.CancelScope(shield=True):
                    await self.suspend("the supervisor stopped with the run in flight")
            raise
        except Exception as exc:
            for span in (self._replan, self._root):
                if span is not None:
                    span.record_exception(exc)
                    span.set_status(
                        Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
                    )
            raise
        finally:
            for span in (self._replan, self._root):
                if span is not None:
                    end(span)
            self._replan = self._root = None
            self._refresh(final=True)

    def _begin(self) -> None:
        self._driver = anyio.get_current_task().id
        state = self._state
        links: list[Link] = []
        submitter = trace.get_current_span().get_span_context()
        if submitter.is_valid:
            links.append(Link(submitter, {n.LINK_KIND: "submitted_by"}))
        old = journaled_context(state.last_trace or state.suspended_trace)
        if old is not None:
            links.append(Link(old, {n.LINK_KIND: "resumes"}))
        self._segment = self._next_segment(state)
        self._root = _start_root(self._t, state, links, self._segment)
        self.recording = self._root.is_recording()
        self._started_segment()
        self._refresh()

    def _next_segment(self, state: RunState) -> int:
        return max(self._segment, state.suspensions, state.trace_segment) + 1

    def _started_segment(self) -> None:
        """Stage the new root's context, for a resume after a crash to link
        to (only while traced: an untraced run journals nothing of it)."""
        root = self._root
        if self._stage is None or root is None or not root.is_recording():
            return
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, context=trace.set_span_in_context(root))
        if carrier:
            self._stage((TraceStarted, {"carrier": carrier, "segment": self._segment}))

    def _refresh(self, *, final: bool = False) -> None:
        """Make the innermost open span current in the driver's task.

        With none open (suspended), no span is current: what the driver asks
        meanwhile is not parented to whoever submitted the run. Should it be
        called from another task, it leaves that task's context alone (a
        token must be detached in the context it was made in) and the
        driver's to catch up at :meth:`sync`.
        """
        if anyio.get_current_task().id != self._driver:
            self._stale = True
            return
        self._stale = False
        if self._token is not None:
            context.detach(self._token)  # type: ignore[arg-type]
            self._token = None
        if not final:
            span = self._replan or self._root or trace.INVALID_SPAN
            self._token = context.attach(trace.set_span_in_context(span))

    def sync(self) -> None:
        """In the driver's task: make current what changed in another."""
        if self._stale:
            self._refresh()

    def _child_context(self) -> context.Context:
        parent = self._replan or self._root
        return trace.set_span_in_context(parent or trace.INVALID_SPAN)

    # Replans ---------------------------------------------------------------------

    @contextmanager
    def replanning(self, verdict: Verdict) -> Iterator[None]:
        """One ``replan`` span around one replan decision, applied or refused."""
        if not self.recording or self._root is None:
            yield
            return
        attrs: dict[str, AttributeValue] = {
            n.GEN_AI_CONVERSATION_ID: self._state.run_id,
            n.REPLAN_TRIGGER: verdict.trigger.value if verdict.trigger else "none",
            n.REPLAN_CONFIDENCE: verdict.confidence,
            n.REPLAN_RATIONALE: truncate(verdict.rationale),
        }
        links: list[Link] = []
        spent = TokenUsage()
        if self._journaled_replan is not None:
            # The decision an earlier process suspended, going on here.
            links.append(Link(self._journaled_replan, {n.LINK_KIND: "resumes"}))
            spent = self._journaled_replan_usage or spent
            self._journaled_replan = self._journaled_replan_usage = None
        used = self._state.usage.total
        self._replan_base = (
            used.input_tokens - spent.input_tokens,
            used.output_tokens - spent.output_tokens,
        )
        self._replan_attrs = attrs
        self._decided = self._cut = False
        self._replan = self._t.tracer.start_span(
            n.SPAN_REPLAN, context=self._child_context(), attributes=attrs, links=links
        )
        self._refresh()
        try:
            yield
        except anyio.get_cancelled_exc_class():
            # From outside: the supervisor's stop suspends the decision, the
            # run's end concludes it (see suspend and _finished).
            self._cut = True
            raise
        except BaseException as exc:
            if self._replan is None and self._suspended_replan is not None:
                # Ended while suspended at its gate: concluded in a new trace.
                self.resume()
            span = self._replan
            if span is not None and not self._decided:
                self._cut_reason = str(exc) or type(exc).__name__
                self._interrupted(span, self._cut_reason)
                if isinstance(exc, Exception) and not isinstance(
                    exc, self._normal_ends
                ):
                    span.record_exception(exc)
                    span.set_status(
                        Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
                    )
            # The run's end journals what the decision cost until now (a
            # failed call's tokens): its span ends with the run's end.
            self._cut = True
            raise
        finally:
            if not self._cut:
                self._end_replan()

    def _end_replan(self) -> None:
        if self._replan is not None:
            end(self._replan)
        self._replan = None
        self._suspended_replan = None
        self._cut = False
        self._cut_reason = None
        self._refresh()

    def _interrupted(self, span: Span, reason: str) -> None:
        """A decision that ended without being made: why, and what it cost."""
        state = self._state
        limits = state.spec.limits
        span.set_attributes(
            {
                n.REPLAN_OUTCOME: n.INTERRUPTED,
                n.REPLAN_REASON: truncate(reason),
                n.REPLAN_VERSION: len(state.versions),
                n.REPLAN_REPLANS_REMAINING: max(
                    0, limits.max_replans - state.replans_applied
                ),
                **self._replan_spent(state),
            }
        )

    def _replan_tokens(self, state: RunState) -> tuple[int, int]:
        """The input and output tokens the open decision used so far."""
        used = state.usage.total
        base_in, base_out = self._replan_base
        return used.input_tokens - base_in, used.output_tokens - base_out

    def _replan_spent(self, state: RunState) -> dict[str, AttributeValue]:
        spent_in, spent_out = self._replan_tokens(state)
        return {
            n.REPLAN_USAGE_INPUT_TOKENS: spent_in,
            n.REPLAN_USAGE_OUTPUT_TOKENS: spent_out,
        }

    def _decided_replan(
        self, record: ReplanRecord, version: PlanVersion | None, state: RunState
    ) -> None:
        trigger = record.trigger.value if record.trigger else "none"
        self._t.replans.add(
            1, {n.REPLAN_TRIGGER: trigger, n.REPLAN_OUTCOME: record.outcome.value}
        )
        span = self._replan
        if span is None or not span.is_recording():
            return
        self._decided = True
        limits = state.spec.limits
        attrs: dict[str, AttributeValue] = {
            n.REPLAN_OUTCOME: record.outcome.value,
            n.REPLAN_REASON: truncate(record.reason),
            n.REPLAN_VERSION: len(state.versions),
            n.REPLAN_REPLANS_REMAINING: max(
                0, limits.max_replans - state.replans_applied
            ),
            **self._replan_spent(state),
        }
        diff = version if version is not None else record.proposed
        if diff is not None:
            attrs[n.REPLAN_PROPOSED_VERSION] = diff.version
            attrs[n.REPLAN_TASKS_REMOVED] = list(diff.removed)
            attrs[n.REPLAN_TASKS_ADDED] = list(diff.added)
            attrs[n.REPLAN_TASKS_PRESERVED] = list(diff.preserved)
            if diff.approved_by:
                attrs[n.REPLAN_APPROVED_BY] = diff.approved_by
        span.set_attributes(attrs)

    # Suspension -----------------------------------------------------------------

    @asynccontextmanager
    async def waiting(self, request: GateRequest) -> AsyncIterator[None]:
        """Around a gate's wait: suspend the trace when it has no timeout.

        A bounded wait keeps the spans open (the gate's ``await approval``
        span covers it); an unbounded one ends them ``suspended``, journals
        the root's context, and continues in a new trace linked to it once
        the gate is answered.
        """
        if (
            request.expires_at is not None
            or request.tool_call is not None
            or not self.recording
            or not self._root
        ):
            # A tool call's gate holds up its attempt only: the driver
            # suspends the trace once nothing but people can move the run
            # on (see idle), and the human-gate actor records the gate under
            # the executor span that waits.
            yield
            return
        gate = self._t.tracer.start_span(
            n.SPAN_GATE,
            context=self._child_context(),
            attributes={
                n.GEN_AI_CONVERSATION_ID: self._state.run_id,
                n.GEN_AI_AGENT_NAME: "human_gate",
                n.GATE_ID: request.gate_id,
                n.GATE_REASON: truncate(request.reason),
                n.GATE_OUTCOME: n.SUSPENDED,
            },
        )
        end(gate)
        await self.suspend(f"gate {request.gate_id} waits for a person, no timeout")
        yield
        self.resume()

    @asynccontextmanager
    async def idle(self, reason: str) -> AsyncIterator[None]:
        """Around a wait only people can end (approvals without a timeout)."""
        if not self.recording or self._root is None:
            yield
            return
        await self.suspend(reason)
        self._idle = True
        try:
            yield
        finally:
            self._idle = False
        self.resume()

    def live_context(self) -> context.Context | None:
        """The context an attempt goes on in after a person answered its
        tool call's gate (from the attempt's task).

        The run's root; if the trace is suspended because only people could
        move the run, the answer moves it, so the trace resumes now. If the
        driver itself waits at a gate, the trace stays suspended and the
        attempt goes on under the suspended root, as attempts in flight do.
        None when the run is not traced or its trace has ended.
        """
        if not self.recording:
            return None
        if self._root is None and self._idle:
            self.resume()
        if self._root is not None:
            return trace.set_span_in_context(self._root, context.Context())
        if self._suspended_root is not None:
            suspended = trace.NonRecordingSpan(self._suspended_root)
            return trace.set_span_in_context(suspended, context.Context())
        return None

    async def suspend(self, reason: str) -> None:
        """End the open spans ``suspended`` and journal the root's context."""
        root = self._root
        if root is None or not self.recording:
            return
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, context=trace.set_span_in_context(root))
        if self._replan is not None:
            self._replan.set_attribute(n.REPLAN_OUTCOME, n.SUSPENDED)
            self._replan.set_attribute(n.SUSPEND_REASON, reason)
            self._suspended_replan = self._replan.get_span_context()
            end(self._replan)
            self._replan = None
        self._end_attributes(root, self._state)
        root.set_attribute(n.RUN_OUTCOME, n.SUSPENDED)
        root.set_attribute(n.SUSPEND_REASON, reason)
        end(root)
        self._suspended_root = root.get_span_context()
        self._root = None
        self._refresh()
        fields: dict[str, object] = {"carrier": carrier, "reason": reason}
        try:
            if self._suspended_replan is not None:
                # A decision under way: the process that goes on with it
                # links its span to this one, and counts what it had cost:
                # the answers staged meanwhile too, journaled first.
                await self._record()
                replan_carrier: dict[str, str] = {}
                suspended = trace.NonRecordingSpan(self._suspended_replan)
                context_of = trace.set_span_in_context(suspended)
                _W3C.inject(replan_carrier, context=context_of)
                spent_in, spent_out = self._replan_tokens(self._state)
                fields["replan_carrier"] = replan_carrier
                fields["replan_usage"] = TokenUsage(
                    input_tokens=spent_in, output_tokens=spent_out
                )
            await self._record((TraceSuspended, fields))
        except LeaseLost:
            # Another supervisor took the run over: its trace is not this
            # one's to link.
            logger.debug("the suspended trace context of a run let go of")
        except Exception:
            # Telemetry must not take the run down; the trace just loses its link.
            logger.exception("could not journal the suspended trace context")

    def resume(self) -> None:
        """Go on in a new trace whose root (and replan span) link to the old ones."""
        old = self._suspended_root
        if old is None or self._root is not None:
            return
        self._suspended_root = None
        self._segment = self._next_segment(self._state)
        self._root = _start_root(
            self._t, self._state, [Link(old, {n.LINK_KIND: "resumes"})], self._segment
        )
        self._started_segment()
        if self._suspended_replan is not None:
            self._replan = self._t.tracer.start_span(
                n.SPAN_REPLAN,
                context=trace.set_span_in_context(self._root),
                attributes=self._replan_attrs,
                links=[Link(self._suspended_replan, {n.LINK_KIND: "resumes"})],
            )
            self._suspended_replan = None
        for attrs in self._resolved_meanwhile:
            self._root.add_event(n.EVENT_GATE_RESOLVED, attrs)
        self._resolved_meanwhile.clear()
        self._refresh()

    # Journaled events ---------------------------------------------------------------

    def on_events(self, events: Sequence[Event], state: RunState) -> None:
        """Turn what the driver just journaled into span attributes and metrics."""
        self._state = state
        for event in events:
            # A run's commonest events by their class alone: each case of
            # the match below that does not match costs an isinstance()
            # check through the models' metaclass.
            if type(event) is TaskStarted:
                self._started[event.task_id] = event.at
                continue
            if type(event) is TaskFinished:
                self._finished_task(event)
                continue
            if type(event) is UsageRecorded:
                self._tokens(event.role, event.usage)
                continue
            match event:
                case ReplanRefused(record=record):
                    self._decided_replan(record, None, state)
                case ReplanApplied(record=record, version=version):
                    self._decided_replan(record, version, state)
                case MilestoneReviewed(index=index, verdict=verdict, by=by):
                    self._reviewed(index, verdict, by)
                case GateResolved(gate_id=gate_id, resolution=resolution):
                    info = state.gates.get(gate_id)
                    if info is not None:
                        waited = (event.at - info.request.created_at).total_seconds()
                        self._t.gate_wait.record(
                            waited,
                            {
                                n.GATE_DECISION: resolution.decision,
                                n.GATE_OUTCOME: gate_outcome(resolution.by),
                            },
                        )
                        attrs: dict[str, AttributeValue] = {
                            n.GATE_ID: gate_id,
                            n.GATE_DECISION: resolution.decision,
                            n.GATE_DECIDED_BY: resolution.by,
                        }
                        span = self._replan or self._root
                        if span is not None and self.recording:
                            span.add_event(n.EVENT_GATE_RESOLVED, attrs)
                        elif self._suspended_root is not None:
                            # Answered while the trace is suspended (a tool
                            # call's gate): on the root the run resumes in.
                            self._resolved_meanwhile.append(attrs)
                case RunFinished():
                    self._finished(event, state)
                case _:
                    pass

    def _finished_task(self, event: TaskFinished) -> None:
        if event.usage is not None:
            self._tokens("executor", event.usage)
        started = self._started.pop(event.task_id, None)
        if started is not None:
            self._t.task_duration.record(
                (event.at - started).total_seconds(),
                {n.TASK_OUTCOME: task_outcome(event.outcome)},
            )

    def _tokens(self, role: str, usage: TokenUsage) -> None:
        if usage.input_tokens:
            self._t.tokens.add(
                usage.input_tokens,
                {n.GEN_AI_AGENT_NAME: role, n.GEN_AI_TOKEN_TYPE: n.TOKEN_INPUT},
            )
        if usage.output_tokens:
            self._t.tokens.add(
                usage.output_tokens,
                {n.GEN_AI_AGENT_NAME: role, n.GEN_AI_TOKEN_TYPE: n.TOKEN_OUTPUT},
            )

    def _reviewed(self, index: int, verdict: Verdict, by: str) -> None:
        # A model's verdict is an event on the reviewer's span already.
        root = self._root
        if by == "model" or root is None or not self.recording:
            return
        attrs: dict[str, AttributeValue] = {
            n.MILESTONE_INDEX: index,
            n.REPLAN_DECISION: verdict.decision,
            n.REPLAN_DECIDED_BY: by,
        }
        if verdict.trigger is not None:
            attrs[n.REPLAN_TRIGGER] = verdict.trigger.value
        root.add_event(n.EVENT_DECISION, attrs)

    def _end_attributes(self, root: Span, state: RunState) -> None:
        usage = state.usage.total
        root.set_attributes(
            {
                n.RUN_REPLANS_APPLIED: state.replans_applied,
                n.RUN_REPLANS_REFUSED: len(state.replans) - state.replans_applied,
                n.RUN_TASKS_COMPLETED: len(state.completion_order),
                n.RUN_USAGE_INPUT_TOKENS: usage.input_tokens,
                n.RUN_USAGE_OUTPUT_TOKENS: usage.output_tokens,
            }
        )

    def _finished(self, event: RunFinished, state: RunState) -> None:
        status = event.status
        self._t.runs.add(1, {n.RUN_OUTCOME: status.value})
        if not self.recording:
            return
        # A run may end while its trace is suspended (cancelled at a gate).
        self.resume()
        root = self._root
        if root is None:
            return
        if self._replan is not None:
            # A decision the run's end cut short (a cancel, the deadline).
            if not self._decided:
                why = self._cut_reason or f"the run ended {event.status.value}"
                self._interrupted(self._replan, why)
            self._end_replan()
        self._end_attributes(root, state)
        root.set_attribute(n.RUN_OUTCOME, status.value)
        brief = state.explore.brief if state.explore is not None else None
        if brief is not None:
            root.set_attribute(n.EXPLORE_BRIEF_STATUS, brief.status)
        reason = event.stop_reason
        if reason:
            root.set_attribute(n.RUN_STOP_REASON, truncate(reason))
        if status is RunStatus.LIMIT_REACHED:
            root.add_event(
                n.EVENT_LIMIT_REACHED,
                {n.LIMIT_NAME: (reason or "").split(":", 1)[0]},
            )
        if status is not RunStatus.COMPLETED:
            root.add_event(
                n.EVENT_STOPPED,
                {
                    n.RUN_OUTCOME: status.value,
                    n.RUN_STOP_REASON: truncate(reason or ""),
                },
            )
