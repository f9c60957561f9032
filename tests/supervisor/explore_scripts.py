"""Scripted models and a run helper for explore runs.

An :class:`Idea` is what the scripted planner or evolver proposes: its
statement, the scores each reviewer gives it, and a hidden ``strength`` that
decides every pairwise comparison (the stronger wins). :class:`ExploreScript`
answers every explore purpose from a list of ideas, so a test states only the
ideas and what is special about them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from replan import (
    Comparison,
    Critique,
    GateResolution,
    MemoryStore,
    ModelRequest,
    RunResult,
    RunSpec,
    ScriptedModel,
    Supervisor,
)
from replan.messages import (
    LENSES,
    ContextAnalysis,
    Event,
    ExploreSettings,
    Hypothesis,
    HypothesisBatch,
    Limits,
    ValidationBatch,
    ValidationPlan,
)
from replan.store import RunSummary

GOAL = "Find why weekly active cooks of a meal-planning app drop after week three"
CONTEXT = [
    "Retention analytics: 41% of new cooks are inactive by day 21; the drop is "
    "steepest for households of one.",
    "Support themes: many tickets ask how to reuse leftovers and how to skip a week.",
    "Survey: cooks who set a weekly budget stay longer than those who do not.",
]


def scores(base: float = 0.8, **lenses: float) -> dict[str, float]:
    """A full set of lens scores, all ``base`` except those given."""
    out = dict.fromkeys(LENSES, base)
    out.update(lenses)
    return out


@dataclass
class Idea:
    statement: str
    reviews: Sequence[dict[str, float]] = field(default_factory=lambda: [scores()])
    """One score set per reviewer (the last one repeats)."""
    strength: float = 0.5
    evidence: list[str] = field(default_factory=lambda: ["E1"])
    assumptions: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)

    def hypothesis(self) -> Hypothesis:
        return Hypothesis(
            statement=self.statement,
            rationale=f"because {self.statement.lower()}",
            evidence_refs=self.evidence,
            assumptions=self.assumptions,
            risks=["the data may be biased"],
            parent_ids=self.parents,
        )


@dataclass
class ExploreScript:
    """Answers every explore purpose; unknown statements are a test bug."""

    generated: list[Idea]
    evolved: list[list[Idea]] = field(default_factory=list)
    """One batch per evolve call; later calls repeat the last batch."""
    extra: list[Idea] = field(default_factory=list)
    """Ideas that are reviewed and compared but never proposed by the model
    (a person's hypotheses)."""
    gaps: list[str] = field(default_factory=lambda: ["no data on household size"])
    broken: dict[str, Callable[[ModelRequest], Any]] = field(default_factory=dict)
    """Purpose -> an answer that replaces the scripted one (malformed output)."""
    evolve_calls: int = 0

    def ideas(self) -> dict[str, Idea]:
        everyone = [*self.generated, *self.extra]
        for batch in self.evolved:
            everyone.extend(batch)
        return {i.statement: i for i in everyone}

    def __call__(self, request: ModelRequest) -> Any:
        ctx = request.context
        if request.purpose in self.broken:
            return self.broken[request.purpose](request)
        ideas = self.ideas()
        match request.role, request.purpose:
            case "planner", "gaps":
                return ContextAnalysis(
                    summary=f"{len(ctx['evidence'])} notes on retention",
                    gaps=self.gaps,
                    questions=["what differs for households of one?"],
                )
            case "planner", "hypotheses":
                return HypothesisBatch(
                    hypotheses=[i.hypothesis() for i in self.generated]
                )
            case "reviewer", "critique":
                idea = ideas[ctx["hypothesis"].statement]
                index = min(ctx["reviewer_index"], len(idea.reviews) - 1)
                who = ctx["reviewer_index"]
                return Critique(
                    scores=idea.reviews[index],
                    critique=f"review {who} of {ctx['hypothesis_id']}",
                )
            case "ranker", "compare":
                a, b = ideas[ctx["a"].statement], ideas[ctx["b"].statement]
                return Comparison(
                    winner="a" if a.strength >= b.strength else "b",
                    rationale="stronger",
                )
            case "evolver", "evolve":
                batch = self.evolved[min(self.evolve_calls, len(self.evolved) - 1)]
                self.evolve_calls += 1
                return HypothesisBatch(hypotheses=[i.hypothesis() for i in batch])
            case "planner", "validation":
                return ValidationBatch(
                    plans=[
                        ValidationPlan(
                            hypothesis_id=h.id,
                            next_step=f"test {h.id} with a cohort split",
                            success_signal=f"{h.id}'s cohort retains better",
                        )
                        for h in ctx["hypotheses"]
                    ]
                )
        raise AssertionError(f"unscripted {request.role}/{request.purpose}")


def explore_spec(
    goal: str = GOAL,
    context: list[str] | None = None,
    *,
    max_iterations: int = 3,
    **settings: Any,
) -> RunSpec:
    return RunSpec(
        goal=goal,
        kind="explore",
        context=CONTEXT if context is None else context,
        limits=Limits(max_iterations=max_iterations),
        explore=ExploreSettings(**settings),
    )


@dataclass
class Outcome:
    result: RunResult
    journal: list[Event]
    replayed: RunResult
    model: ScriptedModel
    appends: list[list[str]] = field(default_factory=list)
    """The kinds of the events of each append, in order."""


class AppendLog(MemoryStore):
    """A memory journal that remembers which events each append held."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[list[str]] = []

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        await super().append(run_id, events, summary)
        self.appends.append([e.kind for e in events])


async def run_explore(
    spec: RunSpec,
    script: Callable[[ModelRequest], Any],
    *,
    resolve: Callable[[Any], GateResolution | None] | None = None,
    **supervisor: Any,
) -> Outcome:
    """Run ``spec`` to its end, answering each gate with ``resolve(request)``."""
    model = script if isinstance(script, ScriptedModel) else ScriptedModel(script)
    store = AppendLog()
    with anyio.fail_after(20):
        async with Supervisor(model=model, store=store, **supervisor) as sup:
            handle = await sup.submit(spec)
            if resolve is not None:
                async for event in handle.events():
                    if event.kind == "gate_opened":
                        answer = resolve(event.request)  # type: ignore[union-attr]
                        if answer is not None:
                            # Listed before its gate_opened can be read.
                            await sup.gates.resolve(event.request.gate_id, answer)  # type: ignore[union-attr]
            result = await handle.result()
            replayed = await sup.replay(result.run_id)
    journal = await store.read(result.run_id)
    return Outcome(result, journal, replayed, model, store.appends)
