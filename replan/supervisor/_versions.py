"""Turning a planner's drafts into tasks and a plan version with its diff."""

from __future__ import annotations

from collections.abc import Collection

from ..messages import (
    PlanVersion,
    Task,
    TaskDraft,
    TaskStatus,
    Trigger,
    check_drafts,
)
from ._state import Phase, RunState

_NEW_TASK = Task(
    id="-",
    key="-",
    description="-",
    depends_on=[],
    phase="main",
    milestone=False,
    requires_approval=False,
    version=1,
)
"""What every new task is evolved from: the fields a version sets are those a
validated ``Task(...)`` with them would have, and their values come from
drafts that were validated already. Evolving skips validating them again,
and every new task shares this one's fields-set object (they live as long
as the run, in every version)."""
_SETTLED_SINCE = (TaskStatus.FAILED, TaskStatus.SKIPPED)
"""What a task a change built on may have become by the time a person
approves it at its gate."""
FINDINGS_AT_REPLAN = 3
"""How many of the latest findings a version keeps (``findings_at_replan``)."""


def build_version(
    state: RunState,
    drafts: list[TaskDraft],
    *,
    trigger: Trigger | None,
    reason: str,
    phase: Phase,
    replace_pending: bool,
    replace_only: Collection[str] | None = None,
) -> PlanVersion:
    """The next plan version: ``drafts`` become tasks with fresh ids.

    Args:
        state: the run before the change.
        drafts: the proposed tasks; they may depend on each other by key,
            and on completed or running tasks by id.
        trigger: why the plan changes (None for a first plan or a boundary).
        reason: the rationale to keep with the version.
        phase: the phase the new tasks belong to.
        replace_pending: supersede every pending task (a replan).
        replace_only: with ``replace_pending``, supersede only those of
            these that are still pending: the tasks a person saw the change
            remove at its gate (a task whose attempt failed meanwhile and
            waits for its retry is pending now, and stays). The drafts, as
            the gate showed them, may then depend on tasks that failed or
            were skipped meanwhile: their tasks are skipped as the version
            is applied (see ``apply``).

    Raises:
        ValueError: the drafts are not a valid plan.
    """
    live = [t for t in state.tasks.values() if t.status is not TaskStatus.SUPERSEDED]
    removed = (
        [
            t.id
            for t in live
            if t.status is TaskStatus.PENDING
            and (replace_only is None or t.id in replace_only)
        ]
        if replace_pending
        else []
    )
    gone = set(removed)
    usable = {
        t.id
        for t in live
        if t.status in (TaskStatus.COMPLETED, TaskStatus.IN_PROGRESS)
        or (t.status is TaskStatus.PENDING and t.id not in gone)
        or (replace_only is not None and t.status in _SETTLED_SINCE)
    }
    check_drafts(drafts, known=frozenset(usable))
    version_no = len(state.versions) + 1
    ids = {d.key: f"t{state.task_count + i + 1}" for i, d in enumerate(drafts)}
    new_tasks = [
        _NEW_TASK.evolve(
            id=ids[d.key],
            key=d.key,
            description=d.description,
            depends_on=[ids.get(dep, dep) for dep in d.depends_on],
            phase=phase,
            milestone=d.milestone,
            requires_approval=d.requires_approval,
            version=version_no,
        )
        for d in drafts
    ]
    return PlanVersion(
        version=version_no,
        trigger=trigger,
        reason=reason,
        tasks_before=live,
        tasks_after=[t for t in live if t.id not in gone] + new_tasks,
        removed=removed,
        added=[t.id for t in new_tasks],
        preserved=[t.id for t in live if t.id not in gone],
        findings_at_replan=state.last_findings(FINDINGS_AT_REPLAN),
    )


def drafts_of(version: PlanVersion) -> list[TaskDraft]:
    """The drafts a version's added tasks were built from (its inverse).

    Dependencies on other added tasks go back to their keys; dependencies on
    older tasks stay ids, as a planner writes them.
    """
    after = {t.id: t for t in version.tasks_after}
    added = [after[task_id] for task_id in version.added]
    key_of = {t.id: t.key for t in added}
    return [
        TaskDraft(
            key=t.key,
            description=t.description,
            depends_on=[key_of.get(dep, dep) for dep in t.depends_on],
            milestone=t.milestone,
            requires_approval=t.requires_approval,
        )
        for t in added
    ]
