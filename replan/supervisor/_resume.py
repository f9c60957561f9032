"""Resuming a run from its journal after a restart or a crash.

A run's journal says where it stood; the effect ledger says which task
attempts had finished without the journal hearing of it. A resumed run:

* journals the ledger's finished attempts instead of running them again;
* restarts the attempts that were cut short (``task_interrupted``, then a
  new ``task_started``): they had not returned, so nothing was recorded;
* lists its open gates again, so a person can still answer them (not a
  tool call's: its attempt runs again; a side-effect call that had run
  gets its result from the tool effect ledger, and one a person had
  answered but that had not started takes the journaled answer, instead
  of a new gate; so does one whose answer was sent from elsewhere while
  the run's driver was dead, journaled as the run is taken over);
* picks up a milestone review the stop interrupted: the replan flow after
  the verdict (from its gate, if one was open or answered), or the review
  itself if one was due and not yet held.

Completed tasks are never run again, and the plan is not made again. An
explore run replays its journal instead (see ``_explore``): its flow takes
the journaled steps' outcomes and waits again at a review gate left open.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from anyio.abc import TaskGroup

from ..messages import (
    Event,
    GateInfo,
    GateOpened,
    GateResolution,
    MilestoneReviewed,
    ReplanApplied,
    ReplanRefused,
    RunStatus,
    TaskInterrupted,
    TaskStarted,
    TaskStatus,
    Verdict,
)
from ..store import EffectRecord
from ._decide import contract_rules, milestone_due
from ._gates import Validator
from ._run import RunEnded, approval_check

if TYPE_CHECKING:
    from ._run import RunDriver


Withdrawal = Callable[[str, str, GateResolution], Awaitable[GateResolution]]
"""``(run_id, gate_id, withdrawal)``: the answer that stands for the gate."""


@dataclass(frozen=True, slots=True)
class Recovery:
    """What a resumed run needs to pick up where its journal left off."""

    events: Sequence[Event]
    """The run's whole journal at the time of the resume."""
    effects: Sequence[EffectRecord]
    """The ledger's finished attempts for the run."""
    answers: Mapping[str, GateResolution] = field(default_factory=dict)
    """Answers sent from elsewhere to the run's open gates, by gate id,
    that wait for the run's driver (see ``_forwarding``): each is taken as
    its gate is listed again (a tool call's gate's is journaled in place of
    the withdrawal)."""
    withdrawal: Withdrawal | None = None
    """Keeps a withdrawal as a tool call gate's one answer among those
    sent from elsewhere, or gives the one sent first (see
    ``Forwarding.withdrawal``); None where no answers are sent on."""

    def list_gates(self, run: RunDriver) -> None:
        """List the run's open gates again, before the run is driven on, so a
        person can answer them as soon as the resume returns; a gate with an
        answer sent from elsewhere takes it first."""
        from ._explore import review_check
        from ._replanning import gate_check

        explore = run.state.spec.kind == "explore"
        for gate in run.state.open_gates:
            request = gate.request
            if request.tool_call is not None:
                continue  # its attempt was cut short: withdrawn as the run goes on
            check: Validator
            if request.task_id:
                check = approval_check
            elif explore:
                check = review_check
            else:
                check = gate_check(run, request)
            run.gates.open(request, check, self.answers.get(request.gate_id))

    async def __call__(self, run: RunDriver, tg: TaskGroup) -> None:
        await _withdraw_tool_gates(run, self.answers, self.withdrawal)
        run.unpicked = ()  # taken up here
        await _recover_attempts(run, tg, self.effects)
        _reopen_approvals(run, tg)
        flow = interrupted_review(self.events, run)
        if flow is not None:
            await _finish_review(run, *flow)
        state = run.state
        if any(milestone_due(state, task_id) for task_id in state.window):
            from ._replanning import review

            await review(run)


async def _recover_attempts(
    run: RunDriver, tg: TaskGroup, effects: Sequence[EffectRecord]
) -> None:
    state = run.state
    finished = {(e.task_id, e.attempt): e for e in effects}
    cut_short = []
    for task in state.with_status(TaskStatus.IN_PROGRESS):
        record = finished.get((task.id, task.attempts))
        if record is not None:
            run.recovered(record)
        else:
            cut_short.append(task)
    if not cut_short:
        return
    run.check_budget()
    room = run.limits.max_task_executions - state.task_executions
    again = cut_short[: max(room, 0)]
    state = await run.record_events(
        *((TaskInterrupted, {"task_id": t.id}) for t in cut_short),
        # The interrupted attempt does not count: the new one reuses its number.
        *((TaskStarted, {"task_id": t.id, "attempt": t.attempts}) for t in again),
    )
    for task in again:
        await run.restart(state.tasks[task.id])


async def _withdraw_tool_gates(
    run: RunDriver,
    answers: Mapping[str, GateResolution],
    withdrawal: Withdrawal | None,
) -> None:
    """Close the gates of tool calls whose attempts the stop cut short.

    No attempt waits for their answers any more; one that runs again asks
    again, at a gate of its own. A person's answer sent to such a gate from
    elsewhere before the withdrawal (``answers``, or one ``withdrawal``
    finds sent since they were read) is journaled instead: it stands, as
    one journaled before the stop does, and the attempt run again takes it
    for the same call instead of asking again.
    """
    for gate in run.state.open_gates:
        if gate.request.tool_call is None:
            continue
        withdrawn = GateResolution(
            decision="reject",
            by="supervisor",
            note="the attempt that asked was interrupted; "
            "an attempt that runs again asks again",
        )
        answer = answers.get(gate.request.gate_id)
        if answer is None and withdrawal is not None:
            answer = await withdrawal(run.state.run_id, gate.request.gate_id, withdrawn)
        if answer is not None:
            try:
                approval_check(answer)
            except ValueError:
                answer = None  # refused, as its driver would: withdrawn
        await run.resolve_gate(gate.request, answer or withdrawn)


def _reopen_approvals(run: RunDriver, tg: TaskGroup) -> None:
    for gate in run.state.open_gates:
        if gate.request.task_id is not None:
            run.reopen_approval(tg, gate.request)


def interrupted_review(
    events: Sequence[Event], run: RunDriver
) -> tuple[Verdict, GateInfo | None] | None:
    """The last review's verdict if the stop cut its consequences short.

    Returns the verdict and the gate the flow had opened (with its answer if
    one was journaled), or None when the verdict was fully acted on.
    """
    last = None
    for index in range(len(events) - 1, -1, -1):
        if isinstance(events[index], MilestoneReviewed):
            last = index
            break
    if last is None:
        return None
    reviewed = events[last]
    assert isinstance(reviewed, MilestoneReviewed)
    verdict = reviewed.verdict
    if verdict.decision not in ("replan", "abort"):
        return None
    gate: GateInfo | None = None
    for event in events[last + 1 :]:
        if isinstance(event, ReplanRefused | ReplanApplied):
            return None
        if isinstance(event, GateOpened) and event.request.task_id is None:
            gate = run.state.gates[event.request.gate_id]
    if gate is not None and gate.request.proposal is None:
        # A validation gate: an approval lets the fixed plan go on.
        answer: GateResolution | None = gate.resolution
        if answer is not None and answer.decision == "approve":
            return None
    return verdict, gate


async def _finish_review(
    run: RunDriver, verdict: Verdict, gate: GateInfo | None
) -> None:
    from ._replanning import replan, validation_gate

    if verdict.decision == "abort":
        raise RunEnded(
            RunStatus.ABORTED, verdict.rationale or "the reviewer aborted the run"
        )
    if contract_rules(run.state) and (gate is None or gate.request.proposal is None):
        await validation_gate(run, verdict, gate)
    else:
        await replan(run, verdict, gate)
