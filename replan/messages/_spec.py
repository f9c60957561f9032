from __future__ import annotations

from typing import Literal

from pydantic import Field, JsonValue, field_validator, model_validator

from .._errors import ConfigurationError
from ._base import Settings, json_depth, json_problem
from ._explore import ExploreSettings, SafetyPolicy
from ._plan import Trigger
from ._task import TaskDraft

MAX_SECONDS = 366 * 86_400.0
"""The longest deadline or gate timeout: a year (longer ones would overflow
a date, and a run that may wait longer than that should wait without one)."""
MAX_RETRY_BACKOFF_S = 60.0
"""The longest wait between a task's attempts that no failure asked for."""
MAX_TOKEN_BUDGET = 10**15
"""The largest token budget: far beyond any run, and exact as a float."""

MAX_METADATA_DEPTH = 32
"""How deeply objects and arrays may nest in ``RunSpec.metadata`` (the
metadata object itself is level 1): far below what the journal's JSON
reader can read back inside an event."""


class Limits(Settings):
    """The ceilings and budgets a run may not cross.

    Reaching a hard limit ends the run ``limit_reached`` with a ``stop_reason``
    naming it; a guard (ceiling, budget reserve) refuses a replan instead.
    """

    max_replans: int = Field(default=3, ge=0, le=100)
    """Applied replans allowed; later ones are refused and recorded."""
    max_iterations: int = Field(default=20, ge=1, le=10_000)
    """Milestone review cycles: in plan runs, the reviews the reviewer is
    asked (a failed one too; a milestone the cheap checks decide is free),
    in explore runs, generate-review-evolve cycles."""
    max_task_executions: int = Field(default=200, ge=1, le=1_000_000)
    """Task attempts started, retries included."""
    max_task_attempts: int = Field(default=2, ge=1, le=20)
    """Attempts per task when failures are transient."""
    retry_backoff_s: float = Field(default=0.25, ge=0.0, le=MAX_RETRY_BACKOFF_S)
    """The wait before a task's first retry after a transient failure that
    asked for none; it doubles with each retry (at most a minute), with
    jitter. A failure that says how long to wait (a ``Retry-After``) waits
    that long instead. 0: retry at once."""
    max_concurrency: int = Field(default=4, ge=1, le=1_000)
    """Tasks of one run in flight at once."""
    milestone_every: int = Field(default=3, ge=1, le=10_000)
    """Review after this many completed tasks even without a milestone task."""
    token_budget: int | None = Field(default=None, gt=0, le=MAX_TOKEN_BUDGET)
    """Tokens the run may use in all; no model call starts once it is spent
    (at most a quadrillion: the guards compute with it as a float)."""
    replan_reserve: float = Field(default=0.2, ge=0.0, le=1.0)
    """Fraction of the budget kept back: replans are refused past the rest."""
    min_confidence: float = Field(default=0.7, ge=0.0, le=1.0)
    """Confidence a new-critical-path replan needs."""
    min_corroboration: int = Field(default=2, ge=0, le=1_000)
    """Independent sources a new-critical-path replan needs."""
    deadline_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    """Wall-clock seconds the run may take from submission (at most a year)."""
    gate_timeout_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    """How long a gate waits for a person before the policy default applies
    (at most a year; None waits without a limit)."""
    replan_candidates: int = Field(default=1, ge=1, le=16)
    """Revisions the planner proposes per replan; more than one are ranked."""
    max_tool_steps: int = Field(default=8, ge=1, le=100)
    """Model calls one task attempt may make in its tool loop."""
    task_timeout_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    """Seconds one attempt of a plan run's task may take, waits at its tool
    calls' gates included; a slower attempt is cut short and fails
    ``transient`` (retried up to ``max_task_attempts``). None: no limit."""
    call_timeout_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    """Seconds one request to a model-backed role other than a task attempt
    may take: a plan, a revision, a boundary, a review, critiques, a drift
    check, a tournament, a refinement, the synthesis (each with all of its
    model calls, a re-ask included), and an explore run's calls. A slower one
    is cut short and counts as a failed attempt (retried up to
    ``max_task_attempts``); when every attempt is cut short, the run goes on
    without the answer where it can (a review continues, a replan is
    refused) and ends ``failed`` where it cannot. None: no limit but
    ``deadline_s``; it does not follow ``task_timeout_s``, which bounds tool
    calls and waits at their gates as well."""


class GatePolicy(Settings):
    """When a person must approve a change, and what a timeout means."""

    gate_on: frozenset[Trigger] = frozenset({Trigger.SCOPE_SHIFT})
    """Replan triggers that need a person's approval before they apply."""
    on_timeout: Literal["approve", "reject"] = "reject"
    """The resolution applied when ``limits.gate_timeout_s`` passes."""


class RunSpec(Settings):
    """Everything needed to start a run."""

    goal: str = Field(min_length=1, max_length=20_000)
    """The original goal; every replan receives it verbatim."""
    kind: Literal["plan", "explore"] = "plan"
    pattern: Literal["contract", "discovery", "hybrid"] = "discovery"
    """``contract``: fixed plan; ``discovery``: replans at milestones;
    ``hybrid``: a fixed collection phase, then a replanning synthesis phase."""
    tasks: list[TaskDraft] | None = None
    """A fixed task list (contract runs, the hybrid collection phase); when
    absent the planner writes the first plan."""
    context: list[str] = Field(default_factory=list)
    limits: Limits = Field(default_factory=Limits)
    gate_policy: GatePolicy = Field(default_factory=GatePolicy)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    """Free-form JSON kept with the run, nested at most
    :data:`MAX_METADATA_DEPTH` levels deep."""
    explore: ExploreSettings = Field(default_factory=ExploreSettings)
    """How an explore run generates, judges and selects hypotheses."""
    safety_policy: SafetyPolicy = Field(default_factory=SafetyPolicy)
    """What an explore run may not pursue, and what needs a person."""

    @field_validator("goal")
    @classmethod
    def _goal_not_blank(cls, goal: str) -> str:
        if not goal.strip():
            raise ValueError("the goal must not be blank")
        return goal

    @field_validator("metadata", mode="before")
    @classmethod
    def _metadata_is_json(cls, metadata: object) -> object:
        # Checked here, not by JsonValue's own union, whose errors name
        # its members (``metadata.a.float``), not the body's fields.
        if isinstance(metadata, dict):
            problem = json_problem(metadata)
            if problem is not None:
                raise ConfigurationError(*problem)
        return metadata

    @field_validator("metadata")
    @classmethod
    def _metadata_not_too_deep(
        cls, metadata: dict[str, JsonValue]
    ) -> dict[str, JsonValue]:
        if json_depth(metadata) > MAX_METADATA_DEPTH:
            raise ValueError(
                f"objects and arrays nest more than {MAX_METADATA_DEPTH} levels deep"
            )
        return metadata

    @field_validator("tasks")
    @classmethod
    def _tasks_form_a_graph(
        cls, tasks: list[TaskDraft] | None
    ) -> list[TaskDraft] | None:
        if tasks is None:
            return None
        if not tasks:
            raise ValueError("give at least one task, or leave tasks out")
        check_drafts(tasks, known=frozenset())
        return tasks

    @model_validator(mode="after")
    def _explore_has_no_tasks(self) -> RunSpec:
        if self.kind == "explore" and self.tasks is not None:
            raise ConfigurationError(
                "tasks", "explore runs generate hypotheses, not a task list"
            )
        if self.kind == "explore" and self.pattern != "discovery":
            raise ConfigurationError(
                "pattern",
                "explore runs follow no plan pattern: leave it out of an explore run",
            )
        if self.kind == "plan":
            # Settings only an explore run reads, given to a plan run, would
            # be ignored without a word; the defaults (as a journaled spec
            # carries them) are fine.
            for field, default in (
                ("explore", _DEFAULT_EXPLORE),
                ("safety_policy", _DEFAULT_SAFETY),
            ):
                if getattr(self, field) != default:
                    raise ConfigurationError(
                        field,
                        "only explore runs use it: set kind='explore', "
                        "or leave it out of a plan run",
                    )
        return self


_DEFAULT_EXPLORE = ExploreSettings()
_DEFAULT_SAFETY = SafetyPolicy()


def check_drafts(drafts: list[TaskDraft], known: frozenset[str]) -> None:
    """Check that drafts have unique keys and form an acyclic graph.

    Args:
        drafts: the proposed tasks.
        known: ids of existing tasks the drafts may depend on.

    Raises:
        ValueError: naming the first problem found.
    """
    keys: dict[str, TaskDraft] = {}
    for draft in drafts:
        if draft.key in keys:
            raise ValueError(f"task key {draft.key!r} appears twice")
        keys[draft.key] = draft
    for draft in drafts:
        for dep in draft.depends_on:
            if dep not in keys and dep not in known:
                raise ValueError(f"task {draft.key!r} depends on unknown {dep!r}")
    # Kahn's algorithm over the drafts only: existing tasks cannot depend on
    # them. Linear in drafts and edges (a repeated dependency counts twice
    # in both the in-degree and the dependents).
    dependents: dict[str, list[str]] = {key: [] for key in keys}
    indegree = dict.fromkeys(keys, 0)
    for draft in drafts:
        for dep in draft.depends_on:
            if dep in keys:
                dependents[dep].append(draft.key)
                indegree[draft.key] += 1
    ready = [key for key, n in indegree.items() if n == 0]
    seen = 0
    while ready:
        key = ready.pop()
        seen += 1
        for other in dependents[key]:
            indegree[other] -= 1
            if indegree[other] == 0:
                ready.append(other)
    if seen != len(keys):
        cyclic = sorted(key for key, n in indegree.items() if n > 0)
        raise ValueError(f"tasks {', '.join(cyclic)} depend on each other in a cycle")
