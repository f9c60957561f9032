"""Milestone reviews and the replan flow: guards, proposals, drift, gates.

Each step records its outcome in the journal; a refused replan is a normal
outcome (the run goes on with its plan), never an exception.

A role that gives no usable answer (:class:`Unanswered`) does not throw the
run away where it can go on without the answer: a milestone review whose
reviewer fails continues, a replan whose planner, critic or ranker fails is
refused (``refused_error``), and a failed evolver leaves the tournament's
winner as it is. The first plan and the boundary have nothing to go on with:
their planner's failure ends the run ``failed``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, Literal

from ..messages import (
    AlignmentReply,
    AlignmentRequest,
    CritiqueReply,
    CritiqueRequest,
    EvolveReply,
    EvolveRequest,
    GateInfo,
    GateRequest,
    GateResolution,
    MilestoneReviewed,
    PlanProposal,
    PlanVersion,
    RankReply,
    RankRequest,
    ReplanApplied,
    ReplanOutcome,
    ReplanRecord,
    ReplanRefused,
    ReviewReply,
    ReviewRequest,
    RunStatus,
    Task,
    TaskStatus,
    Verdict,
    check_drafts,
)
from ..messages._gate import POLICY_TIMEOUT
from ._decide import (
    contract_rules,
    drifted,
    guard_replan,
    heuristic_verdict,
    unanswered_verdict,
    under_contract,
)
from ._gates import Validator
from ._run import RunEnded, Unanswered
from ._versions import build_version, drafts_of

if TYPE_CHECKING:
    from ._run import RunDriver

logger = logging.getLogger("replan.supervisor")

PLAN_ASKS = 2
"""How often the planner is asked for a plan that is no valid plan (a cycle,
a key used twice, a dependency on nothing): once more, with the problem named
in the request's context as ``plan_problem``."""


async def first_plan(run: RunDriver) -> None:
    """Version 1: the spec's fixed tasks, or the planner's plan."""
    spec = run.state.spec
    if spec.tasks is not None:
        # Checked when the spec was built: a valid plan on an empty run.
        version = run.plan_version(
            spec.tasks, "the task list given with the run", boundary=False
        )
        run.create_plan(version, boundary=False)
        return
    await _planned(run, "plan", run.base_context())


async def boundary(run: RunDriver) -> None:
    """The hybrid boundary: collected results become the synthesis tasks."""
    context = run.base_context()
    context.update(completed=run.completed_context(), findings=run.state.findings())
    await _planned(run, "boundary", context)


async def _planned(
    run: RunDriver, purpose: Literal["plan", "boundary"], context: dict[str, Any]
) -> None:
    """Ask the planner for the first plan or the boundary's, and install it.

    An invalid plan is asked for once more (see :data:`PLAN_ASKS`); a second
    one ends the run ``failed``. So does a first plan without tasks: the goal
    is achievable, the planner said, yet it planned nothing. (A boundary
    without tasks is valid: the collection results are synthesized as they
    are.)
    """
    at_boundary = purpose == "boundary"
    problem = ""
    for _ in range(PLAN_ASKS):
        if problem:
            context = {**context, "plan_problem": problem}
        proposal = (await run.plan_proposal(purpose, context)).proposals[0]
        if not proposal.achievable:
            raise RunEnded(
                RunStatus.ABORTED,
                "the planner found the goal unachievable"
                + (" at the boundary" if at_boundary else "")
                + f": {proposal.rationale}",
            )
        try:
            if not proposal.tasks and not at_boundary:
                raise ValueError("the planner proposed no tasks")
            version = run.plan_version(
                proposal.tasks, proposal.rationale, boundary=at_boundary
            )
        except ValueError as exc:
            problem = str(exc)
            continue
        run.create_plan(version, boundary=at_boundary)
        return
    which = "boundary" if at_boundary else "first"
    raise RunEnded(RunStatus.FAILED, f"the {which} plan is invalid: {problem}")


async def review(run: RunDriver) -> None:
    """A milestone: cheap checks, then the reviewer; act on the verdict."""
    state = run.state
    verdict = heuristic_verdict(state)
    by = "heuristic"
    if verdict is None:
        # max_iterations bounds the reviews the reviewer is asked (failed
        # ones too): what the cheap checks decide is no review cycle.
        if state.reviews >= state.spec.limits.max_iterations:
            raise RunEnded(
                RunStatus.LIMIT_REACHED,
                f"max_iterations: {state.reviews} milestone reviews held",
            )
        context = run.base_context()
        context.update(
            completed=run.completed_context(),
            pending=state.with_status(TaskStatus.PENDING),
            findings=state.findings(),
            milestone_index=state.iterations + 1,
        )
        try:
            reply = await run.ask(
                run.roles.reviewer, ReviewRequest(context=context), ReviewReply
            )
        except Unanswered as failed:
            # Its failure is staged: journaled with the review below.
            verdict, by = unanswered_verdict(failed.reason), "error"
        else:
            verdict, by = reply.verdict, "model"
    if contract_rules(state):
        ruled = under_contract(verdict)
        if ruled != verdict:
            verdict, by = ruled, "policy"
    reviewed = (
        MilestoneReviewed,
        {"index": state.iterations + 1, "verdict": verdict, "by": by},
    )
    if verdict.decision == "replan":
        # The replan flow waits on models and people: journal it first.
        await run.record_events(reviewed)
    else:
        # Acted on at once, with no wait in between: journaled in the same
        # append as what follows (the next starts, or the run's end).
        run.stage(reviewed)
    match verdict.decision:
        case "continue" | "complete":
            return
        case "abort":
            raise RunEnded(
                RunStatus.ABORTED, verdict.rationale or "the reviewer aborted the run"
            )
        case "replan":
            if contract_rules(state):
                await validation_gate(run, verdict)
            else:
                await replan(run, verdict)


async def validation_gate(
    run: RunDriver, verdict: Verdict, resumed: GateInfo | None = None
) -> None:
    """A fixed plan cannot replan: a person decides to go on or to stop.

    ``resumed``: the gate as the journal left it when the run stopped.
    """
    if resumed is not None:
        resolution = resumed.resolution or await run.await_gate(
            resumed.request, _no_edit, reopen=True
        )
    else:
        request = run.gate_request(
            "the plan's assumptions may no longer hold"
            + (f" ({verdict.trigger.value})" if verdict.trigger else "")
            + f": {verdict.rationale.rstrip(' .')}. Approve to continue the "
            "fixed plan, reject to stop with the results so far.",
            trigger=verdict.trigger,
        )
        resolution = await run.await_gate(request, _no_edit)
    if resolution.decision == "reject":
        raise RunEnded(
            RunStatus.ABORTED,
            f"stopped at the validation gate by {resolution.by}"
            + (f": {resolution.note}" if resolution.note else ""),
        )


def _no_edit(resolution: GateResolution) -> None:
    if resolution.decision == "edit":
        raise ValueError("a fixed plan cannot be edited: approve or reject")


async def replan(
    run: RunDriver, verdict: Verdict, resumed: GateInfo | None = None
) -> None:
    """One replan decision, applied or refused, in its own ``replan`` span.

    ``resumed``: the replan's gate as the journal left it when the run
    stopped; the flow picks up there.
    """
    with run.trace.replanning(verdict):
        await _replan(run, verdict, resumed)


async def _replan(run: RunDriver, verdict: Verdict, resumed: GateInfo | None) -> None:
    """Guards, proposal (K candidates ranked and evolved), drift, gate, apply."""
    if resumed is not None and resumed.request.proposal is not None:
        gated = resumed.request.proposal
        proposal = PlanProposal(tasks=drafts_of(gated), rationale=gated.reason)
        await _after_proposal(run, verdict, proposal, gated, resumed)
        return
    refusal = guard_replan(run.view, verdict, used=run.meter.used)
    if refusal is not None:
        await _refuse(run, verdict, *refusal)
        return
    try:
        await _proposed(run, verdict)
    except Unanswered as failed:
        # The failure's events are staged: journaled with the refusal.
        await _refuse(run, verdict, ReplanOutcome.REFUSED_ERROR, failed.reason)


async def _proposed(run: RunDriver, verdict: Verdict) -> None:
    """The proposal past the guards: asked, checked for drift, gated, applied.

    Raises:
        Unanswered: a role the proposal needs gave no usable answer.
    """
    proposal = await _propose(run, verdict)
    asked = 1
    while True:
        if not proposal.achievable:
            await _refuse(
                run, verdict, ReplanOutcome.ABORTED_INFEASIBLE, proposal.rationale
            )
            raise RunEnded(
                RunStatus.ABORTED,
                f"the planner found the goal unachievable: {proposal.rationale}",
            )
        built_on = run.state.tasks
        try:
            version = _version(run, proposal, verdict)
            break
        except ValueError as exc:
            if asked == PLAN_ASKS:
                reason = f"invalid proposal: {exc}"
                await _refuse(run, verdict, ReplanOutcome.REFUSED_INVALID, reason)
                return
            problem = str(exc)
        asked += 1
        proposal = await _propose(run, verdict, problem)
    if proposal.tasks:
        context = run.base_context()
        context["proposed"] = proposal.tasks
        try:
            reply = await run.ask(
                run.roles.ranker, AlignmentRequest(context=context), AlignmentReply
            )
        except Unanswered as failed:
            # Unchecked for drift, the change is not made; it is kept with
            # the refusal, as a drifting one is.
            await _refuse(
                run,
                verdict,
                ReplanOutcome.REFUSED_ERROR,
                failed.reason,
                proposed=version,
            )
            return
        drift = drifted(reply.alignment, len(proposal.tasks))
        if drift is not None:
            await _refuse(
                run, verdict, ReplanOutcome.REFUSED_DRIFT, drift, proposed=version
            )
            return
    await _after_proposal(run, verdict, proposal, version, None, built_on)


async def _after_proposal(
    run: RunDriver,
    verdict: Verdict,
    proposal: PlanProposal,
    version: PlanVersion,
    resumed: GateInfo | None,
    built_on: Mapping[str, Task] | None = None,
) -> None:
    """The gate (when the trigger needs one), then apply the plan.

    ``built_on``: the tasks ``version`` was built against, if known; when
    they are still the run's tasks, the version stands as built.
    """
    approved_by: str | None = None
    if resumed is not None or verdict.trigger in run.state.spec.gate_policy.gate_on:
        resolution = await _gate_replan(run, verdict, version, resumed)
        if resolution.decision == "reject":
            reason = f"rejected by {resolution.by}" + (
                f": {resolution.note}" if resolution.note else ""
            )
            rejected = version.evolve(rejected_reason=reason)
            outcome = (
                ReplanOutcome.REJECTED_BY_POLICY
                if resolution.by == POLICY_TIMEOUT
                else ReplanOutcome.REJECTED_BY_HUMAN
            )
            await _refuse(run, verdict, outcome, reason, proposed=rejected)
            return
        if resolution.decision == "edit" and resolution.tasks is not None:
            proposal = PlanProposal(
                tasks=resolution.tasks, rationale=proposal.rationale
            )
            built_on = None
        approved_by = resolution.by
    # Approval answers may have changed pending tasks during the model calls
    # and the gate: the diff applied is the one against the plan as it is now
    # (the same one when no task changed: a task change makes a new dict).
    # Checked and applied with the journal held: an answer being journaled
    # now is in the state first, and none comes in between.
    misfit: str | None = None
    async with run.appends_held():
        if built_on is None or run.state.tasks is not built_on:
            try:
                # What the gate showed removed, at most: an attempt that failed
                # meanwhile and waits for its retry is no task the change
                # replaces.
                version = _version(run, proposal, verdict, replace_only=version.removed)
            except ValueError as exc:
                misfit = str(exc)
        if misfit is None:
            version = version.evolve(approved_by=approved_by)
            record = ReplanRecord(
                trigger=verdict.trigger,
                outcome=ReplanOutcome.APPLIED,
                reason=verdict.rationale,
                confidence=verdict.confidence,
                version=version.version,
            )
            await run.record_events(
                (ReplanApplied, {"record": record, "version": version}),
                lock_held=True,
            )
    if misfit is not None:
        reason = f"the plan no longer fits the run: {misfit}"
        await _refuse(run, verdict, ReplanOutcome.REFUSED_INVALID, reason)


def _version(
    run: RunDriver,
    proposal: PlanProposal,
    verdict: Verdict,
    replace_only: Collection[str] | None = None,
) -> PlanVersion:
    return build_version(
        run.state,
        proposal.tasks,
        trigger=verdict.trigger,
        reason=proposal.rationale or verdict.rationale,
        phase=run.state.phase,
        replace_pending=True,
        replace_only=replace_only,
    )


async def _propose(run: RunDriver, verdict: Verdict, problem: str = "") -> PlanProposal:
    """The planner's revision; with K > 1 candidates: critique, rank, evolve.

    ``problem``: why the last revision was no valid plan. The planner alone
    is asked for one that fixes it.
    """
    state = run.state
    context = run.base_context()
    context.update(
        completed=run.completed_context(),
        pending=state.with_status(TaskStatus.PENDING),
        findings=state.findings(),
        trigger=verdict.trigger,
        verdict=verdict,
    )
    k = state.spec.limits.replan_candidates
    if problem:
        context["plan_problem"] = problem
        k = 1
    proposals = (await run.plan_proposal("replan", context, candidates=k)).proposals
    if k == 1 or len(proposals) == 1:
        return proposals[0]
    critiques = await run.ask(
        run.roles.reviewer,
        CritiqueRequest(candidates=proposals, context=context),
        CritiqueReply,
    )
    ranking = await run.ask(
        run.roles.ranker, RankRequest(candidates=proposals, context=context), RankReply
    )
    best = ranking.order[0]
    try:
        evolved = await run.ask(
            run.roles.evolver,
            EvolveRequest(
                candidate=proposals[best],
                critiques=[critiques.critiques[best]],
                context=context,
            ),
            EvolveReply,
        )
    except Unanswered as failed:
        # The evolver only refines the winner, which is a plan the planner
        # proposed and the ranker chose: it stands, and goes through the same
        # checks as any proposal (validity, drift, the gate). A model's
        # failure is journaled with the replan's outcome.
        logger.warning("the winning candidate stands unrefined: %s", failed.reason)
        return proposals[best]
    if not evolved.proposal.achievable and proposals[best].achievable:
        # Only the planner judges whether the goal can be reached: a
        # refinement that gives up on it is none, and the winner stands.
        return proposals[best]
    return evolved.proposal


async def _gate_replan(
    run: RunDriver,
    verdict: Verdict,
    version: PlanVersion,
    resumed: GateInfo | None = None,
) -> GateResolution:
    if resumed is not None and resumed.resolution is not None:
        return resumed.resolution
    trigger = verdict.trigger.value if verdict.trigger else "replan"
    request = (
        resumed.request
        if resumed is not None
        else run.gate_request(
            f"{trigger}: {verdict.rationale}" if verdict.rationale else trigger,
            trigger=verdict.trigger,
            proposal=version,
        )
    )
    return await run.await_gate(request, edit_check(run), reopen=resumed is not None)


def edit_check(run: RunDriver) -> Validator:
    """A replan gate's check of edited tasks: a valid plan on the run as it is."""
    known = frozenset(
        t.id
        for t in run.state.tasks.values()
        if t.status in (TaskStatus.COMPLETED, TaskStatus.IN_PROGRESS)
    )

    def valid_edit(resolution: GateResolution) -> None:
        if resolution.hypotheses is not None:
            raise ValueError("a replan gate takes edited tasks, not hypotheses")
        if resolution.tasks is not None:
            check_drafts(resolution.tasks, known=known)

    return valid_edit


def gate_check(run: RunDriver, request: GateRequest) -> Validator:
    """The check a review gate applies to a person's answer."""
    return _no_edit if request.proposal is None else edit_check(run)


async def _refuse(
    run: RunDriver,
    verdict: Verdict,
    outcome: ReplanOutcome,
    reason: str,
    *,
    proposed: PlanVersion | None = None,
) -> None:
    record = ReplanRecord(
        trigger=verdict.trigger,
        outcome=outcome,
        reason=reason,
        confidence=verdict.confidence,
        proposed=proposed,
    )
    await run.record_events((ReplanRefused, {"record": record}))
