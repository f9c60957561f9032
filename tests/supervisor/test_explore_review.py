"""Human review of explore runs: when a gate opens and what each answer does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from explore_scripts import (
    GOAL,
    ExploreScript,
    Idea,
    explore_spec,
    run_explore,
    scores,
)

from replan import (
    GateError,
    GateRequest,
    GateResolution,
    MemoryStore,
    ResolutionRefused,
    RunHandle,
    RunStatus,
    ScriptedModel,
    Supervisor,
    TaskDraft,
)
from replan.messages import GateOpened, Hypothesis, Limits, SafetyPolicy
from replan.supervisor._explore import _Flow

GOOD = [
    Idea("Solo cooks leave because every recipe serves four", strength=0.9),
    Idea("Leftovers pile up and make planning feel wasteful", strength=0.7),
    Idea("Cooks without a weekly budget lose their reason to plan", strength=0.6),
]
TORN = Idea(
    "Solo cooks leave because every recipe serves four",
    [scores(plausibility=0.95), scores(plausibility=0.15)],
    strength=0.9,
)


def approve(request) -> GateResolution:
    return GateResolution(decision="approve", by="ana")


async def test_sharp_reviewer_disagreement_opens_a_review_gate() -> None:
    seen = []

    def look(request):
        seen.append(request)
        return approve(request)

    script = ExploreScript(generated=[TORN, *GOOD[1:]])
    outcome = await run_explore(explore_spec(), script, resolve=look)
    brief = outcome.result.brief
    assert len(seen) == 1
    assert "reviewers disagree sharply on H1 (plausibility)" in seen[0].reason
    assert [h.id for h in seen[0].hypotheses] == [
        s.hypothesis.id for s in brief.selected
    ]
    assert outcome.result.status is RunStatus.COMPLETED
    assert brief.status == "completed"
    assert brief.reviewed_by == "ana"
    assert not brief.needs_human_review
    assert brief.review_reasons == ["reviewers disagree sharply on H1 (plausibility)"]
    assert outcome.replayed == outcome.result


async def test_the_run_waits_for_a_person_while_the_gate_is_open() -> None:
    model = ScriptedModel(ExploreScript(generated=[TORN, *GOOD[1:]]))
    with anyio.fail_after(10):
        async with Supervisor(model=model) as sup:
            handle = await sup.submit(explore_spec())
            async for event in handle.events():
                if event.kind == "gate_opened":
                    break
            assert handle.status is RunStatus.WAITING_FOR_HUMAN
            assert handle.state.explore.brief is None
            [gate] = sup.gates.pending(handle.run_id)
            assert gate.hypotheses is not None
            await sup.gates.resolve(gate.gate_id, approve(gate))
            result = await handle.result()
    assert result.brief.status == "completed"


async def test_low_reviewer_confidence_asks_a_person() -> None:
    unsure = Idea(GOOD[0].statement, [scores(confidence=0.2)], strength=0.9)
    seen = []
    outcome = await run_explore(
        explore_spec(),
        ExploreScript(generated=[unsure, *GOOD[1:]]),
        resolve=lambda r: seen.append(r) or approve(r),
    )
    assert len(seen) == 1
    assert "low reviewer confidence in H1 (0.2)" in seen[0].reason
    assert outcome.result.brief.reviewed_by == "ana"


@pytest.mark.parametrize("autonomy", [False, True])
async def test_a_high_impact_domain_needs_review_unless_the_policy_allows_autonomy(
    autonomy: bool,
) -> None:
    spec = explore_spec(domain="clinical").model_copy(
        update={"safety_policy": SafetyPolicy(allow_autonomy=autonomy)}
    )
    seen = []
    outcome = await run_explore(
        spec,
        ExploreScript(generated=GOOD),
        resolve=lambda r: seen.append(r) or approve(r),
    )
    brief = outcome.result.brief
    assert brief.status == "completed"
    assert len(seen) == (0 if autonomy else 1)
    assert any("high-impact domain (clinical)" in n for n in brief.safety_notes)
    assert brief.reviewed_by == (None if autonomy else "ana")


async def test_an_ethical_concern_is_excluded_noted_and_reviewed() -> None:
    risky = Idea(
        "Read cooks' private messages to predict churn",
        [scores(safety=0.1)],
        strength=1.0,
    )
    seen = []
    outcome = await run_explore(
        explore_spec(),
        ExploreScript(generated=[risky, *GOOD]),
        resolve=lambda r: seen.append(r) or approve(r),
    )
    brief = outcome.result.brief
    assert "H1" not in {s.hypothesis.id for s in brief.selected}
    assert brief.rejected[0].hypothesis_id == "H1"
    assert brief.rejected[0].reason == "safety or ethical concern (safety 0.1)"
    assert brief.safety_notes[0].startswith("H1: safety 0.1 < 0.7")
    assert len(seen) == 1
    assert "ethical or safety concern: H1" in seen[0].reason


async def test_a_persons_hypotheses_join_the_tournament() -> None:
    mine = Idea(
        "Cooks stay when the app plans around what is already in the fridge",
        strength=1.0,
    )
    script = ExploreScript(generated=[TORN, *GOOD[1:]], extra=[mine])
    seen = []

    def add_mine(request) -> GateResolution:
        seen.append(request)
        if len(seen) > 1:
            return approve(request)
        return GateResolution(
            decision="edit",
            hypotheses=[Hypothesis(statement=mine.statement, evidence_refs=["E2"])],
            by="ana",
        )

    outcome = await run_explore(explore_spec(), script, resolve=add_mine)
    result, brief = outcome.result, outcome.result.brief
    assert brief.status == "completed"
    assert brief.reviewed_by == "ana"
    assert len(seen) == 2  # H4 changed the selection: shown again
    chosen = {s.hypothesis.id: s for s in brief.selected}
    assert "H4" in chosen
    assert chosen["H4"].hypothesis.origin == "human"
    assert chosen["H4"].wins > 0
    played = [
        c
        for e in outcome.journal
        if e.kind == "hypotheses_compared"
        for c in e.comparisons
    ]
    assert any("H4" in (c.a, c.b) for c in played)
    reviewed = outcome.model.calls_for("reviewer", "critique")
    assert sum(c.context["hypothesis_id"] == "H4" for c in reviewed) == 2
    assert outcome.replayed == result


def adding(idea: Idea, then: Callable[[GateRequest], GateResolution]) -> Any:
    """Edit the first review to add ``idea``; answer later ones with ``then``."""
    seen: list[GateRequest] = []

    def resolve(request: GateRequest) -> GateResolution:
        seen.append(request)
        if len(seen) > 1:
            return then(request)
        return GateResolution(
            decision="edit",
            hypotheses=[Hypothesis(statement=idea.statement, evidence_refs=["E2"])],
            by="ana",
        )

    resolve.seen = seen  # type: ignore[attr-defined]
    return resolve


async def test_a_selection_an_edit_changed_is_shown_to_a_person_again() -> None:
    torn_too = Idea(
        "Cooks stay when the app plans around what is already in the fridge",
        [scores(feasibility=0.95), scores(feasibility=0.1)],
        strength=1.0,
    )
    script = ExploreScript(generated=[TORN, *GOOD[1:]], extra=[torn_too])
    resolve = adding(torn_too, lambda r: GateResolution(decision="approve", by="bo"))

    outcome = await run_explore(explore_spec(), script, resolve=resolve)

    first, second = resolve.seen
    assert [h.id for h in first.hypotheses] == ["H1", "H2", "H3"]
    brief = outcome.result.brief
    assert [h.id for h in second.hypotheses] == [
        s.hypothesis.id for s in brief.selected
    ]
    assert "H4" in {h.id for h in second.hypotheses}
    changed = "the selection changed after the edit by ana (H4 joined; H3 left)"
    # The change is the question's first reason, before the others.
    assert second.reason.startswith(
        f"a person reviews the selected hypotheses: {changed}; "
    )
    assert "reviewers disagree sharply on H4 (feasibility)" in second.reason
    assert brief.status == "completed"
    assert brief.reviewed_by == "bo"
    assert brief.review_reasons == [
        changed,
        "reviewers disagree sharply on H1 (plausibility)",
        "reviewers disagree sharply on H4 (feasibility)",
    ]
    assert outcome.replayed == outcome.result


async def test_an_edit_that_changes_no_selection_needs_no_second_review() -> None:
    weak = Idea("Cooks leave when the app icon is blue", strength=0.0)
    script = ExploreScript(generated=[TORN, *GOOD[1:]], extra=[weak])
    resolve = adding(weak, approve)

    outcome = await run_explore(explore_spec(), script, resolve=resolve)

    assert len(resolve.seen) == 1
    brief = outcome.result.brief
    assert [s.hypothesis.id for s in brief.selected] == ["H1", "H2", "H3"]
    assert brief.reviewed_by == "ana"
    assert outcome.replayed == outcome.result


async def test_a_persons_hypotheses_are_all_taken_past_per_batch_and_repeats() -> None:
    # A model's batch is cut to per_batch; a person's edit is taken whole,
    # even a hypothesis worded as another of theirs.
    mine = [
        Idea(f"Cooks stay when the app suggests dish {n} from the fridge")
        for n in ("one", "two", "three")
    ]
    mine.append(Idea(mine[0].statement.upper()))
    script = ExploreScript(generated=[TORN, *GOOD[1:]], extra=mine)
    proposed = [Hypothesis(statement=i.statement) for i in mine]

    seen: list[GateRequest] = []

    def edit_first(request: GateRequest) -> GateResolution:
        seen.append(request)
        if len(seen) > 1:
            return approve(request)
        return GateResolution(decision="edit", hypotheses=proposed, by="ana")

    outcome = await run_explore(
        explore_spec(per_batch=2, select=2), script, resolve=edit_first
    )

    added = [e.hypotheses for e in outcome.journal if e.kind == "hypotheses_added"]
    generated, person = added[0], added[-1]
    assert [h.id for h in generated] == ["H1", "H2"]  # per_batch cut the model's
    assert [(h.id, h.origin) for h in person] == [
        ("H3", "human"),
        ("H4", "human"),
        ("H5", "human"),
        ("H6", "human"),
    ]
    assert [h.statement for h in person] == [h.statement for h in proposed]
    brief = outcome.result.brief
    assert brief is not None
    assert brief.errors == []
    assert outcome.replayed == outcome.result


async def test_an_edit_repeating_a_shown_hypothesis_needs_no_second_review() -> None:
    # The person's copy of H2 outranks H2 (which lost to H1) and takes its
    # place: the ids change, what the person saw does not. Were they asked
    # again, they could add it again, and again, and the run never end.
    seen: list[GateRequest] = []

    def add_h2_again(request: GateRequest) -> GateResolution:
        seen.append(request)
        if len(seen) > 3:
            return GateResolution(decision="approve", by="bo")
        again = Hypothesis(statement=request.hypotheses[1].statement)
        return GateResolution(decision="edit", hypotheses=[again], by="ana")

    script = ExploreScript(generated=[TORN, *GOOD[1:]])
    outcome = await run_explore(explore_spec(), script, resolve=add_h2_again)

    assert len(seen) == 1
    brief = outcome.result.brief
    assert [s.hypothesis.id for s in brief.selected] == ["H1", "H4", "H3"]
    assert [s.hypothesis.statement for s in brief.selected] == [
        h.statement for h in seen[0].hypotheses
    ]
    assert brief.selected[1].hypothesis.origin == "human"
    assert brief.reviewed_by == "ana"
    assert outcome.replayed == outcome.result


async def test_a_journal_that_asked_again_after_a_repeated_hypothesis_resumes_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Earlier versions compared the selections by id: the copy of H2 taking
    # its place opened the review again, and journaled so. A run stopped at
    # that second gate resumes there, as its journal says, not with a
    # JournalMismatch from a flow that no longer asks.
    def add_h2_again(request: GateRequest) -> GateResolution:
        again = Hypothesis(statement=request.hypotheses[1].statement)
        return GateResolution(decision="edit", hypotheses=[again], by="ana")

    store = MemoryStore()
    script = ExploreScript(generated=[TORN, *GOOD[1:]])
    with anyio.fail_after(20):
        with monkeypatch.context() as earlier:
            earlier.setattr(
                _Flow, "statements", lambda self, selected: sorted(selected)
            )
            async with Supervisor(ScriptedModel(script), store) as sup:
                handle = await sup.submit(explore_spec())
                opened: list[GateRequest] = []
                async for event in handle.events():
                    if isinstance(event, GateOpened):
                        opened.append(event.request)
                        if len(opened) == 2:
                            break
                        await sup.gates.resolve(
                            event.request.gate_id, add_h2_again(event.request)
                        )
        assert "the selection changed after the edit" in opened[1].reason
        async with Supervisor(ScriptedModel(script), store, resume=True) as sup:
            assert sup.gates.pending() == [opened[1]]
            resumed = sup.get(handle.run_id)
            await sup.gates.resolve(
                opened[1].gate_id, GateResolution(decision="approve", by="bo")
            )
            result = await resumed.result()
            assert await sup.replay(handle.run_id) == result
    assert result.status is RunStatus.COMPLETED
    assert result.brief is not None
    assert result.brief.reviewed_by == "bo"
    assert [s.hypothesis.id for s in result.brief.selected] == ["H1", "H4", "H3"]


async def test_rejecting_the_selection_an_edit_changed_fails_the_brief() -> None:
    mine = Idea(
        "Cooks stay when the app plans around what is already in the fridge",
        strength=1.0,
    )
    script = ExploreScript(generated=[TORN, *GOOD[1:]], extra=[mine])
    resolve = adding(mine, lambda r: GateResolution(decision="reject", by="bo"))

    outcome = await run_explore(explore_spec(), script, resolve=resolve)

    brief = outcome.result.brief
    assert outcome.result.status is RunStatus.FAILED
    assert brief.reviewed_by == "bo"
    assert {r.hypothesis_id for r in brief.rejected} >= {
        h.id for h in resolve.seen[1].hypotheses
    }
    assert outcome.model.calls_for("planner", "validation") == []


async def test_a_second_review_nobody_answers_leaves_the_brief_needing_review() -> None:
    mine = Idea(
        "Cooks stay when the app plans around what is already in the fridge",
        strength=1.0,
    )
    spec = explore_spec().model_copy(
        update={"limits": Limits(max_iterations=3, gate_timeout_s=0.5)}
    )
    script = ExploreScript(generated=[TORN, *GOOD[1:]], extra=[mine])
    resolve = adding(mine, lambda r: None)  # nobody answers the second

    outcome = await run_explore(spec, script, resolve=resolve)

    brief = outcome.result.brief
    assert len(resolve.seen) == 2
    assert brief.status == "needs_review"
    assert brief.reviewed_by is None
    assert outcome.result.stop_reason == (
        "no person reviewed the selection before the gate expired"
    )


async def test_rejecting_the_selection_fails_the_brief_and_lists_why() -> None:
    outcome = await run_explore(
        explore_spec(),
        ExploreScript(generated=[TORN, *GOOD[1:]]),
        resolve=lambda r: GateResolution(decision="reject", by="ana", note="too thin"),
    )
    result, brief = outcome.result, outcome.result.brief
    assert result.status is RunStatus.FAILED
    assert brief.status == "failed"
    assert brief.selected == []
    assert brief.validation_plan == []
    reasons = [r.reason for r in brief.rejected]
    assert reasons.count("rejected at review by ana: too thin") == 3
    assert outcome.model.calls_for("planner", "validation") == []


async def test_a_review_nobody_answers_leaves_the_brief_needing_review() -> None:
    spec = explore_spec().model_copy(
        update={"limits": Limits(max_iterations=3, gate_timeout_s=0.05)}
    )
    outcome = await run_explore(spec, ExploreScript(generated=[TORN, *GOOD[1:]]))
    result, brief = outcome.result, outcome.result.brief
    assert result.status is RunStatus.COMPLETED
    assert brief.status == "needs_review"
    assert brief.needs_human_review
    assert brief.selected
    assert result.stop_reason == (
        "no person reviewed the selection before the gate expired"
    )
    resolved = [e for e in outcome.journal if e.kind == "gate_resolved"]
    assert resolved[0].resolution.by == "policy:timeout"


def torn_model() -> ScriptedModel:
    """Reviewers torn on the first idea: the run stops at its review gate."""
    return ScriptedModel(ExploreScript(generated=[TORN, *GOOD[1:]]))


async def at_review(sup: Supervisor) -> tuple[RunHandle, GateRequest]:
    """Submit the goal and wait for its review gate."""
    handle = await sup.submit(explore_spec(GOAL))
    async for event in handle.events():
        if event.kind == "gate_opened":
            break
    [gate] = sup.gates.pending()
    return handle, gate


async def test_an_explore_review_refuses_edited_tasks() -> None:
    with anyio.fail_after(10):
        async with Supervisor(model=torn_model()) as sup:
            handle, gate = await at_review(sup)
            with pytest.raises(GateError, match="takes hypotheses, not tasks"):
                await sup.gates.resolve(
                    gate.gate_id,
                    GateResolution(
                        decision="edit", tasks=[TaskDraft(key="a", description="a")]
                    ),
                )
            await sup.gates.resolve(gate.gate_id, approve(gate))
            assert (await handle.result()).brief.status == "completed"


async def test_an_empty_edit_at_an_explore_review_names_the_hypotheses() -> None:
    with anyio.fail_after(10):
        async with Supervisor(model=torn_model()) as sup:
            handle, gate = await at_review(sup)
            with pytest.raises(ResolutionRefused) as empty:
                await sup.gates.resolve(
                    gate.gate_id, {"decision": "edit", "hypotheses": []}
                )
            with pytest.raises(ResolutionRefused) as bare:
                await sup.gates.resolve(gate.gate_id, {"decision": "edit"})
            await sup.gates.resolve(gate.gate_id, approve(gate))
            assert (await handle.result()).brief.status == "completed"
    # Named after what an explore review takes, carried or not.
    assert empty.value.field == bare.value.field == "hypotheses"
    for refused in (empty, bare):
        assert "or hypotheses (an explore review)" in str(refused.value)


async def test_a_blank_hypothesis_of_a_person_is_refused_and_the_gate_stays_open() -> (
    None
):
    with anyio.fail_after(10):
        async with Supervisor(model=torn_model()) as sup:
            handle, gate = await at_review(sup)
            edit = {
                "decision": "edit",
                "hypotheses": [
                    GOOD[0].hypothesis().model_dump(),
                    {"statement": " \n "},
                ],
            }
            with pytest.raises(ResolutionRefused) as refused:
                await sup.gates.resolve(gate.gate_id, edit)
            assert [g.gate_id for g in sup.gates.pending()] == [gate.gate_id]
            await sup.gates.resolve(gate.gate_id, approve(gate))
            result = await handle.result()
    assert refused.value.field == "hypotheses.1.statement"
    assert "must not be blank" in str(refused.value)
    assert result.brief.status == "completed"
    assert not result.brief.errors
