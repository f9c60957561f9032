"""The state of an explore run, and the pure fold of its journal events."""

from __future__ import annotations

from typing import Literal, assert_never

from pydantic import Field

from ..messages import (
    BriefIssued,
    Cluster,
    ComparisonRecord,
    ContextExplored,
    CycleFinished,
    DiscoveryBrief,
    EloRating,
    EvidenceItem,
    ExploreErrorRecorded,
    GoalScreened,
    HypothesesAdded,
    HypothesesClustered,
    HypothesesCompared,
    HypothesesReviewed,
    Hypothesis,
    HypothesisCritiqued,
    HypothesisReview,
    Rejection,
    SafetyFinding,
)
from ..messages._base import Frozen
from ..messages._explore_events import ExploreEvents


class ExploreState(Frozen):
    """Everything an explore run has found, rebuilt exactly from its events."""

    screen: Literal["pass", "review", "blocked", "invalid"] | None = None
    findings: list[SafetyFinding] = Field(default_factory=list)
    evidence: list[EvidenceItem] = Field(default_factory=list)
    summary: str = ""
    gaps: list[str] = Field(default_factory=list)
    questions: list[str] = Field(default_factory=list)
    sparse: bool = False
    hypotheses: dict[str, Hypothesis] = Field(default_factory=dict)
    """Every candidate ever added, in order; none is ever changed."""
    reviews: dict[str, HypothesisReview] = Field(default_factory=dict)
    ratings: dict[str, EloRating] = Field(default_factory=dict)
    comparisons: list[ComparisonRecord] = Field(default_factory=list)
    clusters: list[Cluster] = Field(default_factory=list)
    rejected: dict[str, Rejection] = Field(default_factory=dict)
    safety_notes: list[str] = Field(default_factory=list)
    cycles: list[CycleFinished] = Field(default_factory=list)
    critiqued: list[HypothesisCritiqued] = Field(default_factory=list)
    """The answers of the review batch under way, by hypothesis (in the order
    added) and reviewer, whatever order they came in."""
    critique_errors_at: int = 0
    """Where the errors of the batch under way start in ``errors``."""
    errors: list[str] = Field(default_factory=list)
    brief: DiscoveryBrief | None = None

    @property
    def active(self) -> list[str]:
        """Reviewed candidates still in the running, in the order added."""
        return [
            h for h in self.hypotheses if h in self.reviews and h not in self.rejected
        ]

    @property
    def unreviewed(self) -> list[str]:
        return [
            h
            for h in self.hypotheses
            if h not in self.reviews and h not in self.rejected
        ]


def fold_explore(explore: ExploreState | None, event: ExploreEvents) -> ExploreState:
    """The explore state after ``event``. Pure.

    Raises:
        ValueError: the event does not fit the state (a hypothesis id reused,
            a review or comparison of an unknown hypothesis).
    """
    state = explore or ExploreState()
    match event:
        case GoalScreened(outcome=outcome, findings=findings):
            return state.model_copy(update={"screen": outcome, "findings": findings})
        case ContextExplored():
            return state.model_copy(
                update={
                    "evidence": event.evidence,
                    "summary": event.summary,
                    "gaps": event.gaps,
                    "questions": event.questions,
                    "sparse": event.sparse,
                }
            )
        case HypothesesAdded(hypotheses=hypotheses):
            added = dict(state.hypotheses)
            ratings = dict(state.ratings)
            for h in hypotheses:
                if h.id in added:
                    raise ValueError(f"hypothesis {h.id} already exists")
                added[h.id] = h
                ratings[h.id] = EloRating()
            return state.model_copy(update={"hypotheses": added, "ratings": ratings})
        case HypothesisCritiqued():
            return _critiqued(state, event)
        case HypothesesReviewed(reviews=reviews, rejected=rejected, safety_notes=notes):
            known = dict(state.reviews)
            for review in reviews:
                _known(state, review.hypothesis_id)
                known[review.hypothesis_id] = review
            return state.model_copy(
                update={
                    "reviews": known,
                    "rejected": _reject(state, rejected),
                    "safety_notes": [*state.safety_notes, *notes],
                    "critiqued": [],
                }
            )
        case HypothesesCompared(comparisons=comparisons):
            ratings = dict(state.ratings)
            for c in comparisons:
                a, b = ratings[_known(state, c.a)], ratings[_known(state, c.b)]
                a_won = c.winner == c.a
                ratings[c.a] = EloRating(
                    rating=c.rating_a,
                    wins=a.wins + a_won,
                    losses=a.losses + (not a_won),
                )
                ratings[c.b] = EloRating(
                    rating=c.rating_b,
                    wins=b.wins + (not a_won),
                    losses=b.losses + a_won,
                )
            return state.model_copy(
                update={
                    "ratings": ratings,
                    "comparisons": [*state.comparisons, *comparisons],
                }
            )
        case HypothesesClustered(clusters=clusters, rejected=rejected):
            return state.model_copy(
                update={"clusters": clusters, "rejected": _reject(state, rejected)}
            )
        case CycleFinished():
            return state.model_copy(update={"cycles": [*state.cycles, event]})
        case ExploreErrorRecorded(errors=errors):
            return state.model_copy(update={"errors": [*state.errors, *errors]})
        case BriefIssued(brief=brief):
            return state.model_copy(update={"brief": brief})
        case _:
            assert_never(event)


def _known(state: ExploreState, hypothesis_id: str) -> str:
    if hypothesis_id not in state.hypotheses:
        raise ValueError(f"unknown hypothesis {hypothesis_id}")
    return hypothesis_id


def _critiqued(state: ExploreState, event: HypothesisCritiqued) -> ExploreState:
    """Keep a batch's answers, and their errors, in an order that does not
    depend on which call answered first: a run resumed in the middle of the
    batch ends up with the state of one that was not interrupted."""
    hid = _known(state, event.hypothesis_id)
    if hid in state.reviews or hid in state.rejected:
        raise ValueError(f"hypothesis {hid} was reviewed already")
    if any(
        c.hypothesis_id == hid and c.reviewer == event.reviewer for c in state.critiqued
    ):
        raise ValueError(f"reviewer {event.reviewer} of {hid} answered already")
    order = {h: n for n, h in enumerate(state.hypotheses)}
    critiqued = sorted(
        [*state.critiqued, event], key=lambda c: (order[c.hypothesis_id], c.reviewer)
    )
    at = state.critique_errors_at if state.critiqued else len(state.errors)
    end = at + sum(len(c.errors) for c in state.critiqued)
    errors = [
        *state.errors[:at],
        *(e for c in critiqued for e in c.errors),
        *state.errors[end:],
    ]
    return state.model_copy(
        update={"critiqued": critiqued, "critique_errors_at": at, "errors": errors}
    )


def _reject(state: ExploreState, rejected: list[Rejection]) -> dict[str, Rejection]:
    out = dict(state.rejected)
    for r in rejected:
        out[_known(state, r.hypothesis_id)] = r
    return out
