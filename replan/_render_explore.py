"""Plain-text views of explore runs: progress lines and the discovery brief."""

from __future__ import annotations

from typing import TYPE_CHECKING, assert_never

from .messages import (
    BriefIssued,
    ContextExplored,
    CycleFinished,
    DiscoveryBrief,
    ExploreErrorRecorded,
    GoalScreened,
    HypothesesAdded,
    HypothesesClustered,
    HypothesesCompared,
    HypothesesReviewed,
    HypothesisCritiqued,
)
from .messages._explore_events import ExploreEvents

if TYPE_CHECKING:
    from .supervisor import RunState


def _wrap(text: str, indent: str, *, hang: str = "") -> list[str]:
    from ._render import wrap

    return wrap(text, indent, hang=hang)


def explore_event_lines(event: ExploreEvents, state: RunState) -> list[str]:
    """One progress entry for an explore event."""
    lines: list[str]
    match event:
        case GoalScreened(outcome=outcome, findings=findings):
            lines = [f"goal screened: {outcome}"]
            for f in findings:
                lines.extend(_wrap(f.detail, "    ", hang=f"{f.level}: "))
            return lines
        case ContextExplored(evidence=evidence, gaps=gaps, sparse=sparse):
            head = f"context: {len(evidence)} evidence item(s)"
            head += ", sparse" if sparse else ""
            lines = [head]
            for gap in gaps:
                lines.extend(_wrap(gap, "    ", hang="gap: "))
            return lines
        case HypothesesAdded(hypotheses=hypotheses):
            n = len(hypotheses)
            lines = [f"{n} hypothes{'is' if n == 1 else 'es'} added"]
            for h in hypotheses:
                origin = (
                    f" ({h.origin} from {', '.join(h.parent_ids)})"
                    if h.parent_ids
                    else f" ({h.origin})"
                )
                lines.extend(_wrap(h.statement + origin, "    ", hang=f"{h.id:<4}"))
            return lines
        case HypothesisCritiqued(errors=errors):
            # The batch's line (hypotheses_reviewed) says the rest.
            return [line for e in errors for line in _wrap(e, "", hang="error: ")]
        case HypothesesReviewed(reviews=reviews, rejected=rejected):
            lines = [f"{len(reviews)} reviewed"]
            for r in reviews:
                flag = (
                    f"  disagreement: {', '.join(r.disagreement)}"
                    if r.disagreement
                    else ""
                )
                lines.append(f"    {r.hypothesis_id:<4}quality {r.quality:.2f}{flag}")
            lines.extend(
                f"    {r.hypothesis_id:<4}rejected: {r.reason}" for r in rejected
            )
            return lines
        case HypothesesCompared(comparisons=comparisons):
            if not comparisons:
                return []
            first = comparisons[0]
            return [
                f"tournament cycle {first.iteration} round {first.round}: "
                + ", ".join(
                    f"{c.winner} beat {c.b if c.winner == c.a else c.a}"
                    for c in comparisons
                )
            ]
        case HypothesesClustered(clusters=clusters, rejected=rejected):
            lines = [f"{len(clusters)} distinct idea(s)"]
            lines.extend(f"    {r.hypothesis_id:<4}{r.reason}" for r in rejected)
            return lines
        case CycleFinished(iteration=iteration, decision=decision, reason=reason):
            return [f"cycle {iteration}: {decision} ({reason})"]
        case ExploreErrorRecorded(errors=errors):
            return [line for e in errors for line in _wrap(e, "", hang="error: ")]
        case BriefIssued(brief=brief):
            return [f"brief issued: {brief.status}"]
        case _:
            assert_never(event)


def brief_lines(brief: DiscoveryBrief) -> list[str]:
    """The brief as ``replan explore`` and ``replan demo --explore`` print it."""
    lines = [f"discovery brief: {brief.status}"]
    lines.extend(_wrap(brief.summary, "  "))
    plans = {p.hypothesis_id: p for p in brief.validation_plan}
    if brief.selected:
        lines += ["", "selected hypotheses (to validate, not verified)"]
    for s in brief.selected:
        h = s.hypothesis
        tags = [f"Elo {s.rating:.0f} ({s.wins}-{s.losses})", f"quality {s.quality:.2f}"]
        if s.speculative:
            tags.append("speculative")
        if not s.meets_thresholds:
            tags.append("below thresholds")
        lines.extend(_wrap(h.statement, "  ", hang=f"{h.id:<5}"))
        lines.append("       " + ", ".join(tags))
        scores = "  ".join(f"{k} {v:.2f}" for k, v in s.scores.items())
        lines.extend(_wrap(scores, "       "))
        if h.evidence_refs:
            lines.append(f"       evidence: {', '.join(h.evidence_refs)}")
        plan = plans.get(h.id)
        if plan is not None:
            lines.extend(_wrap(plan.next_step, "       ", hang="next step: "))
            lines.extend(_wrap(plan.success_signal, "       ", hang="success signal: "))
    for title, items in (
        ("assumptions", brief.assumptions),
        (
            "review",
            [*brief.review_reasons]
            + ([f"reviewed by {brief.reviewed_by}"] if brief.reviewed_by else []),
        ),
        ("limitations", brief.limitations),
        ("safety notes", brief.safety_notes),
        ("errors", brief.errors),
    ):
        if items:
            lines += ["", title]
            for item in items:
                lines.extend(_wrap(item, "  ", hang="- "))
    if brief.rejected:
        lines += ["", "rejected"]
        for r in brief.rejected:
            lines.extend(
                _wrap(f"{r.statement} — {r.reason}", "  ", hang=f"{r.hypothesis_id:<5}")
            )
    return lines
