"""Supplied context as evidence items that hypotheses cite by id."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..messages import EvidenceItem

_PARAGRAPH = re.compile(r"\n\s*\n")


def evidence_items(context: Sequence[str]) -> list[EvidenceItem]:
    """One item per non-blank paragraph of each context entry: ``E1``, ``E2``...

    Whitespace inside a paragraph is collapsed; empty entries give nothing.
    """
    items: list[EvidenceItem] = []
    for index, entry in enumerate(context):
        for paragraph in _PARAGRAPH.split(entry):
            text = " ".join(paragraph.split())
            if text:
                items.append(
                    EvidenceItem(
                        id=f"E{len(items) + 1}", text=text, source=f"context[{index}]"
                    )
                )
    return items


def goal_words(goal: str) -> list[str]:
    """The goal's words (letters or digits); none means nothing to explore."""
    return re.findall(r"[^\W_]+", goal)
