"""The safety screen of an explore goal: blocked, needs a person, or clear."""

from __future__ import annotations

import re
from typing import Literal

from ..messages import SafetyFinding, SafetyPolicy


def mentions(text: str, term: str) -> bool:
    """True when ``term`` occurs in ``text`` as whole words, in any case."""
    pattern = r"(?<![a-z0-9])" + r"\s+".join(
        re.escape(part) for part in term.lower().split()
    )
    return re.search(pattern + r"(?![a-z0-9])", text.lower()) is not None


def screen(
    goal: str, domain: str, policy: SafetyPolicy
) -> tuple[Literal["pass", "review", "blocked"], list[SafetyFinding]]:
    """Screen a goal and its domain against ``policy``.

    A blocked term ends the run before anything is generated; a high-impact
    domain asks for a person's review of the result unless the policy allows
    autonomy (then it is only noted).
    """
    subject = f"{goal}\n{domain}"
    blocked = [t for t in policy.blocked_terms if mentions(subject, t)]
    if blocked:
        return "blocked", [
            SafetyFinding(
                level="blocked",
                detail=f"the goal touches a blocked topic: {', '.join(blocked)}",
            )
        ]
    domains = [
        d
        for d in policy.high_impact_domains
        if d.lower() == domain.strip().lower() or mentions(goal, d)
    ]
    if not domains:
        return "pass", []
    what = ", ".join(domains)
    if policy.allow_autonomy:
        return "pass", [
            SafetyFinding(
                level="note",
                detail=f"high-impact domain ({what}); the policy allows autonomy",
            )
        ]
    return "review", [
        SafetyFinding(
            level="review",
            detail=f"high-impact domain ({what}): a person reviews the result",
        )
    ]
