from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from ._base import (
    Frozen,
    _interned,
    _new,
    _set_dict,
    _set_extra,
    _set_fields_set,
    _set_private,
)
from ._explore import DiscoveryBrief
from ._plan import PlanVersion, ReplanRecord
from ._task import Task


class RunStatus(StrEnum):
    """Where a run is. The last six are final."""

    RUNNING = "running"
    WAITING_FOR_HUMAN = "waiting_for_human"
    COMPLETED = "completed"
    ABORTED = "aborted"
    """The goal became infeasible; partial results are kept."""
    LIMIT_REACHED = "limit_reached"
    FAILED = "failed"
    CANCELLED = "cancelled"
    BLOCKED = "blocked"
    """Refused by the safety policy."""

    @property
    def final(self) -> bool:
        # Identity: ``in`` would compare the members as strings.
        return self is not RunStatus.RUNNING and self is not RunStatus.WAITING_FOR_HUMAN


class TokenUsage(Frozen):
    """Tokens one or more model calls used."""

    kind: Literal["token_usage"] = "token_usage"
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cached_tokens: int = Field(default=0, ge=0)
    """Input tokens the provider served from its prompt cache (part of input)."""
    calls: int = Field(default=0, ge=0)
    cost: float = Field(default=0.0, ge=0.0)
    """Price of these tokens by the model's price table (0 without one)."""

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: TokenUsage) -> TokenUsage:
        # Sums of valid counts are valid: no need to validate them again. A
        # run adds one per finished task and model call, so the sum is built
        # directly (its fields set names the five counts), copying neither
        # operand.
        total = _new(TokenUsage)
        _set_dict(
            total,
            {
                "kind": "token_usage",
                "input_tokens": self.input_tokens + other.input_tokens,
                "output_tokens": self.output_tokens + other.output_tokens,
                "cached_tokens": self.cached_tokens + other.cached_tokens,
                "calls": self.calls + other.calls,
                "cost": self.cost + other.cost,
            },
        )
        _set_fields_set(total, _SUM_FIELDS)
        _set_extra(total, None)
        _set_private(total, None)
        return total


_SUM_FIELDS = _interned(
    {"input_tokens", "output_tokens", "cached_tokens", "calls", "cost"}
)
"""The fields a sum of usages sets (one set object for every sum)."""


class Usage(Frozen):
    """A run's model usage, role by role."""

    kind: Literal["usage"] = "usage"
    by_role: dict[str, TokenUsage] = Field(default_factory=dict)

    @property
    def total(self) -> TokenUsage:
        total = TokenUsage()
        for usage in self.by_role.values():
            total = total + usage
        return total

    def add(self, role: str, usage: TokenUsage) -> Usage:
        """Return a new ``Usage`` with ``usage`` added to ``role``."""
        by_role = dict(self.by_role)
        had = by_role.get(role)
        by_role[role] = usage if had is None else had + usage
        return self.evolve(by_role=by_role)


class ModelFailure(Frozen):
    """A model call that failed for good, as the journal keeps it."""

    kind: Literal["model_failure"] = "model_failure"
    role: str
    purpose: str
    task_id: str | None = None
    error_type: str
    """``ModelOutputError``, ``ModelRefusal``, ``TransientModelError``..."""
    message: str
    transient: bool = False
    fatal: bool = False
    """The failure ends the run (authentication, spent budget)."""
    raw_output: str | None = None
    """The model's text when it could not be used (an invalid answer)."""
    usage: TokenUsage = Field(default_factory=TokenUsage)
    """Tokens the failed call(s) used; the run's usage counts them too."""
    retry_after_s: float | None = Field(default=None, ge=0)
    """A transient failure's wait the server asked for (``Retry-After``):
    the request is not tried again before it has passed."""


REPLANNING_PURPOSES = frozenset(
    {"replan", "critique", "compare", "evolve", "alignment"}
)
"""Model purposes that serve a replan: their tokens are the price of discovery."""


class RunResult(Frozen):
    """How a run ended: its tasks, plan history, usage and output."""

    kind: Literal["run_result"] = "run_result"
    run_id: str
    goal: str
    pattern: str
    status: RunStatus
    tasks: list[Task]
    versions: list[PlanVersion]
    """Every applied plan version, the first plan included."""
    replans: list[ReplanRecord]
    """Every replan decision, applied or refused, in order."""
    usage: Usage
    output: str | None = None
    sources: list[str] = Field(default_factory=list)
    """What the synthesis cites."""
    stop_reason: str | None = None
    iterations: int = 0
    """Milestones a plan run held (those the cheap checks decided too; only
    the reviewer's count toward ``max_iterations``), or an explore run's
    cycles."""
    task_executions: int = 0
    brief: DiscoveryBrief | None = None
    """The discovery brief of an explore run."""
    model_failures: list[ModelFailure] = Field(default_factory=list)
    """Model calls that failed for good (with the raw text of invalid answers)."""
    replanning_tokens: int = 0
    """Tokens spent on replanning: the purposes in ``REPLANNING_PURPOSES``."""

    @property
    def replans_applied(self) -> int:
        return sum(r.outcome == "applied" for r in self.replans)

    @property
    def cost_to_discovery(self) -> float | None:
        """Replanning tokens per applied replan (None before the first one)."""
        applied = self.replans_applied
        return self.replanning_tokens / applied if applied else None

    @property
    def cost(self) -> float:
        """The run's total cost by the model's price table (0 without one)."""
        return self.usage.total.cost
