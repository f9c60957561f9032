"""Run state and the pure function that folds journal events into it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Literal, assert_never

from pydantic import Field

from .._errors import JournalCorrupt
from ..messages import (
    REPLANNING_PURPOSES,
    Event,
    GateInfo,
    GateOpened,
    GateResolution,
    GateResolved,
    MilestoneReviewed,
    ModelCallFailed,
    ModelFailure,
    PlanCreated,
    PlanVersion,
    ReplanApplied,
    ReplanOutcome,
    ReplanRecord,
    ReplanRefused,
    RetryScheduled,
    RunCompacted,
    RunFinished,
    RunResult,
    RunSpec,
    RunStatus,
    RunSubmitted,
    Task,
    TaskFinished,
    TaskInterrupted,
    TaskOutcome,
    TaskStarted,
    TaskStatus,
    TokenUsage,
    TraceStarted,
    TraceSuspended,
    Usage,
    UsageRecorded,
)
from ..messages._base import Frozen
from ..messages._explore_events import ExploreEvent
from ._explore_state import ExploreState, fold_explore
from ._tables import with_id, with_task, with_tasks

Phase = Literal["main", "collection", "synthesis"]


class RunState(Frozen):
    """Everything known about a run, rebuilt exactly by replaying its events."""

    run_id: str
    spec: RunSpec
    status: RunStatus = RunStatus.RUNNING
    seq: int = 0
    created_at: datetime
    updated_at: datetime
    deadline_at: datetime | None = None
    tasks: Mapping[str, Task] = Field(default_factory=dict)
    """Every task ever planned, in the order planned (ids ``t1``, ``t2``...).

    A dict in small plans; in large ones a table that an event's fold
    updates without copying it whole (see ``_tables``)."""
    task_count: int = 0
    versions: list[PlanVersion] = Field(default_factory=list)
    replans: list[ReplanRecord] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    phase: Phase = "main"
    boundary_crossed: bool = False
    iterations: int = 0
    """Milestone reviews held (the cheap checks' too): the last one's index."""
    reviews: int = 0
    """Milestone reviews the reviewer was asked (its verdict, the pattern's
    rules applied to it, or its failure), what ``max_iterations`` bounds: a
    milestone the cheap checks decide costs no model call and counts not."""
    completing: bool = False
    """A reviewer said ``complete``: no more reviews; tasks in flight finish,
    nothing new starts, then the run synthesizes."""
    task_executions: int = 0
    """Task attempts started."""
    retry_at: Mapping[str, datetime] = Field(default_factory=dict)
    """Tasks pending a retry that may not start before a time (a transient
    failure's backoff, or the wait it asked for), by id."""
    window: Sequence[str] = Field(default_factory=list)
    """Ids of tasks finished (completed or failed) since the last review."""
    completion_order: Sequence[str] = Field(default_factory=list)
    """Ids of completed tasks, in the order they completed."""
    gates: dict[str, GateInfo] = Field(default_factory=dict)
    output: str | None = None
    sources: list[str] = Field(default_factory=list)
    stop_reason: str | None = None
    explore: ExploreState | None = None
    """What an explore run found (hypotheses, reviews, ratings, the brief)."""
    suspended_trace: dict[str, str] | None = None
    """The trace context of the run's last suspended root span (see
    ``TraceSuspended``)."""
    suspensions: int = 0
    """How often the run's trace was suspended."""
    last_trace: dict[str, str] | None = None
    """The trace context of the run's last root span journaled as started
    (``TraceStarted``): a resumed run's new root links to it (or, in a
    journal without one, to ``suspended_trace``), whether the old root was
    suspended or cut off by a crash."""
    trace_segment: int = 0
    """The last trace segment journaled as started: a run's next trace is
    segment ``max(suspensions, trace_segment) + 1``."""
    suspended_replan: dict[str, str] | None = None
    """The trace context of the ``replan`` span of a decision the last
    suspension cut short, until the decision is made."""
    suspended_replan_usage: TokenUsage | None = None
    """What that decision had cost until it was suspended."""
    model_failures: list[ModelFailure] = Field(default_factory=list)
    replanning_tokens: int = 0
    """Tokens of the model purposes in ``REPLANNING_PURPOSES``."""

    @property
    def replans_applied(self) -> int:
        return sum(r.outcome is ReplanOutcome.APPLIED for r in self.replans)

    @property
    def open_gates(self) -> list[GateInfo]:
        return [g for g in self.gates.values() if g.resolution is None]

    def with_status(self, status: TaskStatus) -> list[Task]:
        return [t for t in self.tasks.values() if t.status is status]

    def findings(self) -> list[str]:
        """Findings of completed tasks, in completion order."""
        out: list[str] = []
        for task_id in self.completion_order:
            result = self.tasks[task_id].result
            if result is not None:
                out.extend(result.findings)
        return out

    def last_findings(self, count: int) -> list[str]:
        """The last ``count`` of :meth:`findings`, reading no further back."""
        out: list[str] = []
        if count <= 0:
            return out
        for task_id in reversed(self.completion_order):
            result = self.tasks[task_id].result
            if result is not None and result.findings:
                out[:0] = result.findings[-(count - len(out)) :]
                if len(out) >= count:
                    break
        return out

    def result(self) -> RunResult:
        return RunResult(
            run_id=self.run_id,
            goal=self.spec.goal,
            pattern=self.spec.pattern,
            status=self.status,
            tasks=list(self.tasks.values()),
            versions=self.versions,
            replans=self.replans,
            usage=self.usage,
            output=self.output,
            sources=self.sources,
            stop_reason=self.stop_reason,
            iterations=self.iterations,
            task_executions=self.task_executions,
            brief=self.explore.brief if self.explore else None,
            model_failures=self.model_failures,
            replanning_tokens=self.replanning_tokens,
        )


def replay(events: Iterable[Event]) -> RunState:
    """Fold a run's whole journal into its state.

    Raises:
        ValueError: the journal is empty or out of order.
    """
    state: RunState | None = None
    for event in events:
        state = apply(state, event)
    if state is None:
        raise ValueError("an empty journal has no run")
    return state


def fold_journal(
    run_id: str, events: Iterable[Event], start: RunState | None = None
) -> RunState:
    """:func:`replay` for a journal read from a store; from ``start``, the
    run's state up to the events given, when one is at hand.

    Raises:
        JournalCorrupt: the events do not fold into a run (one missing or
            edited by hand); names the run and the first event that does
            not follow.
    """
    state = start
    for event in events:
        try:
            state = apply(state, event)
        except (ValueError, KeyError) as exc:
            problem = " ".join(str(exc).split())
            raise JournalCorrupt(
                f"run {run_id}: event {event.seq} ({event.kind}) does not follow "
                f"the events before it ({problem})",
                run_id=run_id,
                seq=event.seq,
            ) from None
    if state is None:
        raise JournalCorrupt(f"run {run_id} has no events", run_id=run_id)
    return state


def apply(state: RunState | None, event: Event) -> RunState:
    """Return the state after ``event``. Pure: ``state`` is never modified.

    Raises:
        ValueError: the event does not follow the state (wrong ``seq``, a
            first event that is not ``run_submitted``, an unknown task).
    """
    if state is None:
        if isinstance(event, RunCompacted):
            return _from_snapshot(event)
        if not isinstance(event, RunSubmitted) or event.seq != 1:
            raise ValueError("a run's journal must begin with run_submitted, seq 1")
        return RunState(
            run_id=event.run_id,
            spec=event.spec,
            seq=1,
            created_at=event.at,
            updated_at=event.at,
            deadline_at=event.deadline_at,
            phase="collection" if event.spec.pattern == "hybrid" else "main",
        )
    if event.seq != state.seq + 1:
        raise ValueError(f"expected event seq {state.seq + 1}, got {event.seq}")
    changes = _changes(state, event)
    changes["seq"] = event.seq
    changes["updated_at"] = event.at
    return state.evolve(**changes)


def _changes(state: RunState, event: Event) -> dict[str, object]:
    # A run's commonest events (task starts and finishes, model usage) by
    # their class alone: each case of the match below that does not match
    # costs an isinstance() check through the models' metaclass.
    if type(event) is TaskStarted:
        return _started(state, event)
    if type(event) is TaskFinished:
        return _finished(state, event)
    if type(event) is UsageRecorded:
        return _usage_recorded(state, event)
    changes: dict[str, object]
    match event:
        case RunSubmitted():
            raise ValueError("run_submitted can only begin a journal")
        case RunCompacted():
            raise ValueError("run_compacted can only be a whole journal")
        case PlanCreated(version=version, boundary=boundary):
            changes = _install(state, version)
            if boundary:
                changes.update(boundary_crossed=True, phase="synthesis", window=[])
            return changes
        case TaskInterrupted(task_id=task_id):
            task = _task(state, task_id)
            if task.status is not TaskStatus.IN_PROGRESS:
                raise ValueError(f"task {task_id} was interrupted without starting")
            again = task.evolve(status=TaskStatus.PENDING, attempts=task.attempts - 1)
            return {"tasks": with_task(state.tasks, again)}
        case MilestoneReviewed(verdict=verdict, by=by):
            changes = {
                "iterations": state.iterations + 1,
                "reviews": state.reviews + (by != "heuristic"),
                "window": [],
            }
            if verdict.decision == "complete":
                changes["tasks"] = _supersede(state.tasks, _pending_ids(state))
                changes["completing"] = True
            return changes
        case ReplanRefused(record=record):
            changes = {"replans": [*state.replans, record]}
            if state.suspended_replan is not None:
                changes.update(suspended_replan=None, suspended_replan_usage=None)
            return changes
        case ReplanApplied(record=record, version=version):
            changes = _install(state, version)
            changes["replans"] = [*state.replans, record]
            if state.suspended_replan is not None:
                changes.update(suspended_replan=None, suspended_replan_usage=None)
            return changes
        case GateOpened(request=request):
            gates = dict(state.gates)
            gates[request.gate_id] = GateInfo(request=request)
            return {"gates": gates, "status": RunStatus.WAITING_FOR_HUMAN}
        case GateResolved(gate_id=gate_id, resolution=resolution):
            return _resolve_gate(state, gate_id, resolution, event.at)
        case TraceStarted(carrier=carrier, segment=segment):
            return {
                "last_trace": carrier,
                "trace_segment": max(state.trace_segment, segment),
            }
        case TraceSuspended(carrier=carrier):
            return {
                "suspended_trace": carrier,
                "suspensions": state.suspensions + 1,
                "suspended_replan": event.replan_carrier,
                "suspended_replan_usage": event.replan_usage,
            }
        case RetryScheduled(task_id=task_id, retry_at=retry_at):
            if _task(state, task_id).status is not TaskStatus.PENDING:
                raise ValueError(f"task {task_id} has no retry to wait for")
            return {"retry_at": {**state.retry_at, task_id: retry_at}}
        case ModelCallFailed(failure=failure):
            return {"model_failures": [*state.model_failures, failure]}
        case RunFinished(status=status, stop_reason=reason, synthesis=synthesis):
            # Attempts cut short by the end of the run never finished.
            cut = {
                tid: t.evolve(status=TaskStatus.PENDING)
                for tid, t in state.tasks.items()
                if t.status is TaskStatus.IN_PROGRESS
            }
            changes = {
                "status": status,
                "stop_reason": reason,
                "tasks": with_tasks(state.tasks, cut) if cut else state.tasks,
                "output": synthesis.output if synthesis else None,
                "sources": synthesis.sources if synthesis else [],
            }
            if any(g.resolution is None for g in state.gates.values()):
                changes["gates"] = _closed_at_end(state.gates, status, event.at)
            return changes
        case ExploreEvent():
            explore = fold_explore(state.explore, event)
            return {"explore": explore, "iterations": len(explore.cycles)}
        case TaskStarted():
            return _started(state, event)
        case TaskFinished():
            return _finished(state, event)
        case UsageRecorded():
            return _usage_recorded(state, event)
        case _:
            assert_never(event)


def _started(state: RunState, event: TaskStarted) -> dict[str, object]:
    task = _task(state, event.task_id)
    started = task.evolve(status=TaskStatus.IN_PROGRESS, attempts=event.attempt)
    if state.retry_at and event.task_id in state.retry_at:
        return {
            "tasks": with_task(state.tasks, started),
            "task_executions": state.task_executions + 1,
            "retry_at": _without(state.retry_at, event.task_id),
        }
    return {
        "tasks": with_task(state.tasks, started),
        "task_executions": state.task_executions + 1,
    }


def _without(times: Mapping[str, datetime], task_id: str) -> dict[str, datetime]:
    return {k: v for k, v in times.items() if k != task_id}


def _finished(state: RunState, event: TaskFinished) -> dict[str, object]:
    changes = _finish(state, event.task_id, event.outcome)
    if event.usage is not None:
        changes["usage"] = state.usage.add("executor", event.usage)
    return changes


def _usage_recorded(state: RunState, event: UsageRecorded) -> dict[str, object]:
    usage = event.usage
    changes: dict[str, object] = {"usage": state.usage.add(event.role, usage)}
    if event.purpose in REPLANNING_PURPOSES:
        changes["replanning_tokens"] = state.replanning_tokens + usage.total_tokens
    return changes


RUN_ENDED_NOTE = "the run ended before the gate was answered"
"""The note of a gate the run's end closed (by ``supervisor``)."""


def _closed_at_end(
    gates: dict[str, GateInfo], status: RunStatus, at: datetime
) -> dict[str, GateInfo]:
    """The gates still open when the run ended, closed: nothing waits on a
    finished run. Rejected by ``supervisor`` in the state only (no
    ``gate_resolved``: the run's end is its last event), which changes no
    task (a side effect left unapproved stays pending)."""
    closed = GateResolution(
        decision="reject", by="supervisor", note=f"{RUN_ENDED_NOTE} ({status.value})"
    )
    return {
        gate_id: info
        if info.resolution is not None
        else info.evolve(resolution=closed, resolved_at=at)
        for gate_id, info in gates.items()
    }


def _from_snapshot(event: RunCompacted) -> RunState:
    result = event.result
    return RunState(
        run_id=event.run_id,
        spec=event.spec,
        status=result.status,
        seq=event.seq,
        created_at=event.created_at,
        updated_at=event.at,
        deadline_at=event.deadline_at,
        tasks={t.id: t for t in result.tasks},
        task_count=event.task_count,
        versions=result.versions,
        replans=result.replans,
        usage=result.usage,
        phase=event.phase,
        boundary_crossed=event.boundary_crossed,
        iterations=result.iterations,
        task_executions=result.task_executions,
        completion_order=event.completion_order,
        gates={g.request.gate_id: g for g in event.gates},
        output=result.output,
        sources=result.sources,
        stop_reason=result.stop_reason,
        model_failures=result.model_failures,
        replanning_tokens=result.replanning_tokens,
        # A compacted explore run keeps its brief; the working set of
        # hypotheses, reviews and ratings behind it is folded away.
        explore=None if result.brief is None else ExploreState(brief=result.brief),
    )


def snapshot(state: RunState, events: int) -> RunCompacted:
    """The one event that stands for a finished run's whole journal.

    Raises:
        ValueError: the run has not finished.
    """
    if not state.status.final:
        raise ValueError(f"run {state.run_id} has not finished: {state.status}")
    return RunCompacted(
        seq=state.seq,
        at=state.updated_at,
        run_id=state.run_id,
        spec=state.spec,
        created_at=state.created_at,
        deadline_at=state.deadline_at,
        result=state.result(),
        gates=list(state.gates.values()),
        completion_order=list(state.completion_order),
        task_count=state.task_count,
        phase=state.phase,
        boundary_crossed=state.boundary_crossed,
        events=events,
    )


def _resolve_gate(
    state: RunState, gate_id: str, resolution: GateResolution, at: datetime
) -> dict[str, object]:
    info = state.gates.get(gate_id)
    if info is None or info.resolution is not None:
        raise ValueError(f"gate {gate_id} is not open")
    gates = dict(state.gates)
    gates[gate_id] = info.evolve(resolution=resolution, resolved_at=at)
    still_open = any(g.resolution is None for g in gates.values())
    changes: dict[str, object] = {
        "gates": gates,
        "status": RunStatus.WAITING_FOR_HUMAN if still_open else RunStatus.RUNNING,
    }
    task_id = info.request.task_id
    if info.request.tool_call is not None:
        return changes  # a running attempt's tool call: the attempt acts on it
    if task_id is None or _task(state, task_id).status is not TaskStatus.PENDING:
        # A replan or an early completion may have superseded the task.
        return changes
    if resolution.decision == "reject":
        outcome = TaskOutcome(
            success=False, reason=f"side effect rejected by {resolution.by}"
        )
        changes.update(_fail(state, task_id, outcome))
        # Reviewed like any failed task (a run of nothing but rejected side
        # effects has no results to synthesize from).
        changes["window"] = with_id(state.window, task_id)
    else:
        approved = _task(state, task_id).evolve(approved=True)
        changes["tasks"] = with_task(state.tasks, approved)
    return changes


def _task(state: RunState, task_id: str) -> Task:
    task = state.tasks.get(task_id)
    if task is None:
        raise ValueError(f"unknown task {task_id}")
    return task


def _pending_ids(state: RunState) -> list[str]:
    return [t.id for t in state.tasks.values() if t.status is TaskStatus.PENDING]


def _supersede(
    tasks: Mapping[str, Task], ids: Iterable[str], added: Sequence[Task] = ()
) -> Mapping[str, Task]:
    superseded = {
        task_id: tasks[task_id].evolve(status=TaskStatus.SUPERSEDED) for task_id in ids
    }
    return with_tasks(tasks, superseded, added)


def _install(state: RunState, version: PlanVersion) -> dict[str, object]:
    """Supersede the version's removed tasks and add its new ones."""
    for task_id in version.removed:
        if _task(state, task_id).status is not TaskStatus.PENDING:
            raise ValueError(f"only pending tasks can be replaced, not {task_id}")
    after = {t.id: t for t in version.tasks_after}
    added = _skip_fallen(state, [after[task_id] for task_id in version.added])
    tasks = _supersede(state.tasks, version.removed, added)
    return {
        "tasks": tasks,
        "versions": [*state.versions, version],
        "task_count": state.task_count + len(version.added),
    }


_FALLEN = (TaskStatus.FAILED, TaskStatus.SKIPPED)


def _skip_fallen(state: RunState, added: list[Task]) -> list[Task]:
    """``added`` with those that depend, transitively, on a failed or
    skipped task skipped, as a failure skips the tasks pending on it.

    A change a person approves at its gate may build on a task that was
    running as the change was shown and failed before the answer: it is
    applied, and only its tasks that can no longer run are skipped.
    """
    doomed = {
        dep
        for task in added
        for dep in task.depends_on
        if dep in state.tasks and state.tasks[dep].status in _FALLEN
    }
    if not doomed:
        return added
    skipped: dict[str, Task] = {}
    grew = True
    while grew:
        grew = False
        for task in added:
            if task.id not in skipped and doomed.intersection(task.depends_on):
                skipped[task.id] = task.evolve(status=TaskStatus.SKIPPED)
                doomed.add(task.id)
                grew = True
    return [skipped.get(task.id, task) for task in added]


def _finish(state: RunState, task_id: str, outcome: TaskOutcome) -> dict[str, object]:
    task = _task(state, task_id)
    if task.status is not TaskStatus.IN_PROGRESS:
        raise ValueError(f"task {task_id} finished without starting")
    if outcome.success:
        done = task.evolve(status=TaskStatus.COMPLETED, result=outcome)
        return {
            "tasks": with_task(state.tasks, done),
            "window": with_id(state.window, task_id),
            "completion_order": with_id(state.completion_order, task_id),
        }
    if outcome.transient and task.attempts < state.spec.limits.max_task_attempts:
        # A retry, unless a ``complete`` verdict came meanwhile: it superseded
        # every pending task, and this one would be pending again.
        status = TaskStatus.SUPERSEDED if state.completing else TaskStatus.PENDING
        again = task.evolve(status=status, result=outcome)
        return {"tasks": with_task(state.tasks, again)}
    changes = _fail(state, task_id, outcome)
    changes["window"] = with_id(state.window, task_id)
    return changes


def _fail(state: RunState, task_id: str, outcome: TaskOutcome) -> dict[str, object]:
    """Fail the task and skip every pending task that depends on it."""
    changed = {
        task_id: state.tasks[task_id].evolve(status=TaskStatus.FAILED, result=outcome)
    }
    doomed = {task_id}
    grew = True
    while grew:
        grew = False
        for task in state.tasks.values():
            if (
                task.status is TaskStatus.PENDING
                and task.id not in changed
                and doomed.intersection(task.depends_on)
            ):
                changed[task.id] = task.evolve(status=TaskStatus.SKIPPED)
                doomed.add(task.id)
                grew = True
    return {"tasks": with_tasks(state.tasks, changed)}
