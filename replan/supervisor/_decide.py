"""The pure decisions of a run: what may run, when to review, which replans pass.

Each function reads a :class:`RunState` (and a reviewer's answer) and returns
one of a closed set of outcomes; none does I/O, so each is tested exhaustively.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from heapq import heappop, heappush
from itertools import islice
from typing import Literal

from ..messages import (
    Alignment,
    ReplanOutcome,
    Task,
    TaskStatus,
    Trigger,
    Verdict,
)
from ._state import RunState
from ._tables import TaskTable


def ready_tasks(state: RunState) -> list[Task]:
    """Pending tasks whose dependencies have all completed, in plan order."""
    return list(iter_ready(state))


def iter_ready(state: RunState) -> Iterator[Task]:
    """:func:`ready_tasks` one at a time, for a caller that may stop early.

    The run loop asks after every report; with ``max_concurrency`` tasks to
    start it stops at the first ones, instead of listing every ready task of
    a plan that may hold thousands.
    """
    return _ready_among(state.tasks, state.tasks.values())


def _ready_among(
    tasks: Mapping[str, Task], candidates: Iterable[Task]
) -> Iterator[Task]:
    """The pending ``candidates`` whose dependencies in ``tasks`` completed."""
    # Plain loops: the driver walks the plan after every report.
    pending, completed = TaskStatus.PENDING, TaskStatus.COMPLETED
    for task in candidates:
        if task.status is pending:
            for dep in task.depends_on:
                if tasks[dep].status is not completed:
                    break
            else:
                yield task


ENDED = frozenset(
    {
        TaskStatus.COMPLETED,
        TaskStatus.FAILED,
        TaskStatus.SKIPPED,
        TaskStatus.SUPERSEDED,
    }
)
"""Statuses a task never leaves."""


class ReadyWalk:
    """:func:`iter_ready` for one run's driver, without walking the whole plan.

    The driver walks for ready tasks after every report. A run's tasks are
    only ever added, at the end of the table (``t1``, ``t2``...), and a
    task that ended never changes again.

    In a small table the walk starts past the tasks at its head that
    ended: they can hold no ready task. A large table
    (:class:`TaskTable`) tells which tasks changed since the last walk;
    the walk keeps the ready tasks in a heap by their place in the plan,
    and each pending task that waits for another under that one's id, so
    that a chain of thousands does not cost a walk over every pending task
    after each report. Either way a task is yielded only when it is
    pending and its dependencies completed in the state given.
    """

    __slots__ = ("_heap", "_ids", "_offered", "_queued", "_start", "_table", "_waiting")

    def __init__(self) -> None:
        self._ids: list[str] = []
        """The table's task ids, in order, as far as seen."""
        self._start = 0
        """How many tasks at the head of the table have ended."""
        self._table: TaskTable | None = None
        """The large table of the last walk, None after a small one."""
        self._heap: list[int] = []
        """Positions of tasks found ready (some may have started since)."""
        self._queued: set[int] = set()
        """The positions in the heap."""
        self._waiting: dict[str, list[int]] = {}
        """Positions of pending tasks, by the id of a dependency they wait for."""
        self._offered: list[int] = []
        """Positions the last walk yielded: those not started go back."""

    def __call__(self, state: RunState) -> Iterator[Task]:
        tasks = state.tasks
        if type(tasks) is TaskTable:
            return self._walk_table(tasks)
        self._table = None
        ids = self._ids
        if len(ids) != len(tasks):
            if len(ids) > len(tasks) or (ids and ids[-1] not in tasks):
                # Not the table seen so far (a run's table only grows):
                # start over from its head.
                ids.clear()
                self._start = 0
            ids.extend(islice(tasks, len(ids), None))
        start, count = self._start, len(ids)
        while start < count and tasks[ids[start]].status in ENDED:
            start += 1
        self._start = start
        return _ready_among(tasks, (tasks[ids[i]] for i in range(start, count)))

    def _walk_table(self, tasks: TaskTable) -> Iterator[Task]:
        changes = None if self._table is None else tasks.changes_since(self._table)
        if changes is None:
            # The first large table, or one with tasks added: index it all.
            self._heap.clear()
            self._queued.clear()
            self._waiting.clear()
            self._offered.clear()
            changes = enumerate(tasks.values())
        self._table = tasks
        queued, heap = self._queued, self._heap
        for position in self._offered:
            if position not in queued:
                queued.add(position)
                heappush(heap, position)
        self._offered.clear()
        for position, task in changes:
            self._place(tasks, position, task)
        return self._ready(tasks)

    def _place(self, tasks: TaskTable, position: int, task: Task) -> None:
        """Index a task that changed (or one that waited for one that did)."""
        status = task.status
        if status is TaskStatus.PENDING:
            for dep in task.depends_on:
                if tasks[dep].status is not TaskStatus.COMPLETED:
                    self._waiting.setdefault(dep, []).append(position)
                    return
            if position not in self._queued:
                self._queued.add(position)
                heappush(self._heap, position)
        elif status is TaskStatus.COMPLETED:
            for waiter in self._waiting.pop(task.id, ()):
                self._place(tasks, waiter, tasks.at(waiter))

    def _ready(self, tasks: TaskTable) -> Iterator[Task]:
        heap, queued, offered = self._heap, self._queued, self._offered
        while heap:
            position = heappop(heap)
            queued.discard(position)
            task = tasks.at(position)
            if task.status is not TaskStatus.PENDING:
                continue  # started since, or superseded
            for dep in task.depends_on:
                if tasks[dep].status is not TaskStatus.COMPLETED:
                    self._waiting.setdefault(dep, []).append(position)
                    break
            else:
                offered.append(position)
                yield task


def contract_rules(state: RunState) -> bool:
    """True where the plan is fixed: contract runs and the hybrid collection."""
    return state.spec.pattern == "contract" or state.phase == "collection"


def phase_done(state: RunState) -> bool:
    """Nothing of the current phase is pending or running."""
    pending, running = TaskStatus.PENDING, TaskStatus.IN_PROGRESS
    for task in state.tasks.values():
        status = task.status
        if status is pending or status is running:
            return False
    return True


def milestone_due(state: RunState, task_id: str) -> bool:
    """Review now, after ``task_id`` finished?

    A milestone is a task marked ``milestone``, or ``milestone_every``
    completed tasks since the last review. The end of a phase is the third
    kind; the run loop checks it with :func:`phase_done` when nothing runs.
    """
    if state.completing:
        return False
    task = state.tasks[task_id]
    if task.milestone and task.status is TaskStatus.COMPLETED:
        return True
    every = state.spec.limits.milestone_every
    if len(state.window) < every:
        # Too few tasks finished since the last review for enough of them
        # to have completed: no need to count (the window may be long).
        return False
    completed = sum(state.tasks[t].status is TaskStatus.COMPLETED for t in state.window)
    return completed >= every


def phase_gate(state: RunState) -> Literal["boundary", "stay"]:
    """The hybrid boundary fires once: collection done and not yet crossed."""
    if (
        state.spec.pattern == "hybrid"
        and state.phase == "collection"
        and not state.boundary_crossed
        and bool(state.versions)
        and phase_done(state)
    ):
        return "boundary"
    return "stay"


def heuristic_verdict(state: RunState) -> Verdict | None:
    """The cheap checks that run before the reviewer model.

    Returns a verdict when they can decide, None when the model must judge:
    a failed task, an empty result or a new finding since the last review
    needs the reviewer; a window of clean results without findings cannot
    contradict the plan, so it continues without a model call.
    """
    tasks = state.tasks
    if phase_done(state) and not state.completion_order:
        return Verdict(
            decision="abort",
            rationale="no task completed: there are no results to build on"
            + _last_failure(state),
        )
    for task_id in state.window:
        result = tasks[task_id].result
        if result is None or not result.success:
            return None
        if not result.summary.strip() or result.findings:
            return None
    return Verdict(
        decision="continue",
        rationale="no new findings or deviations since the last review",
    )


def _last_failure(state: RunState) -> str:
    """``; t2 failed: why`` for the task that failed last (the last of the
    window's, else of the plan's): the cause of a run that completed nothing
    (an endpoint's 404, say); empty when no task says why it failed."""
    tasks, window = state.tasks, state.window
    order = [*(t for t in tasks if t not in window), *window]
    for task_id in reversed(order):
        result = tasks[task_id].result
        if result is not None and not result.success and result.reason:
            return f"; {task_id} failed: {result.reason}"
    return ""


def unanswered_verdict(reason: str) -> Verdict:
    """The verdict of a milestone whose reviewer gave no usable answer.

    ``continue``: nothing was judged, so nothing changes; the run goes on
    with its plan, and the review counts toward ``max_iterations`` as any
    other (a reviewer that always fails cannot hold a run in a loop).
    """
    return Verdict(
        decision="continue",
        rationale=f"no verdict, the run continues on its plan: {reason}",
    )


def under_contract(verdict: Verdict) -> Verdict:
    """Under contract rules a reviewer may only continue, abort or escalate.

    ``complete`` becomes ``continue``: a fixed plan runs to its end. A
    ``replan`` stays as is and the run escalates it to the validation gate.
    """
    if verdict.decision == "complete":
        return verdict.model_copy(update={"decision": "continue"})
    return verdict


def guard_replan(
    state: RunState, verdict: Verdict, used: int = 0
) -> tuple[ReplanOutcome, str] | None:
    """The guards that need no proposal, in order. None means go on.

    ``used``: the tokens the run has used as its live meter counts them,
    when that is ahead of the journal: the calls of attempts still running
    (a tool loop's steps) are the run's, though no reply has reported them.
    """
    limits = state.spec.limits
    if verdict.trigger is None:
        return ReplanOutcome.REFUSED_INVALID, "the reviewer named no trigger"
    if state.replans_applied >= limits.max_replans:
        return (
            ReplanOutcome.REFUSED_CEILING,
            f"the replan ceiling of {limits.max_replans} is reached",
        )
    if limits.token_budget is not None:
        allowance = (1 - limits.replan_reserve) * limits.token_budget
        used = max(used, state.usage.total.total_tokens)
        if used >= allowance:
            return (
                ReplanOutcome.REFUSED_BUDGET,
                f"{used} tokens used of the {allowance:.0f} allowed before the "
                f"replan reserve",
            )
    if verdict.trigger is Trigger.OBSOLESCENCE:
        pending = {t.id for t in state.with_status(TaskStatus.PENDING)}
        affected = pending.intersection(verdict.affected_tasks)
        if len(affected) < 2:
            return (
                ReplanOutcome.REFUSED_THRESHOLD,
                f"obsolescence affects {len(affected)} pending task(s); "
                "at least 2 are needed",
            )
    if verdict.trigger is Trigger.NEW_CRITICAL_PATH:
        if verdict.confidence < limits.min_confidence:
            return (
                ReplanOutcome.REFUSED_THRESHOLD,
                f"confidence {verdict.confidence:g} is below "
                f"min_confidence {limits.min_confidence:g}",
            )
        if verdict.corroborating_sources < limits.min_corroboration:
            return (
                ReplanOutcome.REFUSED_THRESHOLD,
                f"{verdict.corroborating_sources} corroborating source(s); "
                f"min_corroboration is {limits.min_corroboration}",
            )
    return None


def drifted(alignment: Alignment, proposed: int) -> str | None:
    """Goal drift: more than half of the proposed tasks do not serve the goal.

    Returns the refusal reason, or None. A missing flag counts as unaligned.
    """
    aligned = sum(alignment.aligned[:proposed])
    off_goal = proposed - aligned
    if off_goal * 2 > proposed:
        return f"{off_goal} of {proposed} proposed tasks do not serve the goal"
    return None


def budget_spent(state: RunState) -> str | None:
    """The stop reason when the token budget is used up, else None."""
    budget = state.spec.limits.token_budget
    if budget is None:
        return None
    used = state.usage.total.total_tokens
    if used >= budget:
        return f"token_budget: {used} of {budget} tokens used"
    return None
