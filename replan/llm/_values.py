"""Context values as prompt text: what a template's ``{{name}}`` becomes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ..messages import (
    Critique,
    EvidenceItem,
    PlanProposal,
    Task,
    TaskDraft,
    TaskOutcome,
    Trigger,
    Verdict,
)


def render_value(value: Any) -> str:
    """A context value as prompt text; ``(none)`` for nothing."""
    if value is None or (isinstance(value, str | list | dict) and not value):
        return "(none)"
    match value:
        case str():
            return value
        case bool() | int() | float():
            return str(value)
        case Trigger():
            return value.value
        case Task():
            return "\n".join(_task_lines(value))
        case TaskOutcome():
            return "\n".join(_outcome_lines(value, ""))
        case Verdict():
            return _verdict_text(value)
        case PlanProposal():
            return _proposal_text(value)
        case list():
            return list_text(value).text()
        case dict() if all(isinstance(v, TaskOutcome | None) for v in value.values()):
            lines: list[str] = []
            for key, outcome in value.items():
                lines.append(f"{key}:")
                lines.extend(
                    _outcome_lines(outcome, "  ") if outcome else ["  (no result)"]
                )
            return "\n".join(lines)
        case BaseModel():
            return value.model_dump_json(exclude={"kind"})
        case _:
            return _json(value)


def _json(value: Any) -> str:
    """``value`` as JSON text; a model inside it as its fields (not as its
    Python ``repr``), anything else JSON cannot hold as its ``str``."""
    return json.dumps(value, default=_plain, ensure_ascii=False)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude={"kind"})
    return str(value)


@dataclass(frozen=True, slots=True)
class ListText:
    """A list as prompt text, one rendered entry per item, oldest first.

    The whole list reads ``opening + separator.join(entries) + closing``
    (what :func:`render_value` gives); the entries from ``start`` on read
    the same way, so a list can be shortened without rendering it again.
    """

    entries: tuple[str, ...]
    separator: str = "\n"
    opening: str = ""
    closing: str = ""

    def text(self, start: int = 0) -> str:
        """The entries from ``start`` on, opened and closed."""
        return self.opening + self.separator.join(self.entries[start:]) + self.closing


def list_text(value: list[Any]) -> ListText:
    """``value`` as :class:`ListText`: tasks with their results, drafts
    numbered from 1, critiques, evidence items and strings as bullets, other
    models (hypotheses, reviews) as one JSON object a line, anything else as
    the items of a JSON array."""
    if all(isinstance(v, Task) for v in value):
        return ListText(tuple("\n".join(_task_lines(t)) for t in value))
    if all(isinstance(v, TaskDraft) for v in value):
        return ListText(tuple(_draft_line(n, d) for n, d in enumerate(value, start=1)))
    if all(isinstance(v, Critique) for v in value):
        return ListText(tuple(_critique_text(c) for c in value))
    if all(isinstance(v, EvidenceItem) for v in value):
        return ListText(tuple(f"- {e.id}: {' '.join(e.text.split())}" for e in value))
    if all(isinstance(v, str) for v in value):
        return ListText(tuple(f"- {' '.join(v.split())}" for v in value))
    if all(isinstance(v, BaseModel) for v in value):
        return ListText(tuple(v.model_dump_json(exclude={"kind"}) for v in value))
    return ListText(tuple(_json(v) for v in value), ", ", "[", "]")


def _task_lines(task: Task) -> list[str]:
    head = f"{task.id} [{task.status.value}] {task.description}"
    if task.depends_on:
        head += f" (after {', '.join(task.depends_on)})"
    if task.milestone:
        head += " [milestone]"
    lines = [head]
    if task.result is not None:
        lines.extend(_outcome_lines(task.result, "    "))
    return lines


def _outcome_lines(outcome: TaskOutcome, indent: str) -> list[str]:
    if not outcome.success:
        return [f"{indent}failed: {outcome.reason or 'no reason given'}"]
    lines = [f"{indent}result: {outcome.summary or '(empty)'}"]
    lines.extend(f"{indent}finding: {f}" for f in outcome.findings)
    return lines


def _draft_line(n: int, draft: TaskDraft) -> str:
    line = f"{n}. {draft.key}: {draft.description}"
    if draft.depends_on:
        line += f" (after {', '.join(draft.depends_on)})"
    if draft.requires_approval:
        line += " [side effect]"
    return line


def _proposal_text(proposal: PlanProposal) -> str:
    lines = [f"rationale: {proposal.rationale or '(none)'}"]
    if not proposal.achievable:
        lines.append("achievable: no")
    lines.append("tasks:")
    lines.extend(
        "  " + _draft_line(n, d) for n, d in enumerate(proposal.tasks, start=1)
    )
    return "\n".join(lines)


def _verdict_text(verdict: Verdict) -> str:
    lines = [f"decision: {verdict.decision}"]
    if verdict.trigger is not None:
        lines.append(f"trigger: {verdict.trigger.value}")
    lines.append(f"confidence: {verdict.confidence:g}")
    lines.append(f"corroborating sources: {verdict.corroborating_sources}")
    if verdict.affected_tasks:
        lines.append(f"affected tasks: {', '.join(verdict.affected_tasks)}")
    if verdict.rationale:
        lines.append(f"rationale: {verdict.rationale}")
    return "\n".join(lines)


def _critique_text(critique: Critique) -> str:
    scores = ", ".join(f"{k} {v:g}" for k, v in sorted(critique.scores.items()))
    return f"- scores: {scores or '(none)'}; critique: {critique.critique}"
