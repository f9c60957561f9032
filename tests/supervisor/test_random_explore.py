"""Whole explore runs under random settings and model answers keep the rules.

Each example draws an explore run's settings near their edges (hypotheses per
batch, reviewers, tournament rounds and round-robin size, how many to select,
iterations, token budget and deadline), a script of what the model answers
for each purpose (valid, malformed, malformed once, refused, failing, failing
transiently, slow), which hypotheses touch a blocked topic, how each review
gate is answered (approve, reject, edit, or left to its timeout), and whether
the run is cancelled or its supervisor stopped and another resumes it. Then it
checks what the README promises of every explore run, whatever happens in it:
it ends with a final status, its journal replays to its result (and its live
event stream is its journal, and every event round-trips through JSON), the
usage is what the model answered, role by role, the settings' limits hold, no
candidate worded as an earlier one is added, and a resumed run asks the model
again for no step its journal holds.

Search for new examples with ``pytest --hypothesis-profile=explore
--hypothesis-seed=N`` (see conftest.py).
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripts import EVENT, by_role, stream

from replan import (
    Comparison,
    Critique,
    GateError,
    GateResolution,
    Limits,
    MemoryStore,
    ModelError,
    ModelRefusal,
    ModelRequest,
    RunResult,
    RunSpec,
    ScriptedModel,
    Supervisor,
    TokenUsage,
    TransientModelError,
)
from replan.messages import (
    BriefIssued,
    ContextAnalysis,
    ContextExplored,
    CycleFinished,
    Event,
    ExploreSettings,
    HypothesesAdded,
    HypothesesCompared,
    Hypothesis,
    HypothesisBatch,
    HypothesisCritiqued,
    ValidationBatch,
    ValidationPlan,
)
from replan.store import SQLiteStore, Store

GOAL = "Find why weekly active cooks of a meal-planning app drop after week three"
CONTEXT = [
    "Retention analytics: 41% of new cooks are inactive by day 21.",
    "Support themes: many tickets ask how to reuse leftovers.",
    "Survey: cooks who set a weekly budget stay longer.",
]

IDEAS = [
    "Solo cooks leave because recipes serve four",
    "Leftovers make the weekly plan feel wasteful",
    "Cooks without a budget lose a reason to plan",
    "Solo cooks leave because every recipe serves four people",
    "Notifications arrive when cooks already shopped",
    "Weekly plans ignore what is already in the fridge",
    "Cooks copy ransomware tactics to lock their plans",
    "Shopping lists do not match the store layout",
    "Recipes take longer than the stated time",
    "Cooks forget the app once the free trial ends",
]
"""What the planner and the evolver propose (one touches a blocked topic, one
is a near-duplicate of the first)."""

ANSWERS = [
    *["valid"] * 12,
    "malformed",
    "malformed_once",
    "refused",
    "model_error",
    "transient",
    "slow",
]
"""What the model answers one call."""

PURPOSES = ["gaps", "hypotheses", "critique", "compare", "evolve", "validation"]
GATE_ANSWERS = ["approve", "reject", "none", "edit"]


@dataclass(frozen=True)
class Scenario:
    settings: ExploreSettings
    limits: Limits
    answers: dict[str, tuple[str, ...]]
    """Per purpose, the answers of its calls in turn (repeating)."""
    scores: tuple[tuple[float, ...], ...]
    """Per idea, the lens score each reviewer gives it (the last repeats)."""
    batch: tuple[int, ...]
    """Which ideas each batch proposes, as offsets into IDEAS."""
    gates: tuple[str, ...]
    tokens: int
    sqlite: bool
    interrupt: str
    """``none``; ``cancel`` the run, or ``stop`` or ``drain`` its
    supervisor and resume the run with another, once ``at`` events are
    journaled."""
    at: int
    latency_s: float


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    explore = ExploreSettings(
        per_batch=draw(st.integers(1, 5)),
        select=draw(st.integers(1, 4)),
        reviewers=draw(st.integers(1, 3)),
        rounds=draw(st.integers(1, 3)),
        top_n=draw(st.integers(2, 4)),
        evolve_top=draw(st.integers(1, 3)),
        min_evidence=draw(st.sampled_from([0, 2, 5])),
        disagreement=draw(st.sampled_from([0.5, 1.0])),
        min_confidence=draw(st.sampled_from([0.0, 0.5])),
        seed=draw(st.integers(0, 3)),
        domain=draw(st.sampled_from(["", "", "", "clinical trials"])),
    )
    limits = Limits(
        max_iterations=draw(st.sampled_from([1, 1, 2, 3])),
        max_task_attempts=draw(st.integers(1, 2)),
        retry_backoff_s=0,
        token_budget=draw(st.sampled_from([None, None, None, 400, 60, 12])),
        deadline_s=draw(st.sampled_from([None, None, None, None, 0.05, 0.3])),
        gate_timeout_s=draw(st.sampled_from([0.02, 0.02, 0.3])),
        call_timeout_s=0.5,
    )
    answers = {
        purpose: tuple(draw(st.lists(st.sampled_from(ANSWERS), min_size=1, max_size=6)))
        for purpose in PURPOSES
    }
    return Scenario(
        settings=explore,
        limits=limits,
        answers=answers,
        scores=tuple(
            tuple(
                draw(
                    st.lists(
                        st.sampled_from([0.9, 0.9, 0.8, 0.8, 0.6, 0.3, 0.1]),
                        min_size=1,
                        max_size=3,
                    )
                )
            )
            for _ in IDEAS
        ),
        batch=tuple(draw(st.lists(st.integers(0, len(IDEAS) - 1), max_size=6))),
        gates=tuple(
            draw(st.lists(st.sampled_from(GATE_ANSWERS), min_size=1, max_size=4))
        ),
        tokens=draw(st.sampled_from([1, 5, 0])),
        sqlite=draw(st.integers(0, 3).map(lambda n: n == 0)),
        interrupt=draw(
            st.sampled_from(["none", "none", "stop", "stop", "drain", "cancel"])
        ),
        at=draw(st.integers(2, 45)),
        latency_s=draw(st.sampled_from([0.0, 0.0, 0.001])),
    )


# The scripted world ------------------------------------------------------------


@dataclass
class World:
    """The model of one scenario: its answers, and a count of what it handed
    out (to which supervisor)."""

    scenario: Scenario
    handed: dict[str, TokenUsage] = field(default_factory=dict)
    """Tokens handed out, by role."""
    asked: Counter[str] = field(default_factory=Counter)
    """Calls made, by purpose."""
    steps: Counter[tuple[object, ...]] = field(default_factory=Counter)
    """Calls made, by step (see ``step_of``)."""
    batches: int = 0
    resumed: bool = False
    """The second supervisor asks now."""
    after_resume: list[ModelRequest] = field(default_factory=list)

    def model(self) -> ScriptedModel:
        return ScriptedModel(
            self.answer, latency_s=self.scenario.latency_s, usage=self.usage
        )

    def supervisor(self, store: Store) -> Supervisor:
        return Supervisor(self.model(), store)

    def usage(self, request: ModelRequest) -> TokenUsage:
        # Called once the answer is in: it is what the model handed out.
        tokens = self.scenario.tokens
        usage = TokenUsage(input_tokens=tokens, output_tokens=tokens, calls=1)
        had = self.handed.get(request.role)
        self.handed[request.role] = usage if had is None else had + usage
        return usage

    async def answer(self, request: ModelRequest) -> Any:
        purpose = request.purpose or ""
        answers = self.scenario.answers[purpose]
        kind = answers[self.asked[purpose] % len(answers)]
        self.asked[purpose] += 1
        self.steps[step_of(request)] += 1
        if self.resumed:
            self.after_resume.append(request)
        match kind:
            case "malformed":
                return {"nonsense": True}
            case "malformed_once" if "answer_problem" not in request.context:
                if purpose == "critique":
                    return Critique(scores={"novelty": 0.5})
                return {"nonsense": True}
            case "refused":
                raise ModelRefusal("I cannot help with that")
            case "model_error":
                raise ModelError("the model could not answer")
            case "transient":
                raise TransientModelError("503", retry_after=0.001)
            case "slow":
                await anyio.sleep(0.005)
        return self.valid(request)

    def valid(self, request: ModelRequest) -> Any:
        ctx = request.context
        match request.purpose:
            case "gaps":
                return ContextAnalysis(summary="notes", gaps=["household size"])
            case "hypotheses" | "evolve":
                return HypothesisBatch(hypotheses=self.batch(request))
            case "critique":
                statement = ctx["hypothesis"].statement
                index = IDEAS.index(statement) if statement in IDEAS else -1
                given = self.scenario.scores[index]
                score = given[min(ctx["reviewer_index"], len(given) - 1)]
                scores = dict.fromkeys(ctx["lenses"], score)
                if score > 0.1:  # 0.1: a safety concern too
                    scores["safety"] = 0.9
                return Critique(
                    scores=scores,
                    critique=f"review {ctx['reviewer_index']}",
                )
            case "compare":
                a, b = ctx["a"].statement, ctx["b"].statement
                return Comparison(winner="a" if len(a) >= len(b) else "b")
            case "validation":
                return ValidationBatch(
                    plans=[
                        ValidationPlan(
                            hypothesis_id=h.id,
                            next_step=f"test {h.id}",
                            success_signal="it holds",
                        )
                        for h in ctx["hypotheses"]
                    ]
                )
        raise AssertionError(f"unexpected {request.role}/{request.purpose} call")

    def batch(self, request: ModelRequest) -> list[Hypothesis]:
        self.batches += 1
        offsets = self.scenario.batch or (0,)
        count = request.context["count"]
        picked = [
            IDEAS[(self.batches + offsets[i % len(offsets)]) % len(IDEAS)]
            for i in range(count + 1)  # one more than asked for
        ]
        return [
            Hypothesis(statement=s, rationale="because", evidence_refs=["E1"])
            for s in picked
        ]


def step_of(request: ModelRequest) -> tuple[object, ...]:
    """The step a call is for: asked once, then once more when malformed,
    on each of ``max_task_attempts`` attempts at most."""
    ctx = request.context
    match request.purpose:
        case "critique":
            return ("critique", ctx["hypothesis_id"], ctx["reviewer_index"])
        case "hypotheses" | "evolve":
            return (request.purpose, ctx["iteration"])
    return (request.purpose,)


def gate_answer(kind: str) -> GateResolution | None:
    match kind:
        case "approve":
            return GateResolution(decision="approve", by="ana")
        case "reject":
            return GateResolution(decision="reject", by="ana", note="no")
        case "edit":
            mine = Hypothesis(statement="Cooks stop when their partner cooks")
            return GateResolution(decision="edit", hypotheses=[mine], by="ana")
    return None  # left to its timeout


async def answer_gates(sup: Supervisor, scenario: Scenario) -> None:
    """Answer each gate as the scenario says, in the order they open."""
    seen: set[str] = set()
    while True:
        for request in sup.gates.pending():
            if request.gate_id in seen:
                continue
            kind = scenario.gates[len(seen) % len(scenario.gates)]
            seen.add(request.gate_id)
            resolution = gate_answer(kind)
            if resolution is not None:
                # Refused when it timed out first, or the run ended.
                with contextlib.suppress(GateError):
                    await sup.gates.resolve(request.gate_id, resolution)
        await anyio.sleep(0.001)


# Running and checking ----------------------------------------------------------


def spec_of(scenario: Scenario) -> RunSpec:
    return RunSpec(
        goal=GOAL,
        kind="explore",
        context=CONTEXT,
        limits=scenario.limits,
        explore=scenario.settings,
    )


@dataclass(frozen=True)
class Ran:
    result: RunResult
    events: list[Event]
    replayed: RunResult
    world: World
    streamed: list[Event] | None
    """The events ``handle.events()`` gave, live (None: the run was
    resumed)."""
    before: list[Event] | None
    """The journal when the supervisor was stopped (None: it was not)."""


async def run_scenario(scenario: Scenario) -> Ran:
    world = World(scenario)
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "runs.db") if scenario.sqlite else MemoryStore()
        with anyio.fail_after(20):
            async with store:
                result: RunResult | None = None
                streamed: list[Event] | None = None
                before: list[Event] | None = None
                async with (
                    world.supervisor(store) as sup,
                    anyio.create_task_group() as tg,
                ):
                    tg.start_soon(answer_gates, sup, scenario)
                    handle = await sup.submit(spec_of(scenario))
                    ended = anyio.Event()
                    if scenario.interrupt in ("none", "cancel"):
                        streamed = []
                        tg.start_soon(stream, handle, streamed, ended)
                    if scenario.interrupt != "none":
                        async for event in handle.events():
                            if event.seq >= scenario.at:
                                break
                    if scenario.interrupt == "cancel":
                        await handle.cancel()
                    if scenario.interrupt == "drain":
                        await sup.drain(0.02)
                    if scenario.interrupt in ("none", "cancel"):
                        result = await handle.result()
                        with anyio.fail_after(5):  # the stream ends too
                            await ended.wait()
                    tg.cancel_scope.cancel()
                run_id = handle.run_id
                if result is None:
                    before = await store.read(run_id)
                    world.resumed = True
                    async with (
                        world.supervisor(store) as sup,
                        anyio.create_task_group() as tg,
                    ):
                        tg.start_soon(answer_gates, sup, scenario)
                        resumed = await sup.resume(run_id)
                        result = await resumed.result()
                        tg.cancel_scope.cancel()
                return Ran(
                    result,
                    await store.read(run_id),
                    await sup.replay(run_id),
                    world,
                    streamed,
                    before,
                )


def check(scenario: Scenario, ran: Ran) -> None:
    result, events, explore = ran.result, ran.events, scenario.settings

    # It ends, with a reason unless it completed, and replays to its result.
    assert result.status.final
    if result.status.value != "completed":
        assert result.stop_reason, result
    assert ran.replayed == result
    if ran.streamed is not None:
        assert ran.streamed == events

    # Every event round-trips through JSON.
    for event in events:
        assert EVENT.validate_json(EVENT.dump_json(event)) == event

    # The usage is what the model answered, role by role.
    assert by_role(result.usage.by_role) == by_role(ran.world.handed)

    # The limits hold: cycles, batch sizes, reviewers, tournament rounds.
    cycles = [e for e in events if isinstance(e, CycleFinished)]
    assert len(cycles) <= scenario.limits.max_iterations
    assert [c.iteration for c in cycles] == list(range(1, len(cycles) + 1))
    for e in events:
        if isinstance(e, HypothesesAdded):
            for h in e.hypotheses:
                assert h.origin == e.hypotheses[0].origin
            if e.hypotheses[0].origin != "human":
                assert len(e.hypotheses) <= explore.per_batch
        if isinstance(e, HypothesesCompared):
            for r in e.comparisons:
                assert 1 <= r.round <= explore.rounds + 1
    # A candidate worded as one the run has already is dropped (a person's
    # are all taken); ids are never given twice.
    added = [h for e in events if isinstance(e, HypothesesAdded) for h in e.hypotheses]
    assert len({h.id for h in added}) == len(added)
    worded = [
        tuple(re.findall(r"\w+", h.statement.casefold()))
        for h in added
        if h.origin != "human"
    ]
    assert len(set(worded)) == len(worded), "a candidate added twice"
    critiqued = [
        (e.hypothesis_id, e.reviewer)
        for e in events
        if isinstance(e, HypothesisCritiqued)
    ]
    assert len(critiqued) == len(set(critiqued)), "a critique journaled twice"
    assert all(0 <= index < explore.reviewers for _, index in critiqued)
    brief = result.brief
    assert brief is not None
    assert len(brief.selected) <= explore.select
    ids = [h.hypothesis.id for h in brief.selected]
    assert len(ids) == len(set(ids))
    briefs = [e for e in events if isinstance(e, BriefIssued)]
    assert len(briefs) == 1, [e.kind for e in events]

    # A step is asked once more when its answer is malformed, on each
    # attempt; gathering evidence and planning validation happen once.
    if ran.before is None:
        most = 2 * scenario.limits.max_task_attempts
        for step, calls in ran.world.steps.items():
            # A pair is compared again in later rounds.
            if step[0] != "compare":
                assert calls <= most, f"{step} asked {calls} times"
    else:
        # A resumed run asks the model for no step its journal holds.
        check_resumed(ran.before, ran.world.after_resume)


def check_resumed(before: list[Event], asked: list[ModelRequest]) -> None:
    explored = any(isinstance(e, ContextExplored) for e in before)
    cycles = max(
        (e.iteration for e in before if isinstance(e, CycleFinished)), default=0
    )
    critiqued = {
        (e.hypothesis_id, e.reviewer)
        for e in before
        if isinstance(e, HypothesisCritiqued)
    }
    briefed = any(isinstance(e, BriefIssued) for e in before)
    for request in asked:
        ctx = request.context
        match request.purpose:
            case "gaps":
                assert not explored, "the evidence step asked again"
            case "hypotheses":
                assert ctx["iteration"] > cycles, "a finished cycle generated again"
            case "evolve":
                assert ctx["iteration"] >= cycles, "a finished cycle evolved again"
            case "critique":
                key = (ctx["hypothesis_id"], ctx["reviewer_index"])
                assert key not in critiqued, f"critique {key} asked again"
            case "validation":
                assert not briefed, "validation asked again after the brief"
        assert not briefed, f"{request.purpose} asked after the brief"


def run_and_check(scenario: Scenario, backend: str) -> Ran:
    ran = anyio.run(run_scenario, scenario, backend=backend)
    check(scenario, ran)
    return ran


# About 15 s (asyncio) and 22 s (trio); the same examples each time (the
# deterministic profile of conftest.py).
@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@given(scenario=scenarios())
@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
def test_random_explore_runs_keep_the_run_rules(
    backend: str, scenario: Scenario
) -> None:
    run_and_check(scenario, backend)
