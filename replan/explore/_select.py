"""Pure judgements of an explore cycle: scores, thresholds, selection, review.

None of these does I/O; the flow in ``replan.supervisor`` journals what they
return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from ..messages import Critique, EloRating, HypothesisReview
from ._elo import id_key


def critique_problem(critique: Critique, lenses: Sequence[str]) -> str | None:
    """Why a critique cannot be used (a lens missing or out of range), or None."""
    missing = [lens for lens in lenses if lens not in critique.scores]
    if missing:
        return f"scores miss the lens(es) {', '.join(missing)}"
    for name, value in critique.scores.items():
        if not 0.0 <= value <= 1.0:
            return f"score {name}={value:g} is outside 0..1"
    return None


def aggregate(
    hypothesis_id: str,
    critiques: Sequence[Critique],
    lenses: Sequence[str],
    disagreement: float,
) -> HypothesisReview:
    """Combine a hypothesis's critiques, keeping their disagreement visible.

    Args:
        hypothesis_id: the reviewed hypothesis.
        critiques: one or more usable critiques (every lens scored).
        lenses: the lenses to aggregate.
        disagreement: a spread at or above this is a sharp disagreement.
    """
    if not critiques:
        raise ValueError("aggregate needs at least one critique")
    scores: dict[str, float] = {}
    spread: dict[str, float] = {}
    for lens in lenses:
        values = [c.scores[lens] for c in critiques]
        scores[lens] = round(sum(values) / len(values), 6)
        spread[lens] = round(max(values) - min(values), 6)
    confidences = [
        c.scores["confidence"] for c in critiques if "confidence" in c.scores
    ]
    return HypothesisReview(
        hypothesis_id=hypothesis_id,
        scores=scores,
        spread=spread,
        quality=round(sum(scores.values()) / len(scores), 6),
        confidence=(
            round(sum(confidences) / len(confidences), 6) if confidences else None
        ),
        critiques=[c.critique for c in critiques if c.critique],
        disagreement=[lens for lens in lenses if spread[lens] >= disagreement],
    )


def shortfalls(review: HypothesisReview, thresholds: Mapping[str, float]) -> list[str]:
    """The lenses below their threshold, as ``plausibility 0.4 < 0.5``."""
    return [
        f"{lens} {review.scores[lens]:.2g} < {minimum:g}"
        for lens, minimum in thresholds.items()
        if review.scores.get(lens, 0.0) < minimum
    ]


def rank_key(
    hypothesis_id: str,
    ratings: Mapping[str, EloRating],
    reviews: Mapping[str, HypothesisReview],
) -> tuple[float, float, int, str]:
    """Sort key: highest rating first, then review quality, then the older id."""
    rating = ratings.get(hypothesis_id, EloRating()).rating
    review = reviews.get(hypothesis_id)
    quality = review.quality if review is not None else 0.0
    return (-rating, -quality, *id_key(hypothesis_id))


def decide(
    qualifying: int, wanted: int, iteration: int, max_iterations: int
) -> Literal["select", "evolve", "limit"]:
    """After a cycle: enough diverse qualifying candidates, another cycle, or stop."""
    if qualifying >= wanted:
        return "select"
    if iteration >= max_iterations:
        return "limit"
    return "evolve"


def select(
    representatives: Sequence[str],
    ratings: Mapping[str, EloRating],
    reviews: Mapping[str, HypothesisReview],
    thresholds: Mapping[str, float],
    wanted: int,
) -> list[str]:
    """At most ``wanted`` cluster representatives: qualifying ones first, each
    group by rank. One per cluster, so the selection stays diverse."""
    ranked = sorted(
        (r for r in representatives if r in reviews),
        key=lambda r: (
            bool(shortfalls(reviews[r], thresholds)),
            rank_key(r, ratings, reviews),
        ),
    )
    return ranked[:wanted]


def review_reasons(
    selected: Sequence[HypothesisReview],
    *,
    high_impact: str | None,
    safety_concerns: Sequence[str],
    min_confidence: float,
) -> list[str]:
    """Why a person must look at the selection (empty: nobody needs to).

    Args:
        selected: the reviews of the selected hypotheses.
        high_impact: the screen's finding when the domain needs a person.
        safety_concerns: ethical or safety concerns raised during review.
        min_confidence: reviewer confidence below this asks a person.
    """
    reasons: list[str] = []
    if high_impact:
        reasons.append(high_impact)
    for review in selected:
        if review.disagreement:
            reasons.append(
                f"reviewers disagree sharply on {review.hypothesis_id} "
                f"({', '.join(review.disagreement)})"
            )
        if review.confidence is not None and review.confidence < min_confidence:
            reasons.append(
                f"low reviewer confidence in {review.hypothesis_id} "
                f"({review.confidence:.2g})"
            )
    reasons.extend(f"ethical or safety concern: {c}" for c in safety_concerns)
    return reasons
