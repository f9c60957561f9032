"""The safety screen of an explore goal: blocked, needs a person, or clear."""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

from ..messages import SafetyFinding, SafetyPolicy
from ..messages._explore import TERM_JOINERS


def _in_word(char: str) -> bool:
    """A letter, digit or combining mark of any script (part of a word)."""
    return char.isalnum() or unicodedata.category(char).startswith("M")


def _folded(text: str) -> str:
    """``text`` as terms are matched in: one form for what reads the same.

    Compatibility-normalized (NFKC: a decomposed ``i`` and accent is the
    ``í`` of the term, fullwidth letters are the letters), case-folded,
    and without the invisible format characters (a zero-width space or a
    soft hyphen inside a word) that would split a word no reader sees split.
    """
    folded = unicodedata.normalize(
        "NFKC", unicodedata.normalize("NFKC", text).casefold()
    )
    if folded.isascii():
        return folded
    return "".join(c for c in folded if unicodedata.category(c) != "Cf")


def _term_words(term: str) -> list[str]:
    """The folded words of ``term``, split on spaces and joiners."""
    return [part for part in TERM_JOINERS.split(_folded(term)) if part]


def mentions(text: str, term: str) -> bool:
    """True when ``term`` occurs in ``text`` as whole words, in any case.

    Words are those of any script; a multi-word term matches its words joined
    by spaces, hyphens, underscores or slashes, and no match starts or ends
    inside a word (``вирус`` is not in ``антивирус``). No stemming: ``exploit``
    is not in ``exploiters``. Text and term are compared as :func:`_folded`
    makes them, so the same word typed another way (decomposed accents,
    fullwidth letters, a zero-width space inside it) still matches.
    """
    parts = _term_words(term)
    if not parts:
        return False
    folded = _folded(text)
    pattern = re.compile(TERM_JOINERS.pattern.join(re.escape(part) for part in parts))
    # Only a word-like edge of the term needs a boundary: ``c++`` ends in
    # ``+``, which no following letter extends.
    open_start, open_end = _in_word(parts[0][0]), _in_word(parts[-1][-1])
    match = pattern.search(folded)
    while match is not None:
        start, end = match.span()
        inside = (open_start and start > 0 and _in_word(folded[start - 1])) or (
            open_end and end < len(folded) and _in_word(folded[end])
        )
        if not inside:
            return True
        # Matches may overlap (``xab ab ab`` has ``ab ab`` at 4): look on from
        # the next character, not from the end of the one refused.
        match = pattern.search(folded, start + 1)
    return False


def screen(
    goal: str, domain: str, policy: SafetyPolicy
) -> tuple[Literal["pass", "review", "blocked"], list[SafetyFinding]]:
    """Screen a goal and its domain against ``policy``.

    A blocked term ends the run before anything is generated; a high-impact
    domain asks for a person's review of the result unless the policy allows
    autonomy (then it is only noted).
    """
    # Each on its own: joined, a phrase could match across the two (a goal
    # ending in "nerve", a domain starting with "agent").
    blocked = [
        t for t in policy.blocked_terms if mentions(goal, t) or mentions(domain, t)
    ]
    if blocked:
        return "blocked", [
            SafetyFinding(
                level="blocked",
                detail=f"the goal touches a blocked topic: {', '.join(blocked)}",
            )
        ]
    # A domain label names its field among other words as a goal does
    # ("clinical trials", "medical devices"): matched the same way.
    domains = [
        d
        for d in policy.high_impact_domains
        if mentions(domain, d) or mentions(goal, d)
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
