from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from ._base import (
    READING_JOURNAL,
    Frozen,
    built,
)
from ._explore_events import ExploreEvents
from ._gate import GateInfo, GateRequest, GateResolution
from ._plan import PlanVersion, ReplanRecord, Synthesis, Verdict
from ._result import ModelFailure, RunResult, RunStatus, TokenUsage
from ._spec import RunSpec
from ._task import TaskOutcome


class _Event(Frozen):
    seq: int = Field(ge=1)
    """Position in the run's journal, from 1."""
    at: datetime
    """When the supervisor recorded the event (UTC)."""


class RunSubmitted(_Event):
    """A run was accepted. Always the first event of a run."""

    kind: Literal["run_submitted"] = "run_submitted"
    run_id: str
    spec: RunSpec
    deadline_at: datetime | None = None


class PlanCreated(_Event):
    """The first plan (version 1), or the synthesis plan at a hybrid boundary."""

    kind: Literal["plan_created"] = "plan_created"
    version: PlanVersion
    boundary: bool = False
    """True for the hybrid boundary: collection ends, synthesis begins."""


class TaskStarted(_Event):
    kind: Literal["task_started"] = "task_started"
    task_id: str
    attempt: int


class TaskFinished(_Event):
    """One attempt ended. Failure effects (retry, skip) follow from the state."""

    kind: Literal["task_finished"] = "task_finished"
    task_id: str
    outcome: TaskOutcome
    usage: TokenUsage | None = None
    """The attempt's model tokens (role ``executor``, purpose ``execute``),
    counted in the run's usage as a ``usage_recorded`` would be: one event
    per attempt instead of two."""


class RetryScheduled(_Event):
    """A task that failed transiently is retried no sooner than ``retry_at``.

    Journaled with the failure's ``task_finished`` when the retry waits
    (``Limits.retry_backoff_s``, or the wait the failure asked for, a
    ``Retry-After``), so a resumed run waits until the same time too.
    """

    kind: Literal["retry_scheduled"] = "retry_scheduled"
    task_id: str
    retry_at: datetime


class TaskInterrupted(_Event):
    """A run resumed after a crash found this attempt unfinished and unrecorded.

    The task goes back to pending, and the attempt does not count against
    ``max_task_attempts`` (it never ended); ``task_executions`` still counts it.
    """

    kind: Literal["task_interrupted"] = "task_interrupted"
    task_id: str
    reason: str = "the supervisor stopped before the attempt finished"


class MilestoneReviewed(_Event):
    kind: Literal["milestone_reviewed"] = "milestone_reviewed"
    index: int
    verdict: Verdict
    by: Literal["heuristic", "model", "policy", "error"]
    """``heuristic``: the cheap checks decided; ``model``: the reviewer did;
    ``policy``: the pattern's rules rewrote the reviewer's answer; ``error``:
    the reviewer gave no usable answer (a model's failure is journaled with
    this event; the verdict's rationale says why) and the run continues on
    its plan."""


class ReplanRefused(_Event):
    kind: Literal["replan_refused"] = "replan_refused"
    record: ReplanRecord


class ReplanApplied(_Event):
    kind: Literal["replan_applied"] = "replan_applied"
    record: ReplanRecord
    version: PlanVersion


class GateOpened(_Event):
    kind: Literal["gate_opened"] = "gate_opened"
    request: GateRequest


class GateResolved(_Event):
    kind: Literal["gate_resolved"] = "gate_resolved"
    gate_id: str
    resolution: GateResolution


class UsageRecorded(_Event):
    kind: Literal["usage_recorded"] = "usage_recorded"
    role: str
    purpose: str
    usage: TokenUsage


class TraceStarted(_Event):
    """A segment of the run's trace began (journaled only while traced).

    Journaled with the run's next append, it lets a run resumed after a
    crash, which journaled no suspension, link its new trace to the one
    the crash cut off and number its segment after it.
    """

    kind: Literal["trace_started"] = "trace_started"
    carrier: dict[str, str]
    """The W3C trace context (``traceparent``...) of the new root span."""
    segment: int
    """The segment's number (``replan.run.segment``): 1 for a run's first."""


class TraceSuspended(_Event):
    """The run's trace was ended while the run waits without bound.

    A gate with no timeout, or a supervisor stopping with the run in
    flight: no span stays open across such a wait. The run goes on in a new
    trace whose root links to this one.
    """

    kind: Literal["trace_suspended"] = "trace_suspended"
    carrier: dict[str, str]
    """The W3C trace context (``traceparent``...) of the ended root span."""
    reason: str
    replan_carrier: dict[str, str] | None = None
    """The trace context of the ``replan`` span a replan decision under way
    had: the decision goes on in a span linked to it, in this process or
    after a restart."""
    replan_usage: TokenUsage | None = None
    """What that decision's model calls had cost until then."""


class ModelCallFailed(_Event):
    """A model call failed for good; the raw text of an invalid answer is kept."""

    kind: Literal["model_call_failed"] = "model_call_failed"
    failure: ModelFailure


class RunFinished(_Event):
    """The last event of a run."""

    kind: Literal["run_finished"] = "run_finished"
    status: RunStatus
    stop_reason: str | None = None
    synthesis: Synthesis | None = None


class RunCompacted(_Event):
    """A finished run's journal folded into one snapshot (retention).

    It replaces every event of the run and keeps the seq of the last one, so
    the journal still ends at the same ``seq``; replaying it alone rebuilds
    the finished run's result.
    """

    kind: Literal["run_compacted"] = "run_compacted"
    run_id: str
    spec: RunSpec
    created_at: datetime
    deadline_at: datetime | None = None
    result: RunResult
    gates: list[GateInfo] = Field(default_factory=list)
    completion_order: list[str] = Field(default_factory=list)
    task_count: int = 0
    phase: Literal["main", "collection", "synthesis"] = "main"
    boundary_crossed: bool = False
    events: int
    """How many events were folded into this one."""


Event = Annotated[
    RunSubmitted
    | PlanCreated
    | TaskStarted
    | TaskFinished
    | TaskInterrupted
    | RetryScheduled
    | MilestoneReviewed
    | ReplanRefused
    | ReplanApplied
    | GateOpened
    | GateResolved
    | UsageRecorded
    | TraceStarted
    | TraceSuspended
    | ModelCallFailed
    | RunFinished
    | RunCompacted
    | ExploreEvents,
    Field(discriminator="kind"),
]
"""Every state change of a run, as the journal stores it."""

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def read_event(payload: str | bytes) -> Event:
    """An event from the JSON a journal (or an event stream) holds.

    What was journaled stays readable: a check added to a message since it
    was written (a draft's blank description) does not refuse it; the
    messages skip such checks while :data:`READING_JOURNAL` is set.
    """
    token = READING_JOURNAL.set(True)
    try:
        return EVENT_ADAPTER.validate_json(payload)
    finally:
        READING_JOURNAL.reset(token)


def event_json(event: Event) -> bytes:
    """An event's JSON, as ``EVENT_ADAPTER.dump_json`` writes it.

    Uses the event class's own serializer: the same bytes, without the
    union's dispatch (half the cost on the journal's hot path).
    """
    return event.__pydantic_serializer__.to_json(event)


"""(De)serializes any :data:`Event` (``validate_json`` / ``dump_json``)."""


def built_event(
    cls: type[Event], seq: int, at: datetime, fields: dict[str, Any]
) -> Event:
    """An event the supervisor builds from values it holds already validated.

    A task's start and finish and a model call's usage are most of a run's
    events, and every value they carry comes from a validated message (a
    task, an executor's reply, a model call) or a counter: these kinds are
    :func:`~replan.messages._base.built` without checking the values again.
    Any other kind is validated as usual.

    Raises:
        TypeError: ``fields`` names a field the kind does not have, or
            lacks one it requires.
    """
    if cls not in _TRUSTED:
        return cls(seq=seq, at=at, **fields)
    return built(cls, {"seq": seq, "at": at, **fields})


_TRUSTED = frozenset({TaskStarted, TaskFinished, UsageRecorded})
"""The kinds :func:`built_event` builds without validating."""
