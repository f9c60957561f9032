"""Messages of explore runs: settings, evidence, hypotheses, reviews, the brief.

An explore run produces candidate hypotheses for a person to validate, never
verified facts; every type here keeps that distinction visible.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from ._base import Frozen, Settings

LENSES: tuple[str, ...] = (
    "novelty",
    "plausibility",
    "evidence",
    "feasibility",
    "impact",
    "clarity",
    "safety",
)
"""The lenses a reviewer scores every hypothesis on, each from 0 to 1."""

DEFAULT_THRESHOLDS: dict[str, float] = {
    "novelty": 0.3,
    "plausibility": 0.5,
    "evidence": 0.3,
    "feasibility": 0.4,
    "safety": 0.7,
}

DEFAULT_HIGH_IMPACT: tuple[str, ...] = (
    "biomedical",
    "medical",
    "clinical",
    "security",
    "finance",
    "financial",
    "legal",
    "physical-world",
)

DEFAULT_BLOCKED: tuple[str, ...] = (
    "bioweapon",
    "chemical weapon",
    "nerve agent",
    "ransomware",
    "malware",
    "explosive device",
)


TERM_JOINERS = re.compile(r"[\s\-_/\\\u2010-\u2015\u2212]+")
"""What separates the words of a policy term: spaces, hyphens and dashes,
underscores and slashes (``nerve agent``, ``nerve-agent``, ``nerve_agent``)."""


class SafetyPolicy(Settings):
    """What an explore run may not pursue, and what needs a person first."""

    blocked_terms: list[str] = Field(default_factory=lambda: list(DEFAULT_BLOCKED))
    """Words or phrases that block a goal outright (whole words of any script,
    any case; a phrase's words may be joined by spaces, hyphens, underscores or
    slashes)."""
    high_impact_domains: list[str] = Field(
        default_factory=lambda: list(DEFAULT_HIGH_IMPACT)
    )
    """Domains whose results a person reviews: matched against
    ``ExploreSettings.domain`` and the goal's words."""
    allow_autonomy: bool = False
    """Let high-impact runs finish without a person (other review reasons,
    such as an ethical concern, still open a gate)."""

    @field_validator("blocked_terms", "high_impact_domains")
    @classmethod
    def _terms_not_blank(cls, terms: list[str]) -> list[str]:
        if any(not TERM_JOINERS.sub("", t) for t in terms):
            raise ValueError("terms must not be blank (only spaces or joiners)")
        return terms


class ExploreSettings(Settings):
    """How an explore run generates, judges and selects hypotheses."""

    domain: str = ""
    """A domain label (``product``, ``biomedical``...), screened by the policy."""
    constraints: list[str] = Field(default_factory=list)
    """Scope limits passed to every model call."""
    per_batch: int = Field(default=6, ge=1, le=50)
    """Hypotheses asked of the planner (and of the evolver) per batch."""
    select: int = Field(default=3, ge=1, le=20)
    """Diverse hypotheses the brief selects."""
    thresholds: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_THRESHOLDS)
    )
    """Minimum mean score per lens for a hypothesis to qualify."""
    reviewers: int = Field(default=2, ge=1, le=5)
    """Independent reviews per hypothesis (disagreement needs two or more)."""
    disagreement: float = Field(default=0.5, gt=0.0, le=1.0)
    """A lens whose reviews differ by this much is a sharp disagreement."""
    min_confidence: float = Field(default=0.5, ge=0.0, le=1.0)
    """Reviewer confidence (``scores["confidence"]``) below this asks a person."""
    similarity: float = Field(default=0.6, gt=0.0, le=1.0)
    """Word-set similarity at which two hypotheses are near-duplicates."""
    min_evidence: int = Field(default=2, ge=0, le=1_000)
    """Fewer evidence items than this makes every hypothesis speculative."""
    k_factor: float = Field(default=32.0, gt=0.0, le=400.0)
    """Elo K factor of the tournament."""
    rounds: int = Field(default=2, ge=1, le=20)
    """Random pairing rounds per cycle, before the top candidates' round."""
    top_n: int = Field(default=4, ge=2, le=20)
    """The top candidates play a round robin among themselves each cycle."""
    evolve_top: int = Field(default=3, ge=1, le=20)
    """How many of the strongest candidates the evolver receives."""
    seed: int = 0
    """Seeds the tournament's pairings: a fixed seed, a fixed tournament."""
    temperature: float = Field(default=0.8, ge=0.0, le=2.0)
    """Sampling temperature for generating hypotheses (diversity)."""

    @field_validator("thresholds")
    @classmethod
    def _known_lenses(cls, thresholds: dict[str, float]) -> dict[str, float]:
        for lens, value in thresholds.items():
            if lens not in LENSES:
                raise ValueError(f"unknown lens {lens!r}; use {', '.join(LENSES)}")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"threshold of {lens!r} must be from 0 to 1")
        return thresholds


class EvidenceItem(Frozen):
    """One piece of supplied context, with the id hypotheses cite it by."""

    kind: Literal["evidence_item"] = "evidence_item"
    id: str
    """``E1``, ``E2``... in the order supplied."""
    text: str
    source: str
    """Where it came from (``context[0]``)."""


class ContextAnalysis(Frozen):
    """The planner's reading of the evidence: summary, gaps, questions."""

    kind: Literal["context_analysis"] = "context_analysis"
    summary: str = ""
    gaps: list[str] = Field(default_factory=list)
    """Missing information and untested assumptions."""
    questions: list[str] = Field(default_factory=list)
    """Questions that steer generation towards different angles."""


class ValidationPlan(Frozen):
    """How to test one hypothesis: the next experiment and what would count."""

    kind: Literal["validation_plan"] = "validation_plan"
    hypothesis_id: str
    next_step: str
    success_signal: str


class Hypothesis(Frozen):
    """A candidate explanation or direction, to be validated, never a fact."""

    kind: Literal["hypothesis"] = "hypothesis"
    id: str = ""
    """``H1``, ``H2``...; assigned by the supervisor (a model's ids are ignored)."""
    statement: str = Field(min_length=1)
    rationale: str = ""
    evidence_refs: list[str] = Field(default_factory=list)
    """Ids of the evidence items it rests on."""
    assumptions: list[str] = Field(default_factory=list)
    risks: list[str] = Field(default_factory=list)
    parent_ids: list[str] = Field(default_factory=list)
    """The hypotheses an evolved one refines or combines."""
    origin: Literal["generated", "evolved", "human"] = "generated"
    iteration: int = 0
    """The cycle that produced it (0 for a person's)."""

    @field_validator("statement")
    @classmethod
    def _statement_not_blank(cls, statement: str) -> str:
        # min_length lets "   " through, and a blank statement is no
        # hypothesis to review, rank or validate.
        if not statement.strip():
            raise ValueError("the statement must not be blank")
        return statement


class HypothesisBatch(Frozen):
    """New hypotheses from the planner (generation) or the evolver."""

    kind: Literal["hypothesis_batch"] = "hypothesis_batch"
    hypotheses: list[Hypothesis] = Field(default_factory=list)
    rationale: str = ""


class ValidationBatch(Frozen):
    """The planner's validation plans for the selected hypotheses."""

    kind: Literal["validation_batch"] = "validation_batch"
    plans: list[ValidationPlan] = Field(default_factory=list)


class HypothesisReview(Frozen):
    """Every review of one hypothesis, with what the aggregate would hide."""

    kind: Literal["hypothesis_review"] = "hypothesis_review"
    hypothesis_id: str
    scores: dict[str, float]
    """Mean score per lens over the reviews."""
    spread: dict[str, float]
    """Largest minus smallest score per lens: disagreement between reviewers."""
    quality: float
    """Mean of the lens means: the aggregate the ranking starts from."""
    confidence: float | None = None
    """Mean reviewer confidence, when reviewers gave one."""
    critiques: list[str] = Field(default_factory=list)
    disagreement: list[str] = Field(default_factory=list)
    """Lenses on which reviewers disagreed sharply."""


class EloRating(Frozen):
    """A hypothesis's tournament record."""

    kind: Literal["elo_rating"] = "elo_rating"
    rating: float = 1200.0
    wins: int = 0
    losses: int = 0

    @property
    def comparisons(self) -> int:
        return self.wins + self.losses


class ComparisonRecord(Frozen):
    """One pairwise judgement and the ratings it produced."""

    kind: Literal["comparison_record"] = "comparison_record"
    a: str
    b: str
    winner: str
    """The id of the winner (``a`` or ``b``)."""
    rating_a: float
    """``a``'s rating after the comparison."""
    rating_b: float
    iteration: int
    """The cycle, from 1 (0: a person's review round)."""
    round: int
    """The round within the cycle, from 1; the top candidates' round is last."""
    rationale: str = ""


class Cluster(Frozen):
    """Hypotheses similar enough to count as one idea."""

    kind: Literal["cluster"] = "cluster"
    representative: str
    members: list[str]


class Rejection(Frozen):
    """A candidate left out of the selection, and why."""

    kind: Literal["rejection"] = "rejection"
    hypothesis_id: str
    statement: str
    reason: str


class SafetyFinding(Frozen):
    """What the safety screen (or a reviewer's safety lens) found."""

    kind: Literal["safety_finding"] = "safety_finding"
    level: Literal["blocked", "review", "note"]
    detail: str


class SelectedHypothesis(Frozen):
    """A hypothesis chosen for validation, with its scores and standing."""

    kind: Literal["selected_hypothesis"] = "selected_hypothesis"
    hypothesis: Hypothesis
    scores: dict[str, float]
    quality: float
    rating: float
    wins: int
    losses: int
    meets_thresholds: bool
    speculative: bool
    """True when the evidence is sparse or the hypothesis cites none."""
    cluster_size: int = 1


class DiscoveryBrief(Frozen):
    """An explore run's answer: hypotheses to test, never verified facts."""

    kind: Literal["discovery_brief"] = "discovery_brief"
    status: Literal["completed", "needs_review", "blocked", "failed"]
    summary: str
    selected: list[SelectedHypothesis] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list)
    rejected: list[Rejection] = Field(default_factory=list)
    limitations: list[str] = Field(default_factory=list)
    safety_notes: list[str] = Field(default_factory=list)
    validation_plan: list[ValidationPlan] = Field(default_factory=list)
    evidence: list[EvidenceItem] = Field(default_factory=list)
    gaps: list[str] = Field(default_factory=list)
    needs_human_review: bool = False
    review_reasons: list[str] = Field(default_factory=list)
    reviewed_by: str | None = None
    errors: list[str] = Field(default_factory=list)
    """Malformed model output and failed calls, as recorded."""
    iterations: int = 0
