from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from ._base import Frozen
from ._task import Task, TaskDraft


class Trigger(StrEnum):
    """Why a reviewer asks for a new plan. Nothing else justifies a replan."""

    CONTRADICTION = "contradiction"
    """A finding breaks an assumption the remaining tasks rely on."""
    OBSOLESCENCE = "obsolescence"
    """Remaining tasks became redundant (two or more of them)."""
    SCOPE_SHIFT = "scope_shift"
    """The original framing was incomplete; a person confirms first."""
    NEW_CRITICAL_PATH = "new_critical_path"
    """A corroborated shortcut makes the long route unnecessary."""


class PlanProposal(Frozen):
    """A planner's answer: the new pending tasks and why."""

    kind: Literal["plan_proposal"] = "plan_proposal"
    tasks: list[TaskDraft] = Field(default_factory=list)
    rationale: str = ""
    achievable: bool = True
    """False when the goal can no longer be reached: the run ends ``aborted``."""


class Verdict(Frozen):
    """A reviewer's decision at a milestone."""

    kind: Literal["verdict"] = "verdict"
    decision: Literal["continue", "replan", "complete", "abort"]
    trigger: Trigger | None = None
    rationale: str = ""
    confidence: float = Field(default=1.0, ge=0.0, le=1.0)
    affected_tasks: list[str] = Field(default_factory=list)
    """Ids of pending tasks the finding makes wrong or redundant."""
    corroborating_sources: int = Field(default=0, ge=0)


class Critique(Frozen):
    """A reviewer's scores for one candidate, lens by lens, with a critique."""

    kind: Literal["critique"] = "critique"
    scores: dict[str, float] = Field(default_factory=dict)
    critique: str = ""


class Alignment(Frozen):
    """The ranker's goal-alignment check: one flag per proposed task, in order."""

    kind: Literal["alignment"] = "alignment"
    aligned: list[bool]
    rationale: str = ""


class Comparison(Frozen):
    """The ranker's pairwise judgement between candidates ``a`` and ``b``."""

    kind: Literal["comparison"] = "comparison"
    winner: Literal["a", "b"]
    rationale: str = ""


class Synthesis(Frozen):
    """The run's final output, built from its completed tasks."""

    kind: Literal["synthesis"] = "synthesis"
    output: str
    sources: list[str] = Field(default_factory=list)


class PlanVersion(Frozen):
    """A snapshot of the plan at a change, with the diff against the last one."""

    kind: Literal["plan_version"] = "plan_version"
    version: int
    trigger: Trigger | None = None
    """None for the first plan and the hybrid boundary."""
    reason: str = ""
    """The planner's or reviewer's rationale for this version."""
    tasks_before: list[Task] = Field(default_factory=list)
    tasks_after: list[Task] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    """Ids of tasks superseded by this version."""
    added: list[str] = Field(default_factory=list)
    preserved: list[str] = Field(default_factory=list)
    findings_at_replan: list[str] = Field(default_factory=list)
    """The last three findings before the change."""
    approved_by: str | None = None
    rejected_reason: str | None = None
    """Set on a proposed version that was not applied."""


class ReplanOutcome(StrEnum):
    """How a replan decision ended."""

    APPLIED = "applied"
    REFUSED_CEILING = "refused_ceiling"
    REFUSED_BUDGET = "refused_budget"
    REFUSED_DRIFT = "refused_drift"
    REFUSED_THRESHOLD = "refused_threshold"
    REJECTED_BY_HUMAN = "rejected_by_human"
    """A person rejected the change at its gate."""
    REJECTED_BY_POLICY = "rejected_by_policy"
    """The gate expired unanswered and the gate policy's ``on_timeout``
    rejected the change (by ``policy:timeout``): no person decided. Journals
    of earlier versions label it ``rejected_by_human``, with that reason."""
    ABORTED_INFEASIBLE = "aborted_infeasible"
    """The planner found the goal no longer achievable: the run ends aborted."""
    REFUSED_INVALID = "refused_invalid"
    """The proposal was not a valid plan (unknown dependencies, a cycle) or
    the reviewer asked to replan without naming a trigger."""
    REFUSED_ERROR = "refused_error"
    """A role the replan needed (the planner, the candidates' critic, the
    ranker) gave no usable answer: malformed even after the re-ask, a
    refusal, or a crash or timeout on every attempt."""


class ReplanRecord(Frozen):
    """One replan decision, applied or refused, as the journal keeps it."""

    kind: Literal["replan_record"] = "replan_record"
    trigger: Trigger | None
    outcome: ReplanOutcome
    reason: str
    confidence: float
    version: int | None = None
    """The plan version this replan created (applied ones only)."""
    proposed: PlanVersion | None = None
    """The change that was proposed, when it got that far."""
