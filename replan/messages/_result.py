from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from ._base import Frozen
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
        return self not in (RunStatus.RUNNING, RunStatus.WAITING_FOR_HUMAN)


class TokenUsage(Frozen):
    """Tokens one or more model calls used."""

    kind: Literal["token_usage"] = "token_usage"
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cached_tokens: int = Field(default=0, ge=0)
    calls: int = Field(default=0, ge=0)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            calls=self.calls + other.calls,
        )


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
        by_role[role] = by_role.get(role, TokenUsage()) + usage
        return Usage(by_role=by_role)


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
    task_executions: int = 0
    brief: DiscoveryBrief | None = None
    """The discovery brief of an explore run."""

    @property
    def replans_applied(self) -> int:
        return sum(r.outcome == "applied" for r in self.replans)
