"""Journal events of explore runs (part of the :data:`~replan.messages.Event` union)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from ._base import Frozen
from ._explore import (
    Cluster,
    ComparisonRecord,
    DiscoveryBrief,
    EvidenceItem,
    Hypothesis,
    HypothesisReview,
    Rejection,
    SafetyFinding,
)
from ._plan import Critique
from ._result import RunStatus


class ExploreEvent(Frozen):
    """Base of the explore events (same ``seq`` and ``at`` as every event)."""

    seq: int = Field(ge=1)
    at: datetime


class GoalScreened(ExploreEvent):
    """The goal was validated and screened against the safety policy."""

    kind: Literal["goal_screened"] = "goal_screened"
    outcome: Literal["pass", "review", "blocked", "invalid"]
    findings: list[SafetyFinding] = Field(default_factory=list)


class ContextExplored(ExploreEvent):
    """The context became evidence items; gaps and questions were found."""

    kind: Literal["context_explored"] = "context_explored"
    evidence: list[EvidenceItem]
    summary: str = ""
    gaps: list[str] = Field(default_factory=list)
    questions: list[str] = Field(default_factory=list)
    sparse: bool = False


class HypothesesAdded(ExploreEvent):
    """New candidates joined the pool (generated, evolved or a person's)."""

    kind: Literal["hypotheses_added"] = "hypotheses_added"
    hypotheses: list[Hypothesis]


class HypothesisCritiqued(ExploreEvent):
    """One reviewer's answer on one new candidate, journaled as it comes in.

    A run resumed in the middle of a review batch takes the journaled ones
    and asks only for the rest; :class:`HypothesesReviewed` ends the batch.
    """

    kind: Literal["hypothesis_critiqued"] = "hypothesis_critiqued"
    hypothesis_id: str
    reviewer: int = Field(ge=0)
    """The reviewer's index in the batch, from 0."""
    critique: Critique | None = None
    """None: the answer was malformed or the call failed (see ``errors``)."""
    errors: list[str] = Field(default_factory=list)
    """This call's malformed output or failure."""


class HypothesesReviewed(ExploreEvent):
    """Reviews of new candidates; some may be rejected at once (safety).

    Ends a review batch: the batch's critiques come first, one
    :class:`HypothesisCritiqued` each (a journal of an earlier version has
    none, and the batch's errors in an ``explore_error`` just before).
    """

    kind: Literal["hypotheses_reviewed"] = "hypotheses_reviewed"
    reviews: list[HypothesisReview]
    rejected: list[Rejection] = Field(default_factory=list)
    safety_notes: list[str] = Field(default_factory=list)


class HypothesesCompared(ExploreEvent):
    """One tournament round: its comparisons, ratings included."""

    kind: Literal["hypotheses_compared"] = "hypotheses_compared"
    comparisons: list[ComparisonRecord]


class HypothesesClustered(ExploreEvent):
    """Similar candidates grouped; near-duplicates rejected."""

    kind: Literal["hypotheses_clustered"] = "hypotheses_clustered"
    clusters: list[Cluster]
    rejected: list[Rejection] = Field(default_factory=list)


class CycleFinished(ExploreEvent):
    """One generate-review-rank-evolve cycle and what it decided."""

    kind: Literal["cycle_finished"] = "cycle_finished"
    iteration: int
    decision: Literal["select", "evolve", "limit"]
    qualifying: list[str] = Field(default_factory=list)
    """Ids of the active candidates meeting every threshold."""
    reason: str = ""


class ExploreErrorRecorded(ExploreEvent):
    """A model call gave malformed output or failed; the run goes on."""

    kind: Literal["explore_error"] = "explore_error"
    errors: list[str]


class BriefIssued(ExploreEvent):
    """The discovery brief. Followed by ``run_finished``."""

    kind: Literal["brief_issued"] = "brief_issued"
    brief: DiscoveryBrief
    ended: RunStatus | None = None
    """Set on the brief of a run a limit or a stopped role ended early: the
    status the run ends with, so that a run stopped between its brief and
    its end ends alike when resumed."""
    stop_reason: str | None = None
    """With ``ended``: the run's stop reason."""


ExploreEvents = (
    GoalScreened
    | ContextExplored
    | HypothesesAdded
    | HypothesisCritiqued
    | HypothesesReviewed
    | HypothesesCompared
    | HypothesesClustered
    | CycleFinished
    | ExploreErrorRecorded
    | BriefIssued
)
