"""Pure helpers of the explore flow: admitting candidates, writing the brief."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ..explore import shortfalls
from ..explore._similarity import text_words
from ..messages import (
    DiscoveryBrief,
    ExploreSettings,
    Hypothesis,
    Rejection,
    SelectedHypothesis,
    ValidationPlan,
)
from ._explore_state import ExploreState

BriefStatus = Literal["completed", "needs_review", "blocked", "failed"]

NOT_FACTS = (
    "These are candidate hypotheses to validate, not verified findings; "
    "scores and ratings are model judgements."
)


def admit(
    explore: ExploreState,
    proposed: Sequence[Hypothesis],
    *,
    origin: Literal["generated", "evolved", "human"],
    iteration: int,
    limit: int | None = None,
    parents: Sequence[str] = (),
) -> tuple[list[Hypothesis], list[str]]:
    """New candidates with fresh ids, and notes on what was dropped.

    A model's ids, origin and iteration are replaced; evidence and parent
    references to unknown ids are dropped (and reported). An evolved
    candidate that names no parent descends from every candidate it was given.
    A model's candidate worded as one the run has already (the same words in
    the same order, whatever the case and punctuation) is dropped and
    reported: reviewed again, one set aside as a safety concern could come
    back and be selected. A person's own are all taken.
    """
    known_evidence = {e.id for e in explore.evidence}
    notes: list[str] = []
    out: list[Hypothesis] = []
    next_number = len(explore.hypotheses) + 1
    worded = {wording(h.statement): hid for hid, h in explore.hypotheses.items()}
    for h in proposed:
        if limit is not None and len(out) == limit:
            break
        new_id = f"H{next_number + len(out)}"
        words = wording(h.statement)
        if origin != "human":
            if words in worded:
                notes.append(
                    f"{'an' if origin == 'evolved' else 'a'} {origin} hypothesis "
                    f"repeating {worded[words]} word for word was dropped"
                )
                continue
            worded[words] = new_id
        unknown = [r for r in h.evidence_refs if r not in known_evidence]
        if unknown:
            notes.append(f"{new_id} cited unknown evidence {', '.join(unknown)}")
        parent_ids = [p for p in h.parent_ids if p in explore.hypotheses]
        if origin == "evolved" and not parent_ids:
            parent_ids = list(parents)
        out.append(
            h.model_copy(
                update={
                    "id": new_id,
                    "origin": origin,
                    "iteration": iteration,
                    "evidence_refs": [
                        r for r in h.evidence_refs if r in known_evidence
                    ],
                    "parent_ids": parent_ids,
                }
            )
        )
    return out, notes


def wording(statement: str) -> tuple[str, ...]:
    """A statement's words in order, whatever the case and punctuation: two
    hypotheses with the same wording say the same thing."""
    return tuple(text_words(statement))


def build_brief(
    explore: ExploreState,
    settings: ExploreSettings,
    *,
    status: BriefStatus,
    summary: str,
    selected: Sequence[str] = (),
    plans: Sequence[ValidationPlan] = (),
    review_reasons: Sequence[str] = (),
    reviewed_by: str | None = None,
    rejected: Sequence[Rejection] = (),
    limitations: Sequence[str] = (),
) -> DiscoveryBrief:
    """The discovery brief from what the run found and what it decided."""
    chosen: list[SelectedHypothesis] = []
    notes: list[str] = [NOT_FACTS]
    if explore.sparse:
        notes.append(
            f"Evidence is sparse ({len(explore.evidence)} item(s)): every "
            "hypothesis is speculative."
        )
    sizes = {c.representative: len(c.members) for c in explore.clusters}
    for hid in selected:
        h = explore.hypotheses[hid]
        review = explore.reviews[hid]
        rating = explore.ratings[hid]
        short = shortfalls(review, settings.thresholds)
        if short:
            notes.append(f"{hid} falls short of the thresholds: {', '.join(short)}.")
        if not h.evidence_refs:
            notes.append(f"{hid} cites no evidence: it is speculative.")
        chosen.append(
            SelectedHypothesis(
                hypothesis=h,
                scores=review.scores,
                quality=review.quality,
                rating=round(rating.rating, 2),
                wins=rating.wins,
                losses=rating.losses,
                meets_thresholds=not short,
                speculative=explore.sparse or not h.evidence_refs,
                cluster_size=sizes.get(hid, 1),
            )
        )
    planned = {p.hypothesis_id for p in plans}
    notes.extend(
        f"{hid} has no validation plan yet." for hid in selected if hid not in planned
    )
    if explore.errors:
        notes.append(
            f"{len(explore.errors)} problem(s) with model answers were recorded: "
            "malformed or failed answers, or references to what does not exist "
            "(see errors)."
        )
    notes.extend(limitations)
    assumptions: list[str] = []
    for item in chosen:
        for a in item.hypothesis.assumptions:
            if a not in assumptions:
                assumptions.append(a)
    safety = [f.detail for f in explore.findings] + list(explore.safety_notes)
    return DiscoveryBrief(
        status=status,
        summary=summary,
        selected=chosen,
        assumptions=assumptions,
        rejected=[*explore.rejected.values(), *rejected],
        limitations=notes,
        safety_notes=safety,
        validation_plan=list(plans),
        evidence=explore.evidence,
        gaps=explore.gaps,
        needs_human_review=bool(review_reasons) and reviewed_by is None,
        review_reasons=list(review_reasons),
        reviewed_by=reviewed_by,
        errors=explore.errors,
        iterations=len(explore.cycles),
    )
