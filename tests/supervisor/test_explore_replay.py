"""Explore runs replay exactly from their journal, tournaments are seeded, and
every cycle is a span with its comparisons as events."""

from __future__ import annotations

from pathlib import Path

from explore_scripts import ExploreScript, Idea, explore_spec, run_explore, scores
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from replan import GateResolution, ScriptedModel, Supervisor, replay
from replan.messages import LENSES, Hypothesis
from replan.store import SQLiteStore
from replan.supervisor._explore import COMPARISON_EVENT, CYCLE_SPAN

IDEAS = [
    Idea("Solo cooks leave because every recipe serves four", strength=0.9),
    Idea("Leftovers pile up and make planning feel wasteful", strength=0.2),
    Idea("Cooks without a weekly budget lose their reason to plan", strength=0.6),
    Idea("Skipping a week is hard, so busy cooks quit instead", strength=0.4),
    Idea("Shopping lists ignore the pantry and annoy cooks", strength=0.8),
    Idea("Notifications arrive at the wrong time of day", strength=0.3),
]


def comparisons(journal) -> list[tuple[str, str, str, int, int]]:
    return [
        (c.a, c.b, c.winner, c.iteration, c.round)
        for e in journal
        if e.kind == "hypotheses_compared"
        for c in e.comparisons
    ]


async def test_an_explore_run_with_a_gate_replays_exactly_from_sqlite(
    tmp_path: Path,
) -> None:
    torn = Idea(
        IDEAS[0].statement,
        [scores(novelty=1.0), scores(novelty=0.2)],
        strength=0.9,
    )
    weak = scores(evidence=0.1)
    script = ExploreScript(
        generated=[torn, Idea(IDEAS[1].statement, [weak]), *IDEAS[2:4]],
        evolved=[[Idea("Portions for one would keep solo cooks planning")]],
        extra=[Idea("Cooks stay when plans reuse the fridge", strength=1.0)],
    )
    model = ScriptedModel(script)
    async with SQLiteStore(tmp_path / "runs.db") as store:
        async with Supervisor(model=model, store=store) as sup:
            handle = await sup.submit(explore_spec(select=4))
            async for event in handle.events():
                if event.kind == "gate_opened" and "edit by" in event.request.reason:
                    # The selection the edit changed, shown again.
                    await sup.gates.resolve(
                        event.request.gate_id,
                        GateResolution(decision="approve", by="ana"),
                    )
                elif event.kind == "gate_opened":
                    await sup.gates.resolve(
                        event.request.gate_id,
                        GateResolution(
                            decision="edit",
                            hypotheses=[
                                Hypothesis(
                                    statement="Cooks stay when plans reuse the fridge"
                                )
                            ],
                            by="ana",
                        ),
                    )
            result = await handle.result()
            assert await sup.replay(result.run_id) == result
        events = await store.read(result.run_id)
    kinds = {e.kind for e in events}
    assert {
        "goal_screened",
        "context_explored",
        "hypotheses_added",
        "hypotheses_reviewed",
        "hypotheses_compared",
        "hypotheses_clustered",
        "cycle_finished",
        "gate_opened",
        "gate_resolved",
        "brief_issued",
        "run_finished",
    } <= kinds
    state = replay(events)
    assert state.result() == result
    assert result.brief.reviewed_by == "ana"
    assert result.iterations == 2
    # the state rebuilt from events alone holds every candidate and rating
    assert len(state.explore.hypotheses) == 6
    ratings = {s.hypothesis.id: s.rating for s in result.brief.selected}
    assert all(
        round(state.explore.ratings[h].rating, 2) == r for h, r in ratings.items()
    )


async def test_the_tournament_is_deterministic_for_a_fixed_seed() -> None:
    runs = [
        await run_explore(explore_spec(seed=seed), ExploreScript(generated=IDEAS))
        for seed in (11, 11, 12, 13, 14)
    ]
    first, again = runs[0], runs[1]
    assert comparisons(first.journal) == comparisons(again.journal)
    assert first.result.brief == again.result.brief
    assert len(comparisons(first.journal)) == 3 + 3 + 6  # two random rounds, top 4
    others = {tuple(comparisons(r.journal)) for r in runs[2:]}
    assert any(o != tuple(comparisons(first.journal)) for o in others)


async def test_top_candidates_play_more_comparisons_than_the_rest() -> None:
    outcome = await run_explore(explore_spec(seed=3), ExploreScript(generated=IDEAS))
    played: dict[str, int] = {}
    for a, b, *_ in comparisons(outcome.journal):
        played[a] = played.get(a, 0) + 1
        played[b] = played.get(b, 0) + 1
    assert sorted(played.values(), reverse=True)[:4] == [5, 5, 5, 5]
    assert sorted(played.values())[:2] == [2, 2]


async def test_each_cycle_is_a_span_with_the_run_id_and_its_comparisons() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    weak = scores(plausibility=0.2)
    script = ExploreScript(
        generated=[Idea(i.statement, [weak], strength=i.strength) for i in IDEAS[:3]],
        evolved=[IDEAS[3:6]],
    )
    outcome = await run_explore(
        explore_spec(max_iterations=2), script, tracer_provider=provider
    )
    spans = [s for s in exporter.get_finished_spans() if s.name == CYCLE_SPAN]
    assert len(spans) == outcome.result.iterations == 2
    assert {s.attributes["gen_ai.conversation.id"] for s in spans} == {
        outcome.result.run_id
    }
    assert [s.attributes["replan.explore.iteration"] for s in spans] == [1, 2]
    assert [s.attributes["replan.explore.decision"] for s in spans] == [
        "evolve",
        "select",
    ]
    events = [e for s in spans for e in s.events if e.name == COMPARISON_EVENT]
    journaled = comparisons(outcome.journal)
    assert [
        (
            e.attributes["replan.explore.a"],
            e.attributes["replan.explore.b"],
            e.attributes["replan.explore.winner"],
        )
        for e in events
    ] == [(a, b, w) for a, b, w, *_ in journaled]
    assert all(s.status.is_ok or s.status.status_code.name == "UNSET" for s in spans)
    # The cycles belong to the run's trace, under its root span.
    (root,) = [
        s for s in exporter.get_finished_spans() if s.name == "invoke_workflow replan"
    ]
    assert all(s.parent is not None for s in spans)
    assert {s.parent.span_id for s in spans if s.parent} == {root.context.span_id}
    provider.shutdown()


async def test_an_explore_runs_actor_spans_say_what_each_call_asked() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    script = ExploreScript(generated=IDEAS[:3])
    outcome = await run_explore(
        explore_spec(max_iterations=1), script, tracer_provider=provider
    )
    provider.shutdown()
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "invoke_workflow replan"]
    assert root.attributes["replan.run.kind"] == "explore"
    assert "replan.run.pattern" not in root.attributes  # a plan run's
    asked = {
        (s.name, s.attributes["replan.purpose"])
        for s in spans
        if s.name.startswith("invoke_agent ")
    }
    assert asked == {
        ("invoke_agent planner", "gaps"),
        ("invoke_agent planner", "hypotheses"),
        ("invoke_agent reviewer", "critique"),
        ("invoke_agent ranker", "compare"),
        ("invoke_agent planner", "validation"),
    }
    critiques = [
        s
        for s in spans
        if s.name == "invoke_agent reviewer"
        and s.attributes.get("replan.explore.hypothesis") == "H1"
    ]
    assert critiques
    scored = {
        e.attributes["gen_ai.evaluation.name"]
        for e in critiques[0].events
        if e.name == "gen_ai.evaluation.result"
    }
    assert scored == set(LENSES)
    compare = next(s for s in spans if s.name == "invoke_agent ranker")
    assert {"replan.explore.a", "replan.explore.b"} <= set(compare.attributes)
    [verdict] = [e for e in compare.events if e.name == "gen_ai.evaluation.result"]
    assert verdict.attributes["gen_ai.evaluation.score.label"] in {"a", "b"}
    assert outcome.result.status.value == "completed"


async def test_the_root_says_the_briefs_status_where_the_outcome_cannot() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    weak = scores(evidence=0.1)
    script = ExploreScript(
        generated=[Idea(i.statement, [weak], strength=i.strength) for i in IDEAS[:2]]
    )
    outcome = await run_explore(
        explore_spec(max_iterations=1), script, tracer_provider=provider
    )
    assert outcome.result.brief is not None
    assert outcome.result.brief.status == "needs_review"
    (root,) = [
        s for s in exporter.get_finished_spans() if s.name == "invoke_workflow replan"
    ]
    assert root.attributes["replan.run.outcome"] == "completed"
    assert root.attributes["replan.explore.brief.status"] == "needs_review"
    provider.shutdown()
