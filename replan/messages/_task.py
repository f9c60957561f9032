from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from ._base import READING_JOURNAL, Frozen


class TaskStatus(StrEnum):
    """Where a task is in its life."""

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"
    """A task it depends on failed, so it can never run."""
    SUPERSEDED = "superseded"
    """Replaced by a replan, or made unnecessary by an early ``complete``."""


TERMINAL_STATUSES = frozenset(
    {
        TaskStatus.COMPLETED,
        TaskStatus.FAILED,
        TaskStatus.SKIPPED,
        TaskStatus.SUPERSEDED,
    }
)
"""Statuses a task never leaves."""


EXECUTOR_CRASHED = "executor crashed: "
"""How the reason of an attempt whose executor crashed begins (the run
retries it, on a fresh worker)."""


class TaskOutcome(Frozen):
    """What the executor reports for one attempt at a task."""

    kind: Literal["task_outcome"] = "task_outcome"
    success: bool
    summary: str = ""
    """The task's result, in a few sentences."""
    findings: list[str] = Field(default_factory=list)
    """Facts learned that may bear on the rest of the plan."""
    reason: str | None = None
    """Why the task failed (when ``success`` is false)."""
    transient: bool = False
    """A retry may help (timeout, rate limit, 5xx): retried, never replanned."""


class TaskDraft(Frozen):
    """A task as a planner proposes it, before it gets an id."""

    kind: Literal["task_draft"] = "task_draft"
    key: str = Field(min_length=1, max_length=200)
    """The planner's name for the task; other drafts depend on it by this key."""
    description: str = Field(min_length=1)
    depends_on: list[str] = Field(default_factory=list)
    """Keys of drafts in the same proposal, or ids of existing tasks."""
    milestone: bool = False
    """Review the plan after this task completes."""
    requires_approval: bool = False
    """The task has side effects: a person approves it before it runs."""

    @field_validator("key", "description")
    @classmethod
    def _not_blank(cls, text: str, info: ValidationInfo) -> str:
        # min_length lets "   " through: a blank description is no task to
        # execute, and a blank key none that another draft can depend on.
        # A journal written before this check may hold one: it stays readable.
        if not text.strip() and not READING_JOURNAL.get():
            raise ValueError(f"the task's {info.field_name} must not be blank")
        return text


class Task(Frozen):
    """One unit of work in a run's plan."""

    kind: Literal["task"] = "task"
    id: str
    key: str
    description: str
    depends_on: list[str] = Field(default_factory=list)
    """Ids of tasks that must complete before this one starts."""
    status: TaskStatus = TaskStatus.PENDING
    attempts: int = 0
    result: TaskOutcome | None = None
    phase: Literal["main", "collection", "synthesis"] = "main"
    milestone: bool = False
    requires_approval: bool = False
    approved: bool = False
    """A person approved the side effect (``requires_approval`` tasks only)."""
    version: int = 1
    """The plan version that introduced the task."""
