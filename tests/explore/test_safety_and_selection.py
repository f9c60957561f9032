"""The safety screen, evidence items, aggregation, thresholds and selection."""

from __future__ import annotations

import pytest

from replan import ConfigurationError
from replan.explore import (
    aggregate,
    critique_problem,
    decide,
    evidence_items,
    mentions,
    review_reasons,
    screen,
    select,
    shortfalls,
)
from replan.messages import (
    LENSES,
    Critique,
    EloRating,
    ExploreSettings,
    RunSpec,
    SafetyPolicy,
)


def full(base: float = 0.8, **lenses: float) -> dict[str, float]:
    out = dict.fromkeys(LENSES, base)
    out.update(lenses)
    return out


def test_a_blocked_term_blocks_the_goal_as_whole_words_only() -> None:
    policy = SafetyPolicy(blocked_terms=["nerve agent", "exploit"])
    outcome, findings = screen("Design a NERVE  agent delivery route", "", policy)
    assert outcome == "blocked"
    assert "nerve agent" in findings[0].detail
    assert screen("Why do exploiters churn?", "", policy)[0] == "pass"
    assert not mentions("unexploited markets", "exploit")


def test_a_blocked_phrase_does_not_match_across_the_goal_and_the_domain() -> None:
    policy = SafetyPolicy()
    outcome, _ = screen("Why do staff quit after the nerve", "agent retention", policy)
    assert outcome == "pass"
    outcome, _ = screen("Why do staff quit?", "nerve-agent research", policy)
    assert outcome == "blocked"


def test_a_high_impact_domain_needs_review_unless_autonomy_is_allowed() -> None:
    outcome, findings = screen(
        "Why do patients skip doses?", "Clinical", SafetyPolicy()
    )
    assert outcome == "review"
    assert findings[0].level == "review"
    autonomous = SafetyPolicy(allow_autonomy=True)
    outcome, findings = screen("Why do patients skip doses?", "clinical", autonomous)
    assert outcome == "pass"
    assert findings[0].level == "note"


def test_a_goal_that_names_a_high_impact_domain_needs_review() -> None:
    assert screen("Find legal reasons contracts stall", "", SafetyPolicy())[0] == (
        "review"
    )
    assert screen("Find why cooks stop cooking", "product", SafetyPolicy())[0] == (
        "pass"
    )


@pytest.mark.parametrize(
    ("domain", "field"),
    [
        ("clinical trials", "clinical"),
        ("Medical devices", "medical"),
        ("biomedical research", "biomedical"),
        ("security/compliance", "security"),
        ("physical world robotics", "physical-world"),
    ],
)
def test_a_domain_label_that_names_a_high_impact_field_needs_review(
    domain: str, field: str
) -> None:
    outcome, findings = screen("Why do people drop out?", domain, SafetyPolicy())
    assert outcome == "review"
    assert findings[0].detail == (
        f"high-impact domain ({field}): a person reviews the result"
    )
    assert screen("Why do people drop out?", "biomedicine", SafetyPolicy())[0] == (
        "pass"  # whole words: no stemming
    )


def test_context_becomes_one_evidence_item_per_paragraph_with_ids() -> None:
    items = evidence_items(["first note\n\nsecond   note", "  ", "third"])
    assert [(e.id, e.text, e.source) for e in items] == [
        ("E1", "first note", "context[0]"),
        ("E2", "second note", "context[0]"),
        ("E3", "third", "context[2]"),
    ]


def test_a_critique_missing_a_lens_or_out_of_range_is_malformed() -> None:
    assert critique_problem(Critique(scores=full()), LENSES) is None
    missing = {k: v for k, v in full().items() if k != "safety"}
    assert "safety" in (critique_problem(Critique(scores=missing), LENSES) or "")
    assert "outside" in (
        critique_problem(Critique(scores=full(novelty=7)), LENSES) or ""
    )


def test_aggregation_keeps_disagreement_visible_behind_the_mean() -> None:
    review = aggregate(
        "H1",
        [
            Critique(scores=full(plausibility=0.9, confidence=0.3), critique="yes"),
            Critique(scores=full(plausibility=0.2, confidence=0.5), critique="no"),
        ],
        LENSES,
        disagreement=0.5,
    )
    assert review.scores["plausibility"] == pytest.approx(0.55)
    assert review.spread["plausibility"] == pytest.approx(0.7)
    assert review.disagreement == ["plausibility"]
    assert review.confidence == pytest.approx(0.4)
    assert review.critiques == ["yes", "no"]


def test_shortfalls_name_each_lens_below_its_threshold() -> None:
    review = aggregate("H1", [Critique(scores=full(evidence=0.1))], LENSES, 0.5)
    assert shortfalls(review, {"evidence": 0.3, "safety": 0.7}) == [
        "evidence 0.1 < 0.3"
    ]


@pytest.mark.parametrize(
    ("qualifying", "iteration", "expected"),
    [(3, 1, "select"), (3, 3, "select"), (2, 1, "evolve"), (2, 3, "limit")],
)
def test_a_cycle_selects_evolves_or_stops_at_the_limit(
    qualifying: int, iteration: int, expected: str
) -> None:
    assert decide(qualifying, 3, iteration, 3) == expected


def test_selection_prefers_qualifying_candidates_then_rating() -> None:
    reviews = {
        "H1": aggregate("H1", [Critique(scores=full(evidence=0.1))], LENSES, 0.5),
        "H2": aggregate("H2", [Critique(scores=full())], LENSES, 0.5),
        "H3": aggregate("H3", [Critique(scores=full())], LENSES, 0.5),
    }
    ratings = {
        "H1": EloRating(rating=1300),
        "H2": EloRating(rating=1180),
        "H3": EloRating(rating=1220),
    }
    assert select(["H1", "H2", "H3"], ratings, reviews, {"evidence": 0.3}, 2) == [
        "H3",
        "H2",
    ]
    assert select(["H1", "H2", "H3"], ratings, reviews, {"evidence": 0.3}, 5) == [
        "H3",
        "H2",
        "H1",
    ]


def test_review_reasons_cover_impact_disagreement_confidence_and_ethics() -> None:
    calm = aggregate("H1", [Critique(scores=full(confidence=0.9))], LENSES, 0.5)
    assert (
        review_reasons([calm], high_impact=None, safety_concerns=[], min_confidence=0.5)
        == []
    )
    torn = aggregate(
        "H2",
        [
            Critique(scores=full(novelty=1.0, confidence=0.2)),
            Critique(scores=full(novelty=0.1, confidence=0.2)),
        ],
        LENSES,
        0.5,
    )
    reasons = review_reasons(
        [calm, torn],
        high_impact="high-impact domain (medical)",
        safety_concerns=["H4: dual use"],
        min_confidence=0.5,
    )
    assert reasons[0] == "high-impact domain (medical)"
    assert any("disagree sharply on H2 (novelty)" in r for r in reasons)
    assert any("low reviewer confidence in H2" in r for r in reasons)
    assert reasons[-1] == "ethical or safety concern: H4: dual use"


def test_explore_settings_name_the_bad_field() -> None:
    with pytest.raises(ConfigurationError) as info:
        RunSpec(goal="g", kind="explore", explore={"thresholds": {"charm": 0.5}})
    assert info.value.field == "explore.thresholds"
    with pytest.raises(ConfigurationError) as info:
        ExploreSettings(select=0)
    assert info.value.field == "select"
    with pytest.raises(ConfigurationError) as info:
        RunSpec(goal="g", kind="explore", safety_policy={"blocked_terms": [" "]})
    assert info.value.field == "safety_policy.blocked_terms"


def test_an_explore_run_takes_no_task_list() -> None:
    with pytest.raises(ConfigurationError) as info:
        RunSpec(goal="g", kind="explore", tasks=[{"key": "a", "description": "a"}])
    assert info.value.field == "tasks"
