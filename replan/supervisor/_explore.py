"""The explore flow: screen, gather evidence, then generate-review-rank-evolve.

Each step journals its outcome before the next one reads it; the decisions
are the pure functions of :mod:`replan.explore`. Malformed model output is
recorded in the run's errors and the run goes on without that answer; only a
limit, a stopped role, a model out of reach (see ``_explore_reach``) or a
cancellation ends it early, and even then the brief says what was found so
far.

A resumed run goes through the same steps, replaying its journal first:
while journaled events remain, a step asks no model and journals nothing; it
takes its outcome from the journal instead (and a model answer that
journaled nothing stays without effect, as it was). Once the journal is used
up the run goes on as it would have: a review gate still open is waited on
again (the same gate), and work that was under way but not journaled is done
again. A review batch journals each answer as it comes in, so a run resumed
in its middle asks only for the critiques it lacks.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
from opentelemetry.trace import INVALID_SPAN, Span

from ..explore import (
    Judge,
    aggregate,
    apply_results,
    clusters,
    decide,
    evidence_items,
    goal_words,
    mentions,
    play_round,
    random_round,
    rank_key,
    review_reasons,
    screen,
    select,
    shortfalls,
    top_round,
)
from ..messages import (
    LENSES,
    BriefIssued,
    Cluster,
    Comparison,
    ContextAnalysis,
    ContextExplored,
    Critique,
    CycleFinished,
    Event,
    ExploreErrorRecorded,
    ExploreReply,
    ExploreRequest,
    GateOpened,
    GateResolution,
    GateResolved,
    GoalScreened,
    HypothesesAdded,
    HypothesesClustered,
    HypothesesCompared,
    HypothesesReviewed,
    Hypothesis,
    HypothesisBatch,
    HypothesisCritiqued,
    Rejection,
    RunStatus,
    ValidationBatch,
    ValidationPlan,
)
from ..messages._actors import ExplorePurpose
from ..messages._explore_events import ExploreEvent
from ..messages._gate import POLICY_TIMEOUT
from ..telemetry import _names as names
from ._decide import budget_spent
from ._explore_brief import BriefStatus, admit, build_brief, wording
from ._explore_reach import Reach
from ._explore_state import ExploreState, fold_explore
from ._resume import Recovery
from ._run import RoleFailed, RunEnded

if TYPE_CHECKING:
    from ..actors import ActorPool
    from ._run import RunDriver

CYCLE_SPAN = names.SPAN_EXPLORE_CYCLE
COMPARISON_EVENT = names.EVENT_EXPLORE_COMPARISON

_RUN_STATUS: dict[BriefStatus, RunStatus] = {
    "completed": RunStatus.COMPLETED,
    "needs_review": RunStatus.COMPLETED,
    "blocked": RunStatus.BLOCKED,
    "failed": RunStatus.FAILED,
}

Ended = tuple[RunStatus, str | None, None]

NO_CANDIDATES = "no usable candidates"
"""The stop reason of a run that found nothing to recommend (with the last
of the run's errors, when it has any: they say why)."""

_T = TypeVar("_T")


def review_check(resolution: GateResolution) -> None:
    """An explore review takes approve, reject, or an edit with hypotheses."""
    if resolution.tasks is not None:
        raise ValueError("an explore review takes hypotheses, not tasks")


logger = logging.getLogger("replan.supervisor")


def changed_after_edit(shown: Sequence[str], selected: Sequence[str], by: str) -> str:
    """Why a selection is reviewed again after a person added hypotheses."""
    joined = [h for h in selected if h not in shown]
    left = [h for h in shown if h not in selected]
    parts = []
    if joined:
        parts.append(f"{', '.join(joined)} joined")
    if left:
        parts.append(f"{', '.join(left)} left")
    return f"the selection changed after the edit by {by} ({'; '.join(parts)})"


class JournalMismatch(RuntimeError):
    """A resumed run's journal does not fit the explore flow (a bug, or a
    journal written by another version): the run is left as it is."""


class _EndedEarly(Exception):
    """Replaying met the brief of a run a limit or a stopped role ended."""

    def __init__(self, brief: BriefIssued) -> None:
        super().__init__()
        self.brief = brief


async def explore(run: RunDriver) -> Ended:
    """Drive an explore run to its brief; returns how the run ends."""
    flow = _Flow(run)
    try:
        return await flow.drive()
    except _EndedEarly as early:
        # Stopped between an early brief and the run's end: end it now, as
        # the brief says (a journal of an older version does not say it).
        if early.brief.ended is not None:
            return early.brief.ended, early.brief.stop_reason, None
        spent = budget_spent(run.state)
        if spent is not None:
            return RunStatus.LIMIT_REACHED, spent, None
        return RunStatus.FAILED, "the run ended early (see its brief)", None
    except RunEnded as end:
        # A limit or a stopped role: the brief still says what was found.
        with anyio.CancelScope(shield=True):
            await flow.brief_early(end)
        raise


async def brief_after(run: RunDriver, end: RunEnded) -> None:
    """The brief of a run its deadline or a cancel ended: what was found so
    far (the flow was cut short, so it could not write it)."""
    try:
        await _Flow(run).brief_early(end)
    except RunEnded as unstorable:  # the brief cannot be journaled
        logger.warning(
            "run %s ended without a brief: %s", run.state.run_id, unstorable.reason
        )


class _Flow:
    def __init__(self, run: RunDriver) -> None:
        self.run = run
        self.spec = run.state.spec
        self.settings = self.spec.explore
        self.tracer = run.telemetry.tracer
        self._errors: list[str] = []
        self._ended: RunEnded | None = None
        """The first end (a limit, a stopped role) met by a concurrent call."""
        recovery, run.recovery = run.recovery, None
        journal = recovery.events if isinstance(recovery, Recovery) else ()
        self._journal = _unreplayed(journal)
        """A resumed run's journaled steps the flow has not replayed yet."""
        self._replayed = ExploreState()
        """The explore state as of the last replayed event."""
        self._reach = Reach()

    @property
    def explore(self) -> ExploreState:
        if self._journal:
            return self._replayed
        return self.run.view.explore or ExploreState()

    # Replaying a resumed run's journal ------------------------------------

    @property
    def replaying(self) -> bool:
        """Journaled steps remain: the flow takes outcomes from the journal."""
        return bool(self._journal)

    def journaled(self, cls: type[Event]) -> bool:
        """The journal's next step (past its errors) is a ``cls`` event."""
        return isinstance(self._next_step(), cls)

    def _next_step(self) -> Event | None:
        for event in self._journal:
            if not isinstance(event, ExploreErrorRecorded):
                return event
        return None

    def replay(self, *classes: type[Event]) -> list[Event]:
        """Take the journal's next events (and the errors before them), which
        must be of ``classes``, as if the flow had just journaled them."""
        taken: list[Event] = []
        for cls in (ExploreErrorRecorded, *classes):
            while self._journal and isinstance(self._journal[0], ExploreErrorRecorded):
                self._fold(self._journal.popleft())
            if cls is ExploreErrorRecorded:
                continue
            event = self._journal.popleft() if self._journal else None
            if isinstance(event, BriefIssued) and cls is not BriefIssued:
                raise _EndedEarly(event)
            if not isinstance(event, cls):
                found = (
                    "its end" if event is None else f"{event.kind} (seq {event.seq})"
                )
                raise JournalMismatch(
                    f"run {self.run.state.run_id}: resuming the explore flow, "
                    f"expected {cls.__name__} next in the journal, found {found}"
                )
            self._fold(event)
            taken.append(event)
        return taken

    def _fold(self, event: Event) -> None:
        if isinstance(event, ExploreEvent):
            self._replayed = fold_explore(self._replayed, event)

    # Journal and asking ---------------------------------------------------

    def stage_errors(self) -> None:
        """Fold the errors gathered since the last append into the state now,
        to be journaled with the next step (a gate's opening, the brief).

        Journaled alone, a batch whose step then never came (a crash) would
        be gathered again when the resumed run redoes that step.
        """
        errors, self._errors = self._errors, []
        if self.replaying:
            self.replay()  # the journaled errors before the next step
        elif errors:
            self.run.stage((ExploreErrorRecorded, {"errors": errors}))

    async def record(self, *specs: tuple[type[Any], dict[str, Any]]) -> None:
        """Journal ``specs`` with the errors gathered since the last append
        (replaying: take them from the journal instead)."""
        errors, self._errors = self._errors, []
        if self.replaying:
            self.replay(*(cls for cls, _ in specs))
            return
        pending = [(ExploreErrorRecorded, {"errors": errors})] if errors else []
        await self.run.record_events(*pending, *specs)

    async def ask(
        self,
        pool: ActorPool[Any, Any],
        purpose: ExplorePurpose,
        context: dict[str, Any],
        *,
        gather: bool = True,
        **fields: Any,
    ) -> ExploreReply:
        """Ask ``pool`` for an answer; its errors are gathered to be journaled
        with the next step, or left to the caller (``gather=False``)."""
        full = self.run.base_context()
        full.update(
            run_kind="explore",
            domain=self.settings.domain,
            constraints=self.settings.constraints,
            evidence=self.explore.evidence,
        )
        full.update(context)
        if self.replaying:
            # The answer is in the journal (or had no effect): ask nobody.
            return ExploreReply()
        request = ExploreRequest(purpose=purpose, context=full, **fields)
        self._reach.asked()
        try:
            reply = await self.run.ask(pool, request, ExploreReply)
        except RoleFailed as failed:
            error = f"{pool.role}/{purpose}: {failed.reason}"
            if failed.transient:
                self._reach.failed(pool.role, error)
            reply = ExploreReply(errors=[error])
        else:
            if reply.output is None and reply.errors:  # no usable answer
                self._reach.unusable(pool.role, reply.errors)
        if gather:
            self._errors.extend(reply.errors)
        return reply

    async def guarded(
        self, ask: Callable[..., Awaitable[_T]], *args: Any, **kw: Any
    ) -> _T | None:
        """``ask`` for a call made concurrently with others: an end of the run
        is kept (and the others stop) instead of surfacing as an exception
        group; :meth:`reraise` raises it once the group is done."""
        if self._ended is not None:
            return None
        try:
            return await ask(*args, **kw)
        except RunEnded as end:
            if self._ended is None:
                self._ended = end
            return None

    def reraise(self) -> None:
        ended, self._ended = self._ended, None
        if ended is not None:
            raise ended

    # The flow ---------------------------------------------------------------

    async def drive(self) -> Ended:
        goal = self.spec.goal
        if not goal_words(goal):
            self._errors.append("goal: it has no words to explore")
            await self.record((GoalScreened, {"outcome": "invalid"}))
            return await self.finish("failed", "The goal has no words to explore.")
        outcome, findings = screen(goal, self.settings.domain, self.spec.safety_policy)
        await self.record((GoalScreened, {"outcome": outcome, "findings": findings}))
        if outcome == "blocked":
            detail = findings[0].detail
            return await self.finish(
                "blocked",
                f"Blocked by the safety policy before any hypothesis was "
                f"generated: {detail}.",
                reason=detail,
            )
        await self.gather()
        self.end_round("the evidence step")
        decision: str = "limit"
        for iteration in range(1, self.spec.limits.max_iterations + 1):
            decision = await self.cycle(iteration)
            self.end_round(f"cycle {iteration}")
            if decision != "evolve":
                break
        return await self.conclude(decision)

    def end_round(self, name: str) -> None:
        """End the run ``failed`` when the model has been out of reach for
        too many rounds in a row (the brief says what was found)."""
        unreachable = self._reach.end_round(name)
        if unreachable is not None:
            raise RunEnded(RunStatus.FAILED, unreachable)

    async def gather(self) -> None:
        """Evidence items from the context; gaps and questions from the planner."""
        evidence = evidence_items(self.spec.context)
        sparse = len(evidence) < self.settings.min_evidence
        reply = await self.ask(self.run.roles.planner, "gaps", {"evidence": evidence})
        analysis = (
            reply.output
            if isinstance(reply.output, ContextAnalysis)
            else ContextAnalysis()
        )
        gaps = list(analysis.gaps)
        if sparse:
            gaps.insert(0, f"only {len(evidence)} evidence item(s) were supplied")
        await self.record(
            (
                ContextExplored,
                {
                    "evidence": evidence,
                    "summary": analysis.summary,
                    "gaps": gaps,
                    "questions": analysis.questions,
                    "sparse": sparse,
                },
            )
        )

    async def cycle(self, iteration: int) -> Literal["select", "evolve", "limit"]:
        """Generate (or take the evolved), review, rank, cluster, decide, evolve."""
        with self.cycle_span(iteration) as span:
            if not self.explore.unreviewed and not self.explore.active:
                await self.generate(iteration)
            await self.review_new()
            await self.tournament(iteration, span)
            await self.cluster()
            explore = self.explore
            qualifying = [
                h
                for h in explore.active
                if not shortfalls(explore.reviews[h], self.settings.thresholds)
            ]
            decided = decide(
                len(qualifying),
                self.settings.select,
                iteration,
                self.spec.limits.max_iterations,
            )
            reason = (
                f"{len(qualifying)} of {self.settings.select} wanted diverse "
                f"hypotheses meet the thresholds"
            )
            await self.record(
                (
                    CycleFinished,
                    {
                        "iteration": iteration,
                        "decision": decided,
                        "qualifying": qualifying,
                        "reason": reason,
                    },
                )
            )
            explore = self.explore
            decision = explore.cycles[-1].decision  # the journaled one
            if decision == "evolve":
                await self.evolve(iteration)
            span.set_attribute(names.EXPLORE_DECISION, decision)
            span.set_attribute(names.EXPLORE_CANDIDATES, len(explore.active))
            span.set_attribute(names.EXPLORE_QUALIFYING, len(qualifying))
        return decision

    def cycle_span(
        self, iteration: int, *, human: bool = False
    ) -> AbstractContextManager[Span]:
        """The span of one cycle (or a person's review round); none for a
        cycle a resumed run replays from its journal: its trace has it."""
        last = HypothesesClustered if human else CycleFinished
        if any(isinstance(e, last) for e in self._journal):
            return nullcontext(INVALID_SPAN)
        attributes: dict[str, Any] = {
            names.GEN_AI_CONVERSATION_ID: self.run.state.run_id,
            names.EXPLORE_ITERATION: iteration,
        }
        if human:
            attributes[names.EXPLORE_HUMAN] = True
        return self.tracer.start_as_current_span(
            CYCLE_SPAN,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )

    async def generate(self, iteration: int) -> None:
        explore = self.explore
        reply = await self.ask(
            self.run.roles.planner,
            "hypotheses",
            {
                "gaps": explore.gaps,
                "questions": explore.questions,
                "count": self.settings.per_batch,
                "existing": list(explore.hypotheses.values()),
                "iteration": iteration,
            },
            temperature=self.settings.temperature,
        )
        batch = reply.output if isinstance(reply.output, HypothesisBatch) else None
        await self.add(batch.hypotheses if batch else [], "generated", iteration)

    async def add(
        self,
        proposed: Sequence[Hypothesis],
        origin: Literal["generated", "evolved", "human"],
        iteration: int,
        parents: Sequence[str] = (),
    ) -> None:
        if self.replaying:
            # Nothing journaled here: none of them was new (or none came).
            if self.journaled(HypothesesAdded):
                self.replay(HypothesesAdded)
            return
        limit = None if origin == "human" else self.settings.per_batch
        new, notes = admit(
            self.explore,
            proposed,
            origin=origin,
            iteration=iteration,
            limit=limit,
            parents=parents,
        )
        self._errors.extend(notes)
        if new:
            await self.record((HypothesesAdded, {"hypotheses": new}))

    async def review_new(self) -> None:
        """Every unreviewed candidate, by ``settings.reviewers`` reviewers.

        Each answer is journaled as it comes in (a ``hypothesis_critiqued``):
        a run resumed in the middle of the batch asks only for the answers
        it lacks. ``hypotheses_reviewed`` ends the batch.
        """
        if not self.explore.unreviewed:
            return
        if self.replaying:
            while self.journaled(HypothesisCritiqued):
                self.replay(HypothesisCritiqued)
            if self.replaying:
                self.replay(HypothesesReviewed)
                return
            # The journal ends in the middle of the batch: ask for the rest.
        explore = self.explore
        ids = explore.unreviewed
        n = self.settings.reviewers
        # The policy's blocked topics bind the run's hypotheses as they do
        # its goal: one that touches them is set aside unreviewed, whatever
        # a reviewer would score its safety.
        policy = self.spec.safety_policy
        blocked = {
            hid: terms
            for hid in ids
            if (
                terms := [
                    t
                    for t in policy.blocked_terms
                    if mentions(explore.hypotheses[hid].statement, t)
                    or mentions(explore.hypotheses[hid].rationale, t)
                ]
            )
        }
        answered = {(c.hypothesis_id, c.reviewer) for c in explore.critiqued}
        asked = [
            (hid, index)
            for hid in ids
            if hid not in blocked
            for index in range(n)
            if (hid, index) not in answered
        ]
        outstanding = set(asked)

        async def one(hid: str, index: int) -> None:
            reply = await self.guarded(
                self.ask,
                self.run.roles.reviewer,
                "critique",
                {
                    "hypothesis": explore.hypotheses[hid],
                    "hypothesis_id": hid,
                    "lenses": list(LENSES),
                    "reviewer_index": index,
                    "reviewers": n,
                },
                gather=False,
                lenses=list(LENSES),
            )
            if reply is None:
                return  # the run ends: unanswered
            critique = reply.output if isinstance(reply.output, Critique) else None
            self.run.stage(
                (
                    HypothesisCritiqued,
                    {
                        "hypothesis_id": hid,
                        "reviewer": index,
                        "critique": critique,
                        "errors": reply.errors,
                    },
                )
            )
            outstanding.discard((hid, index))
            if outstanding:
                # A paid answer is journaled before the run waits on the
                # calls still out (answers that come in meanwhile share the
                # append); the batch's last one shares the batch's append.
                await self.guarded(self.run.record_events)

        async with anyio.create_task_group() as tg:
            for hid, index in asked:
                tg.start_soon(one, hid, index)
        self.reraise()
        answers = {
            (c.hypothesis_id, c.reviewer): c.critique
            for c in self.explore.critiqued
            if c.critique is not None
        }
        reviews, rejected, notes = [], [], []
        safety_min = self.settings.thresholds.get("safety", 0.0)
        for hid in ids:
            critiques = [answers[hid, i] for i in range(n) if (hid, i) in answers]
            statement = explore.hypotheses[hid].statement
            if hid in blocked:
                topic = f"touches a blocked topic: {', '.join(blocked[hid])}"
                notes.append(f"{hid}: {topic}")
                rejected.append(
                    Rejection(
                        hypothesis_id=hid,
                        statement=statement,
                        reason=f"safety policy: {topic}",
                    )
                )
                continue
            if not critiques:
                rejected.append(
                    Rejection(
                        hypothesis_id=hid,
                        statement=statement,
                        reason="could not be reviewed (malformed or failed reviews)",
                    )
                )
                continue
            review = aggregate(hid, critiques, LENSES, self.settings.disagreement)
            reviews.append(review)
            safety = review.scores["safety"]
            if safety < safety_min:
                why = "; ".join(review.critiques) or "low safety score"
                notes.append(f"{hid}: safety {safety:.2g} < {safety_min:g}: {why}")
                rejected.append(
                    Rejection(
                        hypothesis_id=hid,
                        statement=statement,
                        reason=f"safety or ethical concern (safety {safety:.2g})",
                    )
                )
        await self.record(
            (
                HypothesesReviewed,
                {"reviews": reviews, "rejected": rejected, "safety_notes": notes},
            )
        )

    async def tournament(self, iteration: int, span: Span) -> None:
        """Random rounds, then a round robin among the top candidates."""
        ids = self.explore.active
        if len(ids) < 2:
            return
        rng = random.Random(f"{self.settings.seed}:{iteration}")
        rounds = self.settings.rounds
        for index in range(1, rounds + 2):
            ratings = self.explore.ratings
            pairs = (
                random_round(ids, rng)
                if index <= rounds
                else top_round(ids, ratings, self.settings.top_n)
            )
            if self.replaying:
                # The pairs are drawn all the same: later rounds draw on.
                if self.journaled(HypothesesCompared):
                    self.replay(HypothesesCompared)
                continue
            results = await play_round(pairs, self.judge)
            self.reraise()
            _, records = apply_results(
                ratings,
                results,
                iteration=iteration,
                round_index=index,
                k=self.settings.k_factor,
            )
            for r in records:
                span.add_event(
                    COMPARISON_EVENT,
                    {
                        names.EXPLORE_A: r.a,
                        names.EXPLORE_B: r.b,
                        names.EXPLORE_WINNER: r.winner,
                        names.EXPLORE_ROUND: r.round,
                        names.EXPLORE_RATING_A: r.rating_a,
                        names.EXPLORE_RATING_B: r.rating_b,
                    },
                )
            if records or self._errors:
                await self.record((HypothesesCompared, {"comparisons": records}))

    @property
    def judge(self) -> Judge:
        async def judge(a: str, b: str) -> tuple[Literal["a", "b"], str] | None:
            hypotheses = self.explore.hypotheses
            reply = await self.guarded(
                self.ask,
                self.run.roles.ranker,
                "compare",
                {"a": hypotheses[a], "b": hypotheses[b], "a_id": a, "b_id": b},
            )
            if reply is not None and isinstance(reply.output, Comparison):
                return reply.output.winner, reply.output.rationale
            return None

        return judge

    async def cluster(self) -> None:
        """Group near-duplicates; keep the best of each, reject the others."""
        explore = self.explore
        ids = explore.active
        if not ids:
            return

        def rank(h: str) -> tuple[float, float, int, str]:
            return rank_key(h, explore.ratings, explore.reviews)

        earlier = {c.representative: c.members for c in explore.clusters}
        groups = clusters(
            {h: explore.hypotheses[h].statement for h in ids},
            self.settings.similarity,
            rank,
        )
        out: list[Cluster] = []
        rejected: list[Rejection] = []
        for representative, members in groups:
            everyone: list[str] = []
            for m in members:
                for old in earlier.get(m, [m]):
                    if old not in everyone:
                        everyone.append(old)
            out.append(Cluster(representative=representative, members=everyone))
            rejected.extend(
                Rejection(
                    hypothesis_id=m,
                    statement=explore.hypotheses[m].statement,
                    reason=f"near-duplicate of {representative}",
                )
                for m in members
                if m != representative
            )
        await self.record(
            (HypothesesClustered, {"clusters": out, "rejected": rejected})
        )

    async def evolve(self, iteration: int) -> None:
        explore = self.explore
        best = sorted(
            explore.active, key=lambda h: rank_key(h, explore.ratings, explore.reviews)
        )[: self.settings.evolve_top]
        if not best:
            return
        reply = await self.ask(
            self.run.roles.evolver,
            "evolve",
            {
                "candidates": [explore.hypotheses[h] for h in best],
                "reviews": [explore.reviews[h] for h in best],
                "count": self.settings.per_batch,
                "iteration": iteration,
            },
        )
        batch = reply.output if isinstance(reply.output, HypothesisBatch) else None
        await self.add(
            batch.hypotheses if batch else [], "evolved", iteration + 1, best
        )

    # The end ----------------------------------------------------------------

    def selection(self) -> list[str]:
        explore = self.explore
        return select(
            explore.active,
            explore.ratings,
            explore.reviews,
            self.settings.thresholds,
            self.settings.select,
        )

    async def conclude(self, decision: str) -> Ended:
        """Select, ask a person when needed, plan validation, issue the brief."""
        selected = self.selection()
        explore = self.explore
        if not selected:
            return await self.finish(
                "failed",
                "No usable hypothesis remained to recommend.",
                reason=NO_CANDIDATES,
                reasons=self.reasons([]),
            )
        status: BriefStatus = "completed"
        reason: str | None = None
        if decision == "limit":
            status = "needs_review"
            reason = (
                f"max_iterations: {len(explore.cycles)} cycle(s) without "
                f"{self.settings.select} diverse hypotheses meeting the thresholds"
            )
        reasons = self.reasons(selected)
        reviewed_by: str | None = None
        rejected: list[Rejection] = []
        while reasons:
            if self.replaying:
                resolution = await self.journaled_review()
            else:
                # The person is told that refinement stopped short, too.
                asked = [*reasons, reason] if reason else reasons
                resolution = await self.human_review(selected, asked)
            if resolution.by == POLICY_TIMEOUT:
                status = "needs_review"
                reason = "no person reviewed the selection before the gate expired"
                reviewed_by = None
                break
            if resolution.decision == "reject":
                rejected = [
                    Rejection(
                        hypothesis_id=h,
                        statement=self.explore.hypotheses[h].statement,
                        reason=f"rejected at review by {resolution.by}"
                        + (f": {resolution.note}" if resolution.note else ""),
                    )
                    for h in selected
                ]
                return await self.finish(
                    "failed",
                    f"The selection was rejected at review by {resolution.by}.",
                    reason=f"rejected at review by {resolution.by}",
                    reasons=reasons,
                    reviewed_by=resolution.by,
                    rejected=rejected,
                )
            # Approved by a person who was told of the limit, if one
            # stopped refinement: the stop reason still says so.
            status, reviewed_by = "completed", resolution.by
            if not resolution.hypotheses:
                break
            shown = selected
            await self.join(resolution.hypotheses)
            selected = self.selection()
            if self.replaying:
                # As the journal says: the only gate it can hold next is
                # this review's, asked again (earlier versions also asked
                # when a shown hypothesis's copy took its place).
                if not self.journaled(GateOpened):
                    break
            elif self.statements(selected) == self.statements(shown):
                # The person's hypotheses changed nothing they saw (one
                # worded as a shown one may have taken its place: asking
                # again would show the same, as often as they add it again).
                break
            # The tournament changed what the person saw: the selection
            # that reaches the brief is shown to a person again.
            reasons = [
                changed_after_edit(shown, selected, resolution.by),
                *self.reasons(selected),
            ]
        plans = await self.validation(selected)
        n = len(selected)
        total = len(self.explore.hypotheses)
        if status == "completed":
            summary = (
                f"{n} candidate hypothes{'is' if n == 1 else 'es'} selected for "
                f"validation from {total} explored; none is a verified finding."
            )
        else:
            summary = (
                f"{n} candidate hypothes{'is' if n == 1 else 'es'} need a "
                f"person's review before validation: {reason}."
            )
        return await self.finish(
            status,
            summary,
            reason=reason,
            selected=selected,
            plans=plans,
            reasons=reasons,
            reviewed_by=reviewed_by,
        )

    def statements(self, selected: Sequence[str]) -> list[tuple[str, ...]]:
        """What a person sees of a selection: the wording of its statements."""
        return sorted(wording(self.explore.hypotheses[h].statement) for h in selected)

    def reasons(self, selected: Sequence[str]) -> list[str]:
        explore = self.explore
        high = [f.detail for f in explore.findings if f.level == "review"]
        return review_reasons(
            [explore.reviews[h] for h in selected],
            high_impact=high[0] if high else None,
            safety_concerns=explore.safety_notes,
            min_confidence=self.settings.min_confidence,
        )

    async def human_review(
        self, selected: Sequence[str], reasons: Sequence[str]
    ) -> GateResolution:
        hypotheses = [self.explore.hypotheses[h] for h in selected]
        request = self.run.gate_request(
            "a person reviews the selected hypotheses: "
            + "; ".join(reasons)
            + ". Approve the selection, reject it, or edit to add hypotheses "
            "of your own (they join the tournament).",
            hypotheses=hypotheses,
        )

        self.stage_errors()
        return await self.run.await_gate(request, review_check)

    async def journaled_review(self) -> GateResolution:
        """Replaying: the review gate's journaled answer, or, when the gate
        is still open, its answer now (the same gate, waited on again)."""
        [opened] = self.replay(GateOpened)
        assert isinstance(opened, GateOpened)
        if self.journaled(GateResolved) or self.replaying:
            [resolved] = self.replay(GateResolved)
            assert isinstance(resolved, GateResolved)
            return resolved.resolution
        return await self.run.await_gate(opened.request, review_check, reopen=True)

    async def join(self, proposed: Sequence[Hypothesis]) -> None:
        """A person's hypotheses: reviewed, played and clustered with the rest."""
        iteration = len(self.explore.cycles) + 1
        await self.add(proposed, "human", 0)
        await self.review_new()
        with self.cycle_span(iteration, human=True) as span:
            await self.tournament(iteration, span)
        await self.cluster()

    async def validation(self, selected: Sequence[str]) -> list[ValidationPlan]:
        reply = await self.ask(
            self.run.roles.planner,
            "validation",
            {"hypotheses": [self.explore.hypotheses[h] for h in selected]},
        )
        if not isinstance(reply.output, ValidationBatch):
            return []
        plans: list[ValidationPlan] = []
        for plan in reply.output.plans:
            if plan.hypothesis_id in selected and plan.hypothesis_id not in {
                p.hypothesis_id for p in plans
            }:
                plans.append(plan)
            else:
                self._errors.append(
                    f"planner/validation: a plan for {plan.hypothesis_id}, "
                    "which is not selected (or already has one), was ignored"
                )
        return plans

    async def finish(
        self,
        status: BriefStatus,
        summary: str,
        *,
        reason: str | None = None,
        selected: Sequence[str] = (),
        plans: Sequence[ValidationPlan] = (),
        reasons: Sequence[str] = (),
        reviewed_by: str | None = None,
        rejected: Sequence[Rejection] = (),
        ended: RunEnded | None = None,
    ) -> Ended:
        self.stage_errors()
        if reason == NO_CANDIDATES and self.explore.errors:
            # The cause is in the errors (an endpoint that answered every
            # call with a 404, say): the reason names the last of them.
            errors = self.explore.errors
            reason = f"{NO_CANDIDATES} (the last of {len(errors)} errors: {errors[-1]})"
        brief = build_brief(
            self.explore,
            self.settings,
            status=status,
            summary=summary,
            selected=selected,
            plans=plans,
            review_reasons=reasons,
            reviewed_by=reviewed_by,
            rejected=rejected,
        )
        fields: dict[str, Any] = {"brief": brief}
        if ended is not None:
            fields.update(ended=ended.status, stop_reason=ended.reason)
        journaled = self._next_step() if self.replaying else None
        if (
            ended is None
            and isinstance(journaled, BriefIssued)
            and journaled.ended is not None
        ):
            # Replayed without the model calls, the flow reaches its normal
            # end where the run was ended early (its budget spent just before
            # the last call, say): it ends as the journaled brief says.
            raise _EndedEarly(journaled)
        await self.record((BriefIssued, fields))
        if reason is None and status == "failed":
            reason = summary
        return _RUN_STATUS[status], reason, None

    async def brief_early(self, end: RunEnded) -> None:
        """The brief of a run a limit or a stopped role ended early."""
        selected = self.selection()
        status: BriefStatus = "needs_review" if selected else "failed"
        await self.finish(
            status,
            f"The run ended early ({end.reason}); "
            + (
                f"{len(selected)} unfinished candidate(s) need a person's review."
                if selected
                else "no hypothesis can be recommended."
            ),
            selected=selected,
            reasons=[f"the run ended early: {end.reason}"] if selected else [],
            ended=end,
        )


def _unreplayed(journal: Sequence[Event]) -> deque[Event]:
    """The steps of a resumed explore run's journal: its explore events and
    its review gates, without trailing errors (errors are journaled with the
    step after them; a journal of an earlier version may hold a batch alone
    before a gate or the brief, which then was not reached)."""
    steps: deque[Event] = deque(
        e for e in journal if isinstance(e, ExploreEvent | GateOpened | GateResolved)
    )
    while steps and isinstance(steps[-1], ExploreErrorRecorded):
        steps.pop()
    return steps
