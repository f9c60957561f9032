"""The API's own response bodies (requests are the library's messages)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from ..messages import GateInfo, GateRequest, PlanVersion, RunResult, RunStatus
from ..messages import TokenUsage as TokenUsage
from ..store import RunSummary, ToolEffectRecord


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True)


class Problem(_Body):
    """An error: what went wrong and, for bad input, which field."""

    detail: str
    field: str | None = None
    """Dotted path of the offending field (``limits.max_replans``), if any."""


class Accepted(_Body):
    """A run was accepted; follow ``url``."""

    run_id: str
    url: str
    status: RunStatus


class RunPage(_Body):
    """One page of runs, newest first."""

    runs: list[RunSummary]
    limit: int
    offset: int
    next_offset: int | None = None
    """Where the next page starts; None on the last page."""


class RunView(_Body):
    """One run: status, tasks, usage, how it ended, and its gates."""

    run_id: str
    status: RunStatus
    created_at: datetime
    updated_at: datetime
    last_seq: int
    """The journal seq of the run's latest event (for ``Last-Event-ID``)."""
    total_usage: TokenUsage
    result: RunResult
    gates: list[GateInfo] = Field(default_factory=list)
    side_effects: list[ToolEffectRecord] = Field(default_factory=list)
    """The side-effect tool calls the run made: key, tool, arguments, and
    what the tool returned (None: it never returned, and may have acted)."""


class VersionList(_Body):
    """A run's applied plan versions, each with its diff."""

    run_id: str
    versions: list[PlanVersion]


class GateList(_Body):
    """One page of the gates waiting for a person, oldest first."""

    gates: list[GateRequest]
    elsewhere: dict[str, str] = Field(default_factory=dict)
    """Gate id -> the daemon (``host:pid``) that drives the gate's run, for
    the gates of this page open in another daemon on a shared PostgreSQL
    journal (any daemon takes the answer)."""
    limit: int
    offset: int
    next_offset: int | None = None
    """Where the next page starts; None on the last page. A gate answered
    between two pages moves the later ones a place up: use ``next_cursor``."""
    next_cursor: str | None = None
    """Give it as ``cursor`` for the next page, which starts after this
    page's last gate whatever was answered meanwhile; None on the last page."""


class GateAnswered(_Body):
    gate_id: str
    run_id: str
    decision: str


class Cancelled(_Body):
    run_id: str
    status: RunStatus
    stop_reason: str | None = None
