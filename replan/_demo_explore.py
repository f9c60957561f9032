"""The offline explore demo: why do cooks stop using a meal-planning app?

The planner proposes five hypotheses; one is a rephrasing of another and is
merged away, two fall short on evidence, so only two qualify. The evolver
combines the strongest into a new candidate that qualifies too. The reviewers
disagree sharply about one selected hypothesis, so a person reviews the
selection before the brief names a validation step for each.

Every answer is a plain function of the request (:func:`answer`): no API key,
and two runs give the same brief. ``replan explore --model scripted:demo``
uses the same answers for any goal.
"""

from __future__ import annotations

from typing import Any

from .llm import ModelRequest, ScriptedModel
from .messages import (
    LENSES,
    Comparison,
    ContextAnalysis,
    Critique,
    ExploreSettings,
    Hypothesis,
    HypothesisBatch,
    Limits,
    RunSpec,
    TokenUsage,
    ValidationBatch,
    ValidationPlan,
)

GOAL = (
    "Find plausible reasons why cooks stop using a meal-planning app after "
    "their third week."
)

CONTEXT = [
    "Analytics: 38% of accounts are inactive by day 21; inactivity is twice as "
    "common in single-person households.",
    "Recipe catalogue: 92% of recipes default to four servings; scaling is a "
    "manual setting few cooks change.",
    "Support tickets: the most common theme is what to do with leftovers, "
    "followed by how to skip a week.",
    "Survey (412 cooks): those who set a weekly food budget plan for three more "
    "weeks on average.",
]

PORTIONS = (
    "Cooks in single-person households drift away because recipes default to "
    "four servings"
)
PORTIONS_AGAIN = (
    "Single-person households drift away because recipes default to four servings"
)
LEFTOVERS = (
    "Unused leftovers make the weekly plan feel wasteful, so cooks stop planning"
)
BUDGET = "Cooks who never set a food budget have no goal to keep planning for"
REMINDERS = "Reminders arrive after dinner is already decided, so plans go unused"
COMBINED = (
    "Cooks on a budget quit once fixed four-serving recipes turn into leftovers "
    "that waste it"
)


def _scores(base: float, **lenses: float) -> dict[str, float]:
    out = dict.fromkeys(LENSES, base)
    out.update(safety=0.9, confidence=0.8)
    out.update(lenses)
    return out


# statement -> (refs, assumptions, strength, scores per reviewer, next step, signal)
_IDEAS: dict[
    str, tuple[list[str], list[str], float, list[dict[str, float]], str, str]
] = {
    PORTIONS: (
        ["E1", "E2"],
        ["household size is known from onboarding"],
        0.9,
        [_scores(0.8, novelty=0.5)],
        "Compare day-21 retention of single-person households that scale "
        "recipes with those that do not.",
        "Households that scale recipes keep planning markedly longer.",
    ),
    PORTIONS_AGAIN: (["E1"], [], 0.5, [_scores(0.7, novelty=0.3)], "", ""),
    LEFTOVERS: (
        ["E3"],
        ["tickets reflect what silent cooks feel too"],
        0.7,
        [_scores(0.75, plausibility=0.9), _scores(0.7, plausibility=0.3)],
        "Add a leftovers step to one cohort's weekly plan and watch week-4 activity.",
        "The cohort with the leftovers step plans a fourth week more often.",
    ),
    BUDGET: (["E4"], [], 0.4, [_scores(0.6, evidence=0.2)], "", ""),
    REMINDERS: ([], [], 0.2, [_scores(0.5, evidence=0.1, plausibility=0.4)], "", ""),
    COMBINED: (
        ["E2", "E3", "E4"],
        ["budget setters notice waste sooner"],
        0.8,
        [_scores(0.8, novelty=0.7)],
        "Segment budget setters by how often their plans leave leftovers and "
        "compare their churn.",
        "Budget setters with frequent leftovers churn sooner than the rest.",
    ),
}


def _hypothesis(statement: str, parents: list[str] | None = None) -> Hypothesis:
    refs, assumptions, *_ = _IDEAS[statement]
    return Hypothesis(
        statement=statement,
        rationale="suggested by " + (", ".join(refs) if refs else "no evidence yet"),
        evidence_refs=refs,
        assumptions=assumptions,
        risks=["self-reported data may not match behaviour"],
        parent_ids=parents or [],
    )


def _idea(statement: str) -> tuple[float, list[dict[str, float]], str, str]:
    if statement not in _IDEAS:  # a person's hypothesis: a middling review
        return 0.5, [_scores(0.6)], "Interview ten cooks about it.", "Most agree."
    _, _, strength, reviews, step, signal = _IDEAS[statement]
    return strength, reviews, step, signal


def answer(request: ModelRequest) -> Any:
    """The scripted answer to every explore request of the demo."""
    ctx = request.context
    match request.role, request.purpose:
        case "planner", "gaps":
            return ContextAnalysis(
                summary="Retention falls by week three, most for households of one.",
                gaps=[
                    "no data on how often planned meals are actually cooked",
                    "no breakdown of leftovers by household size",
                ],
                questions=["What changes for a cook between week two and four?"],
            )
        case "planner", "hypotheses":
            return HypothesisBatch(
                hypotheses=[
                    _hypothesis(s)
                    for s in (PORTIONS, PORTIONS_AGAIN, LEFTOVERS, BUDGET, REMINDERS)
                ]
            )
        case "reviewer", "critique":
            _, reviews, _, _ = _idea(ctx["hypothesis"].statement)
            scores = reviews[min(ctx["reviewer_index"], len(reviews) - 1)]
            return Critique(
                scores=scores,
                critique="well grounded"
                if scores["evidence"] >= 0.5
                else "thin evidence",
            )
        case "ranker", "compare":
            a, b = _idea(ctx["a"].statement)[0], _idea(ctx["b"].statement)[0]
            return Comparison(
                winner="a" if a >= b else "b", rationale="better supported"
            )
        case "evolver", "evolve":
            parents = [h.id for h in ctx["candidates"]]
            return HypothesisBatch(hypotheses=[_hypothesis(COMBINED, parents)])
        case "planner", "validation":
            plans = []
            for h in ctx["hypotheses"]:
                _, _, step, signal = _idea(h.statement)
                plans.append(
                    ValidationPlan(
                        hypothesis_id=h.id, next_step=step, success_signal=signal
                    )
                )
            return ValidationBatch(plans=plans)
    raise ValueError(
        f"the explore demo has no answer for {request.role}/{request.purpose}"
    )


def explore_demo_model(latency_s: float = 0.0) -> ScriptedModel:
    """The scripted model of the explore demo."""

    def usage(request: ModelRequest) -> TokenUsage:
        return TokenUsage(input_tokens=400, output_tokens=120, calls=1)

    return ScriptedModel(answer, latency_s=latency_s, usage=usage, name="scripted:demo")


def explore_demo_spec() -> RunSpec:
    """The explore demo's run: four evidence notes, three hypotheses wanted."""
    return RunSpec(
        goal=GOAL,
        kind="explore",
        context=CONTEXT,
        limits=Limits(max_iterations=3),
        explore=ExploreSettings(domain="product", per_batch=5, select=3, seed=7),
    )
