"""Plain-text views of runs for the terminal: event lines, plan diffs, reports.

Every function returns lines (no printing), so the CLI decides where they go
and tests can read them directly.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable
from typing import assert_never

from ._render_explore import explore_event_lines
from .messages import (
    Event,
    GateOpened,
    GateRequest,
    GateResolved,
    MilestoneReviewed,
    ModelCallFailed,
    PlanCreated,
    PlanVersion,
    ReplanApplied,
    ReplanRecord,
    ReplanRefused,
    RetryScheduled,
    RunCompacted,
    RunFinished,
    RunSubmitted,
    Task,
    TaskFinished,
    TaskInterrupted,
    TaskStarted,
    TaskStatus,
    TraceStarted,
    TraceSuspended,
    Usage,
    UsageRecorded,
)
from .messages._explore_events import ExploreEvent
from .store import ToolEffectRecord
from .supervisor import RunState

WIDTH = 88

_CONTROL = (*range(9), *range(11, 32), 127, *range(128, 160))
"""Control characters (C0 but tab and newline, DEL, C1): a terminal takes
them, and the escape sequences they start, as commands."""
_AS_TEXT = dict.fromkeys(_CONTROL, "?")
_AS_JSON = {code: f"\\u{code:04x}" for code in _CONTROL}


def terminal_text(text: str) -> str:
    """``text`` with every control character shown as ``?``.

    What a run holds comes from people (a goal), models, tools and servers:
    printed as it is, an escape sequence in it could retitle the window,
    clear the screen or hide what comes before it.
    """
    return text.translate(_AS_TEXT)


def terminal_json(text: str) -> str:
    """JSON text with the control characters JSON leaves raw (DEL, C1)
    escaped as ``\\u00XX``: the same document, safe on a terminal."""
    return text.translate(_AS_JSON)


def wrap(text: str, indent: str, *, hang: str = "") -> list[str]:
    """``text`` wrapped to :data:`WIDTH` columns and indented.

    ``hang`` starts the first line (``"finding: "``); the lines after it are
    indented to line up with the text.
    """
    first = indent + hang
    return textwrap.wrap(
        " ".join(text.split()),
        WIDTH,
        initial_indent=first,
        subsequent_indent=" " * len(first) if hang else indent,
        break_on_hyphens=False,
    ) or [first.rstrip()]


def short_gate_id(gate_id: str, run_id: str) -> str:
    """Gate ids start with the run id; the rest is enough within one run."""
    return gate_id.removeprefix(f"{run_id}-")


def task_lines(
    task: Task, indent: str = "", mark: str = "", *, status: bool = False
) -> list[str]:
    """``t2  Extract ... (after t1) [milestone]``, optionally with its status."""
    notes = [task.description]
    if task.depends_on:
        notes.append(f"(after {', '.join(task.depends_on)})")
    if task.milestone:
        notes.append("[milestone]")
    if task.requires_approval:
        notes.append("[needs approval]")
    hang = f"{mark}{task.id:<4}"
    if status:
        hang += f"{task.status.value:<12}"
    return wrap(" ".join(notes), indent, hang=hang)


def version_lines(version: PlanVersion, indent: str = "  ") -> list[str]:
    """A plan version and its diff: ``-`` removed, ``+`` added, ``=`` preserved."""
    if version.trigger is None:
        title = f"v{version.version}  first plan"
        if version.version > 1:
            title = f"v{version.version}  synthesis plan (hybrid boundary)"
    else:
        title = f"v{version.version}  {version.trigger.value}"
    if version.approved_by:
        title += f", approved by {version.approved_by}"
    if version.rejected_reason:
        title += f", not applied: {version.rejected_reason}"
    lines = [indent + title]
    inner = indent + "    "
    if version.reason:
        lines.extend(wrap(version.reason, inner))
    before = {t.id: t for t in version.tasks_before}
    after = {t.id: t for t in version.tasks_after}
    for mark, ids, tasks in (
        ("- ", version.removed, before),
        ("+ ", version.added, after),
        ("= ", version.preserved, after),
    ):
        for task_id in ids:
            lines.extend(task_lines(tasks[task_id], inner, mark))
    return lines


def replan_lines(records: Iterable[ReplanRecord], indent: str = "  ") -> list[str]:
    """Every replan decision with its outcome; refused proposals with their diff."""
    lines: list[str] = []
    for n, record in enumerate(records, start=1):
        trigger = record.trigger.value if record.trigger else "no trigger"
        head = f"{indent}{n}. {record.outcome.value}  {trigger}"
        head += f"  confidence {record.confidence:g}"
        if record.version is not None:
            head += f"  -> v{record.version}"
        lines.append(head)
        lines.extend(wrap(record.reason, indent + "   "))
        if record.version is None and record.proposed is not None:
            lines.append(f"{indent}   proposed:")
            lines.extend(version_lines(record.proposed, indent + "   "))
    return lines


def usage_lines(usage: Usage, indent: str = "  ") -> list[str]:
    """Model calls and tokens by role, with a total row."""
    lines = [f"{indent}{'role':<10}{'calls':>7}{'input':>9}{'output':>9}"]
    rows = [*sorted(usage.by_role.items()), ("total", usage.total)]
    lines.extend(
        f"{indent}{role:<10}{u.calls:>7}{u.input_tokens:>9}{u.output_tokens:>9}"
        for role, u in rows
    )
    return lines


def gate_lines(
    request: GateRequest, indent: str = "  ", *, full_id: bool = False
) -> list[str]:
    """What a gate asks, with the proposed diff of a replan gate.

    ``full_id`` names the gate as ``replan approve`` takes it (``RUN_ID-g1``),
    not only within its run (``g1``).
    """
    gate = (
        request.gate_id if full_id else short_gate_id(request.gate_id, request.run_id)
    )
    subject = f" for task {request.task_id}" if request.task_id else ""
    lines = [f"{indent}gate {gate} opened{subject}: waiting for a decision"]
    lines.extend(wrap(request.reason, indent + "    "))
    if request.tool_call is not None:
        call = request.tool_call
        lines.extend(
            wrap(f"{call.name}({call.arguments})", indent + "    ", hang="call: ")
        )
    if request.proposal is not None:
        lines.append(f"{indent}    proposed change:")
        lines.extend(version_lines(request.proposal, indent + "    "))
    if request.hypotheses is not None:
        # What an explore review asks a person to approve.
        lines.append(f"{indent}    selection under review:")
        for h in request.hypotheses:
            lines.extend(wrap(h.statement, indent + "    ", hang=f"{h.id:<5}"))
    return lines


def event_lines(
    event: Event, state: RunState, *, full_gate_ids: bool = False
) -> list[str]:
    """One progress entry for ``event``; ``state`` is the run just after it.

    Bookkeeping events (usage, trace suspensions) render as no lines. Gates
    are named by their full ids with ``full_gate_ids`` (``replan watch``,
    where they are answered by another command).
    """
    match event:
        case RunSubmitted(run_id=run_id, spec=spec):
            return [
                f"run {run_id} submitted "
                f"({spec.pattern if spec.kind == 'plan' else spec.kind})",
                *wrap(spec.goal, "    "),
            ]
        case PlanCreated(version=version, boundary=boundary):
            what = "synthesis plan" if boundary else "plan"
            lines = [f"{what} v{version.version}: {len(version.added)} tasks"]
            after = {t.id: t for t in version.tasks_after}
            for task_id in version.added:
                lines.extend(task_lines(after[task_id], "    "))
            return lines
        case TaskStarted(task_id=task_id, attempt=attempt):
            task = state.tasks[task_id]
            retry = f" (attempt {attempt})" if attempt > 1 else ""
            return [f"task {task_id} started{retry}: {task.description}"]
        case TaskFinished(task_id=task_id, outcome=outcome):
            if outcome.success:
                lines = [f"task {task_id} completed"]
                lines.extend(wrap(outcome.summary, "    "))
                for finding in outcome.findings:
                    lines.extend(wrap(finding, "    ", hang="finding: "))
                return lines
            status = state.tasks[task_id].status
            then = "will retry" if status is TaskStatus.PENDING else status.value
            return [f"task {task_id} failed ({then}): {outcome.reason or 'no reason'}"]
        case RetryScheduled(task_id=task_id, retry_at=retry_at):
            wait = (retry_at - event.at).total_seconds()
            shown = f"{wait:.3g}" if wait < 100 else f"{wait:.0f}"
            return [f"task {task_id} will retry in {shown}s"]
        case TaskInterrupted(task_id=task_id, reason=reason):
            return [f"task {task_id} interrupted: {reason}; it will run again"]
        case MilestoneReviewed(index=index, verdict=verdict, by=by):
            if by == "error":
                head = f"milestone {index} not reviewed: {verdict.decision}"
            else:
                head = f"milestone {index} reviewed by the {by}: {verdict.decision}"
            if verdict.decision == "replan":
                trigger = verdict.trigger.value if verdict.trigger else "no trigger"
                head += (
                    f" ({trigger}, confidence {verdict.confidence:g}, "
                    f"{verdict.corroborating_sources} sources)"
                )
            return (
                [head, *wrap(verdict.rationale, "    ")]
                if verdict.rationale
                else [head]
            )
        case ReplanRefused(record=record):
            trigger = record.trigger.value if record.trigger else "no trigger"
            head = f"replan {record.outcome.value} ({trigger})"
            return [head, *wrap(record.reason, "    ")]
        case ReplanApplied(record=record, version=version):
            trigger = record.trigger.value if record.trigger else "no trigger"
            approved = version.approved_by
            return [
                f"replan applied ({trigger}): plan v{version.version}, "
                f"{len(version.removed)} removed, {len(version.added)} added, "
                f"{len(version.preserved)} preserved"
                + (f", approved by {approved}" if approved else "")
            ]
        case GateOpened(request=request):
            return gate_lines(request, "", full_id=full_gate_ids)
        case GateResolved(gate_id=gate_id, resolution=resolution):
            gate = gate_id if full_gate_ids else short_gate_id(gate_id, state.run_id)
            note = f" ({resolution.note})" if resolution.note else ""
            return [
                f"gate {gate} resolved: {resolution.decision} by {resolution.by}{note}"
            ]
        case UsageRecorded() | TraceStarted() | TraceSuspended():
            return []
        case ModelCallFailed(failure=failure):
            where = f" for task {failure.task_id}" if failure.task_id else ""
            head = (
                f"model call failed ({failure.role}/{failure.purpose}{where}): "
                f"{failure.error_type}"
            )
            return [head, *wrap(failure.message, "    ")]
        case RunFinished(status=status, stop_reason=reason):
            return [
                f"run finished: {status.value}" + (f" ({reason})" if reason else "")
            ]
        case ExploreEvent():
            return explore_event_lines(event, state)
        case RunCompacted(result=result, events=count):
            reason = f" ({result.stop_reason})" if result.stop_reason else ""
            return [
                f"run finished: {result.status.value}{reason}",
                f"    (its {count} events were compacted into this snapshot)",
            ]
        case _:
            assert_never(event)


def outcome_lines(state: RunState) -> list[str]:
    """Plan versions with diffs, replan decisions, output and usage."""
    result = state.result()
    lines = ["plan versions"]
    for version in result.versions:
        lines.extend(version_lines(version))
    if result.replans:
        lines += ["", "replans"]
        lines.extend(replan_lines(result.replans))
    lines += ["", "output"]
    lines.extend(wrap(result.output, "  ") if result.output else ["  (none)"])
    for source in state.sources:
        lines.extend(wrap(source, "  ", hang="- "))
    lines += ["", "usage by role"]
    lines.extend(usage_lines(result.usage))
    return lines


def side_effect_lines(records: Iterable[ToolEffectRecord]) -> list[str]:
    """The side-effect tool calls a run made: task, tool, arguments, key and
    what the tool returned (or that it never returned)."""
    lines = ["side effects"]
    for record in records:
        call = f"{record.tool} {json.dumps(record.arguments, ensure_ascii=False)}"
        lines.extend(wrap(call, "  ", hang=f"{record.task_id:<4}"))
        lines.append(f"      key {record.key}")
        if record.content is None:
            lines.append("      (no result recorded: it may have acted)")
        else:
            lines.extend(wrap(record.content, "      ", hang="-> "))
    return lines


def run_report(
    state: RunState, side_effects: Iterable[ToolEffectRecord] = ()
) -> list[str]:
    """Everything ``replan show`` prints about a run; its open gates by the
    full ids ``replan approve`` takes."""
    result = state.result()
    lines = [
        f"run      {result.run_id}",
        f"status   {result.status.value}",
        *_labelled("goal", result.goal),
        "kind     explore"
        if state.spec.kind == "explore"
        else f"pattern  {result.pattern}",
    ]
    if result.stop_reason:
        lines.append(f"stopped  {result.stop_reason}")
    explore = state.spec.kind == "explore"
    if not explore:  # an explore run has hypotheses, not tasks
        lines += ["", "tasks"]
        for task in result.tasks:
            lines.extend(task_lines(task, "  ", status=True))
    for info in state.open_gates:
        lines += ["", *gate_lines(info.request, "", full_id=True)]
    effects = list(side_effects)
    if effects:
        lines += ["", *side_effect_lines(effects)]
    lines.append("")
    if result.brief is not None:
        from ._render_explore import brief_lines

        return [*lines, *brief_lines(result.brief)]
    if explore:  # no brief yet, nor plan versions to show
        return [*lines, "usage by role", *usage_lines(result.usage)]
    lines.extend(outcome_lines(state))
    return lines


def _labelled(label: str, text: str) -> list[str]:
    return wrap(text, "", hang=f"{label:<9}")
