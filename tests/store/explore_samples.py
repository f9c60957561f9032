"""One realistic event of every explore type, continuing a submitted run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from replan.messages import (
    BriefIssued,
    Cluster,
    ComparisonRecord,
    ContextExplored,
    Critique,
    CycleFinished,
    DiscoveryBrief,
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
    SelectedHypothesis,
    ValidationPlan,
)

T0 = datetime(2025, 3, 10, 9, 0, tzinfo=UTC)


def explore_events(first_seq: int = 2) -> list:
    at = [T0 + timedelta(seconds=s) for s in range(20)]
    h1 = Hypothesis(
        id="H1",
        statement="Solo cooks leave because recipes serve four",
        rationale="portion mismatch — “leftovers” pile up",
        evidence_refs=["E1"],
        assumptions=["household size is known"],
        risks=["survey bias"],
        iteration=1,
    )
    h2 = h1.model_copy(
        update={"id": "H2", "statement": "Solo cooks quit: recipes serve four"}
    )
    review = HypothesisReview(
        hypothesis_id="H1",
        scores={"plausibility": 0.8, "safety": 0.9},
        spread={"plausibility": 0.6, "safety": 0.0},
        quality=0.85,
        confidence=0.4,
        critiques=["plausible, thin evidence"],
        disagreement=["plausibility"],
    )
    plan = ValidationPlan(
        hypothesis_id="H1", next_step="split by household", success_signal="gap"
    )
    brief = DiscoveryBrief(
        status="needs_review",
        summary="1 candidate hypothesis needs review",
        selected=[
            SelectedHypothesis(
                hypothesis=h1,
                scores=review.scores,
                quality=0.85,
                rating=1216.0,
                wins=1,
                losses=0,
                meets_thresholds=True,
                speculative=True,
                cluster_size=2,
            )
        ],
        rejected=[Rejection(hypothesis_id="H2", statement="x", reason="dup of H1")],
        validation_plan=[plan],
        needs_human_review=True,
        review_reasons=["reviewers disagree"],
        errors=["reviewer/critique: malformed output"],
        iterations=1,
    )
    kinds = [
        (
            GoalScreened,
            {
                "outcome": "review",
                "findings": [
                    SafetyFinding(level="review", detail="high-impact domain (medical)")
                ],
            },
        ),
        (
            ContextExplored,
            {
                "evidence": [
                    EvidenceItem(id="E1", text="41% inactive", source="context[0]")
                ],
                "summary": "one note",
                "gaps": ["household size"],
                "questions": ["why week three?"],
                "sparse": True,
            },
        ),
        (HypothesesAdded, {"hypotheses": [h1, h2]}),
        (
            HypothesisCritiqued,
            {
                "hypothesis_id": "H1",
                "reviewer": 1,
                "critique": Critique(
                    scores={"plausibility": 0.5, "safety": 0.9},
                    critique="plausible, thin evidence",
                ),
                "errors": ["reviewer/critique: first answer malformed"],
            },
        ),
        (HypothesesReviewed, {"reviews": [review], "rejected": [], "safety_notes": []}),
        (
            HypothesesCompared,
            {
                "comparisons": [
                    ComparisonRecord(
                        a="H1",
                        b="H2",
                        winner="H1",
                        rating_a=1216.0,
                        rating_b=1184.0,
                        iteration=1,
                        round=1,
                        rationale="r",
                    )
                ]
            },
        ),
        (
            HypothesesClustered,
            {
                "clusters": [Cluster(representative="H1", members=["H1", "H2"])],
                "rejected": [
                    Rejection(hypothesis_id="H2", statement="x", reason="dup")
                ],
            },
        ),
        (CycleFinished, {"iteration": 1, "decision": "limit", "qualifying": ["H1"]}),
        (ExploreErrorRecorded, {"errors": ["reviewer/critique: malformed output"]}),
        (BriefIssued, {"brief": brief}),
    ]
    return [
        cls(seq=first_seq + n, at=at[n], **fields)
        for n, (cls, fields) in enumerate(kinds)
    ]
