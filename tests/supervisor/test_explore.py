"""Explore runs end to end with scripted models: the flow and its failure cases."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from explore_scripts import (
    ExploreScript,
    Idea,
    explore_spec,
    run_explore,
    scores,
)

from replan import (
    ConfigurationError,
    Critique,
    GateResolution,
    MemoryStore,
    ModelAuthenticationError,
    ModelError,
    ModelOutputError,
    ModelRequest,
    RunSpec,
    RunStatus,
    ScriptedModel,
    Supervisor,
    TokenUsage,
    TransientModelError,
)
from replan.explore import similarity
from replan.messages import (
    LENSES,
    Comparison,
    ContextAnalysis,
    EvidenceItem,
    HypothesisBatch,
    Limits,
    ValidationBatch,
)

pytestmark = pytest.mark.anyio

STRONG = [
    Idea("Solo cooks leave because every recipe serves four", strength=0.9),
    Idea("Leftovers pile up and make planning feel wasteful", strength=0.7),
    Idea("Cooks without a weekly budget lose their reason to plan", strength=0.6),
    Idea("Skipping a week is hard, so busy cooks quit instead", strength=0.4),
]


def purposes(model: ScriptedModel) -> dict[str, int]:
    out: dict[str, int] = {}
    for call in model.calls:
        key = f"{call.role}/{call.purpose}"
        out[key] = out.get(key, 0) + 1
    return out


async def test_the_happy_path_issues_a_completed_brief_with_scores_and_plans() -> None:
    outcome = await run_explore(explore_spec(), ExploreScript(generated=STRONG))
    result, brief = outcome.result, outcome.result.brief
    assert result.status is RunStatus.COMPLETED
    assert brief is not None
    assert brief.status == "completed"
    # H1 wins every comparison; H4 is the weakest and left out
    assert brief.selected[0].hypothesis.id == "H1"
    assert {s.hypothesis.id for s in brief.selected} == {"H1", "H2", "H3"}
    ratings = [s.rating for s in brief.selected]
    assert ratings == sorted(ratings, reverse=True)
    best = brief.selected[0]
    assert best.rating > 1200
    assert best.wins > 0
    assert best.losses == 0
    assert set(best.scores) == {
        "novelty",
        "plausibility",
        "evidence",
        "feasibility",
        "impact",
        "clarity",
        "safety",
    }
    assert best.hypothesis.evidence_refs == ["E1"]
    assert [p.hypothesis_id for p in brief.validation_plan] == [
        s.hypothesis.id for s in brief.selected
    ]
    assert [e.id for e in brief.evidence] == ["E1", "E2", "E3"]
    assert brief.gaps == ["no data on household size"]
    assert "not verified" in " ".join(brief.limitations)
    assert "none is a verified finding" in brief.summary
    assert not brief.needs_human_review
    assert brief.errors == []
    # four hypotheses, two reviewers each; one cycle, no evolution
    assert purposes(outcome.model) == {
        "planner/gaps": 1,
        "planner/hypotheses": 1,
        "reviewer/critique": 8,
        "ranker/compare": purposes(outcome.model)["ranker/compare"],
        "planner/validation": 1,
    }
    assert result.iterations == 1


async def test_every_request_carries_the_documented_context() -> None:
    # The README's table: what each role and purpose is asked, with what.
    weak = scores(plausibility=0.2)
    script = ExploreScript(
        generated=[
            Idea("Solo cooks leave because every recipe serves four", strength=0.9),
            Idea("Leftovers make planning feel wasteful", [weak], strength=0.5),
        ],
        evolved=[[Idea("Cooks quit when skipping a week wastes bought food")]],
    )
    spec = explore_spec(
        select=2, domain="product", constraints=["no new surveys"]
    ).model_copy(update={"metadata": {"ticket": 7}})
    outcome = await run_explore(spec, script)
    model = outcome.model
    assert outcome.result.status is RunStatus.COMPLETED
    for call in model.calls:
        ctx = call.context
        assert ctx["run_kind"] == "explore"
        assert ctx["goal"] == outcome.result.goal
        assert ctx["metadata"] == {"ticket": 7}
        assert ctx["context"] == spec.context
        assert (ctx["domain"], ctx["constraints"]) == ("product", ["no new surveys"])
        assert all(isinstance(e, EvidenceItem) for e in ctx["evidence"])
        assert [e.id for e in ctx["evidence"]] == ["E1", "E2", "E3"]
    documented = {
        ("planner", "gaps"): (ContextAnalysis, set()),
        ("planner", "hypotheses"): (
            HypothesisBatch,
            {"gaps", "questions", "count", "existing", "iteration"},
        ),
        ("reviewer", "critique"): (
            Critique,
            {"hypothesis", "hypothesis_id", "lenses", "reviewer_index", "reviewers"},
        ),
        ("ranker", "compare"): (Comparison, {"a", "b", "a_id", "b_id"}),
        ("evolver", "evolve"): (
            HypothesisBatch,
            {"candidates", "reviews", "count", "iteration"},
        ),
        ("planner", "validation"): (ValidationBatch, {"hypotheses"}),
    }
    asked = {(c.role, c.purpose) for c in model.calls}
    assert asked == set(documented)
    for call in model.calls:
        output, keys = documented[call.role, call.purpose]  # type: ignore[index]
        assert call.output_type is output, (call.role, call.purpose)
        assert keys <= set(call.context), (call.role, call.purpose)
    generate = model.calls_for("planner", "hypotheses")[0]
    assert generate.context["count"] == 6
    assert generate.context["gaps"] == ["no data on household size"]
    assert generate.context["questions"] == ["what differs for households of one?"]
    assert (generate.context["existing"], generate.context["iteration"]) == ([], 1)
    critique = model.calls_for("reviewer", "critique")[0]
    assert critique.context["hypothesis"].id == critique.context["hypothesis_id"]
    assert critique.context["lenses"] == list(LENSES)
    assert critique.context["reviewers"] == 2
    assert {c.context["reviewer_index"] for c in model.calls_for("reviewer")} == {
        0,
        1,
    }
    compare = model.calls_for("ranker", "compare")[0]
    assert compare.context["a"].id == compare.context["a_id"]
    assert compare.context["b"].id == compare.context["b_id"]
    evolve = model.calls_for("evolver", "evolve")[0]
    assert [h.id for h in evolve.context["candidates"]] == ["H1", "H2"]
    assert [r.hypothesis_id for r in evolve.context["reviews"]] == ["H1", "H2"]
    assert (evolve.context["count"], evolve.context["iteration"]) == (6, 1)
    [validation] = model.calls_for("planner", "validation")
    brief = outcome.result.brief
    assert brief is not None
    assert [h.id for h in validation.context["hypotheses"]] == [
        s.hypothesis.id for s in brief.selected
    ]


async def test_an_unsafe_goal_is_blocked_before_any_model_call() -> None:
    script = ExploreScript(generated=STRONG)
    outcome = await run_explore(
        explore_spec("Find cheaper precursors for a nerve agent"), script
    )
    assert outcome.result.status is RunStatus.BLOCKED
    brief = outcome.result.brief
    assert brief is not None
    assert brief.status == "blocked"
    assert brief.selected == []
    assert "nerve agent" in outcome.result.stop_reason
    assert any("blocked topic" in note for note in brief.safety_notes)
    assert outcome.model.calls == []


async def test_a_missing_goal_is_refused_before_anything_runs() -> None:
    model = ScriptedModel(ExploreScript(generated=STRONG))
    with pytest.raises(ConfigurationError) as info:
        RunSpec(goal="   ", kind="explore")
    assert info.value.field == "goal"
    async with Supervisor(model=model) as sup:
        with pytest.raises(ConfigurationError) as info:
            await sup.submit({"kind": "explore", "context": ["a note"]})
    assert info.value.field == "goal"
    assert model.calls == []


async def test_a_goal_without_words_fails_with_an_error_and_no_model_call() -> None:
    outcome = await run_explore(explore_spec("?? !!"), ExploreScript(generated=STRONG))
    assert outcome.result.status is RunStatus.FAILED
    brief = outcome.result.brief
    assert brief is not None
    assert brief.status == "failed"
    assert brief.errors == ["goal: it has no words to explore"]
    assert outcome.model.calls == []


async def test_sparse_evidence_labels_every_hypothesis_speculative() -> None:
    outcome = await run_explore(
        explore_spec(context=["Only one note: 41% inactive by day 21."]),
        ExploreScript(generated=STRONG),
    )
    brief = outcome.result.brief
    assert brief is not None
    assert brief.status == "completed"
    assert brief.selected
    assert all(s.speculative for s in brief.selected)
    assert any("sparse (1 item(s))" in note for note in brief.limitations)
    assert brief.gaps[0] == "only 1 evidence item(s) were supplied"


async def test_uncited_hypotheses_are_speculative_and_unknown_refs_are_dropped() -> (
    None
):
    ideas = [
        Idea("Solo cooks leave because every recipe serves four", evidence=[]),
        Idea("Leftovers make planning feel wasteful", evidence=["E2", "E9"]),
        Idea("Cooks without a budget lose their reason to plan", evidence=["E3"]),
    ]
    outcome = await run_explore(explore_spec(), ExploreScript(generated=ideas))
    brief = outcome.result.brief
    assert brief is not None
    by_id = {s.hypothesis.id: s for s in brief.selected}
    assert by_id["H1"].speculative
    assert not by_id["H3"].speculative
    assert by_id["H2"].hypothesis.evidence_refs == ["E2"]
    assert "H2 cited unknown evidence E9" in brief.errors
    assert "H1 cites no evidence: it is speculative." in brief.limitations
    # Every answer came and was used: none is said to have failed.
    assert not any("answer(s) were malformed" in n for n in brief.limitations)
    assert any(n.startswith("1 problem(s) with model") for n in brief.limitations)


async def test_the_brief_lists_the_assumptions_of_the_selected_hypotheses_once() -> (
    None
):
    household = "households of one cook for themselves"
    ideas = [
        Idea(STRONG[0].statement, strength=0.9, assumptions=[household]),
        Idea(
            STRONG[1].statement,
            strength=0.7,
            assumptions=["leftovers are thrown away", household],
        ),
        Idea(STRONG[3].statement, strength=0.1, assumptions=["skipping is rare"]),
    ]
    outcome = await run_explore(explore_spec(select=2), ExploreScript(generated=ideas))
    brief = outcome.result.brief
    assert brief is not None
    assert [s.hypothesis.id for s in brief.selected] == ["H1", "H2"]
    # H3 is left out, and so is what only it assumes.
    assert brief.assumptions == [household, "leftovers are thrown away"]


async def test_near_duplicates_are_clustered_and_the_selection_stays_diverse() -> None:
    ideas = [
        Idea("Solo cooks leave because every recipe serves four", strength=0.6),
        Idea("Solo cooks leave because each recipe serves four", strength=0.9),
        Idea("Solo cooks leave since every recipe serves four people", strength=0.3),
        Idea("Leftovers pile up and make planning feel wasteful", strength=0.5),
        Idea("Cooks without a weekly budget lose their reason to plan", strength=0.4),
    ]
    outcome = await run_explore(explore_spec(), ExploreScript(generated=ideas))
    brief = outcome.result.brief
    assert brief is not None
    assert brief.status == "completed"
    chosen = [s.hypothesis.statement for s in brief.selected]
    assert len(chosen) == 3
    for n, a in enumerate(chosen):
        for b in chosen[n + 1 :]:
            assert similarity(a, b) < 0.6
    # the strongest of the three rephrasings represents them
    assert brief.selected[0].hypothesis.id == "H2"
    assert brief.selected[0].cluster_size == 3
    reasons = {r.hypothesis_id: r.reason for r in brief.rejected}
    assert reasons == {"H1": "near-duplicate of H2", "H3": "near-duplicate of H2"}


async def test_low_scores_evolve_new_candidates_while_under_the_limit() -> None:
    weak = scores(plausibility=0.2)
    script = ExploreScript(
        generated=[
            Idea("Solo cooks leave because every recipe serves four", strength=0.9),
            Idea("Leftovers make planning feel wasteful", [weak], strength=0.5),
            Idea("Cooks quit when they cannot skip a week", [weak], strength=0.4),
        ],
        evolved=[
            [
                Idea("Solo cooks with leftovers quit when recipes serve four"),
                Idea("Cooks quit when skipping a week wastes bought food"),
            ]
        ],
    )
    outcome = await run_explore(explore_spec(max_iterations=3), script)
    result, brief = outcome.result, outcome.result.brief
    assert brief is not None
    assert brief.status == "completed"
    assert purposes(outcome.model)["evolver/evolve"] == 1
    assert result.iterations == 2
    evolve = outcome.model.calls_for("evolver", "evolve")[0]
    given = [h.id for h in evolve.context["candidates"]]
    assert given[0] == "H1"
    state = result  # hypotheses live in the journal; the brief shows the chosen
    evolved = [s.hypothesis for s in brief.selected if s.hypothesis.origin == "evolved"]
    assert sorted(h.id for h in evolved) == ["H4", "H5"]
    assert all(h.parent_ids == given for h in evolved)
    assert all(h.iteration == 2 for h in evolved)
    # the weak originals stay as they were: evolving never edits a candidate
    added = [e for e in outcome.journal if e.kind == "hypotheses_added"]
    assert [h.statement for h in added[0].hypotheses][1] == (
        "Leftovers make planning feel wasteful"
    )
    assert state.status is RunStatus.COMPLETED


@pytest.mark.parametrize("limit", [1, 2])
async def test_the_iteration_limit_stops_refinement_with_a_needs_review_brief(
    limit: int,
) -> None:
    weak = scores(evidence=0.1)
    ideas = [
        Idea("Solo cooks leave because every recipe serves four", [weak]),
        Idea("Leftovers make planning feel wasteful", [weak]),
    ]
    script = ExploreScript(
        generated=ideas,
        evolved=[[Idea("Portions for one would keep solo cooks", [weak])]],
    )
    outcome = await run_explore(explore_spec(max_iterations=limit), script)
    result, brief = outcome.result, outcome.result.brief
    assert result.status is RunStatus.COMPLETED
    assert brief is not None
    assert brief.status == "needs_review"
    assert result.stop_reason.startswith("max_iterations: ")
    assert purposes(outcome.model).get("evolver/evolve", 0) == limit - 1
    assert result.iterations == limit
    assert brief.selected
    assert not any(s.meets_thresholds for s in brief.selected)
    assert any(
        "falls short of the thresholds: evidence" in n for n in brief.limitations
    )


async def test_no_usable_candidate_fails_the_brief_without_an_exception() -> None:
    unsafe = scores(safety=0.1)
    script = ExploreScript(
        generated=[Idea("Track cooks' locations to nudge them", [unsafe])],
        evolved=[[Idea("Read cooks' messages to find churn signals", [unsafe])]],
    )
    outcome = await run_explore(explore_spec(max_iterations=2), script)
    result, brief = outcome.result, outcome.result.brief
    assert result.status is RunStatus.FAILED
    assert brief is not None
    assert brief.status == "failed"
    assert brief.selected == []
    assert {r.reason for r in brief.rejected} == {
        "safety or ethical concern (safety 0.1)"
    }
    # Cycle 2's planner proposes H1 again, word for word: it is not reviewed
    # again, so the concern is raised once.
    assert len(brief.safety_notes) == 1
    assert brief.errors == [
        "a generated hypothesis repeating H1 word for word was dropped"
    ]
    assert brief.needs_human_review  # concerns were raised, nothing to approve


async def test_a_hypothesis_set_aside_for_safety_is_not_reviewed_again() -> None:
    risky = "Cooks leave when we stop tracking their location"
    script = ExploreScript(
        generated=[
            Idea(risky, [scores(safety=0.1)]),
            Idea("Recipes serve four", [scores(plausibility=0.1)]),
        ],
        # The evolver proposes H1 again, only its case and punctuation
        # changed, and this time reviewers find nothing wrong with it.
        evolved=[[Idea(f"{risky.lower()}.", [scores()])]],
    )
    outcome = await run_explore(
        explore_spec(max_iterations=2, select=1),
        script,
        resolve=lambda request: GateResolution(decision="approve", by="ana"),
    )
    brief = outcome.result.brief
    assert brief is not None
    assert [s.hypothesis.id for s in brief.selected] == ["H2"]
    assert [r.hypothesis_id for r in brief.rejected] == ["H1"]
    assert "an evolved hypothesis repeating H1 word for word was dropped" in (
        brief.errors
    )
    statements = [
        r.context["hypothesis"].statement
        for r in outcome.model.calls_for("reviewer", "critique")
    ]
    assert f"{risky.lower()}." not in statements


async def test_a_hypothesis_on_a_blocked_topic_is_set_aside_unreviewed() -> None:
    blocked = "Cooks leave after a ransomware scare at the recipe site"
    script = ExploreScript(
        generated=[
            Idea("Solo cooks leave because recipes serve four", strength=0.9),
            Idea(blocked, strength=1.0),  # and reviewers would find it safe
        ],
    )
    outcome = await run_explore(
        explore_spec(max_iterations=1, select=1),
        script,
        resolve=lambda request: GateResolution(decision="approve", by="ana"),
    )
    result, brief = outcome.result, outcome.result.brief
    assert result.status is RunStatus.COMPLETED
    assert brief is not None
    assert [s.hypothesis.id for s in brief.selected] == ["H1"]
    assert [(r.hypothesis_id, r.reason) for r in brief.rejected] == [
        ("H2", "safety policy: touches a blocked topic: ransomware")
    ]
    assert brief.safety_notes == ["H2: touches a blocked topic: ransomware"]
    assert brief.reviewed_by == "ana"  # a safety concern: a person looked
    reviewed = {
        r.context["hypothesis_id"]
        for r in outcome.model.calls_for("reviewer", "critique")
    }
    assert reviewed == {"H1"}
    assert outcome.replayed == result


async def test_a_hypothesis_whose_rationale_touches_a_blocked_topic_is_set_aside() -> (
    None
):
    # Its statement is clean; the policy binds the rationale all the same.
    clean = "Cooks leave after a scare at the recipe site"
    script = ExploreScript(
        generated=[
            Idea("Solo cooks leave because recipes serve four", strength=0.9),
            Idea(clean, strength=1.0),
        ],
    )

    def batch(request: ModelRequest) -> HypothesisBatch:
        first, second = (i.hypothesis() for i in script.generated)
        risky = second.model_copy(update={"rationale": "a ransomware scare"})
        return HypothesisBatch(hypotheses=[first, risky])

    script.broken["hypotheses"] = batch
    outcome = await run_explore(
        explore_spec(max_iterations=1, select=1),
        script,
        resolve=lambda request: GateResolution(decision="approve", by="ana"),
    )
    brief = outcome.result.brief
    assert brief is not None
    assert [s.hypothesis.id for s in brief.selected] == ["H1"]
    assert [(r.hypothesis_id, r.reason) for r in brief.rejected] == [
        ("H2", "safety policy: touches a blocked topic: ransomware")
    ]
    reviewed = {
        r.context["hypothesis_id"]
        for r in outcome.model.calls_for("reviewer", "critique")
    }
    assert reviewed == {"H1"}


async def test_ids_are_the_supervisors_and_default_settings_are_the_documented() -> (
    None
):
    # A model's ids are replaced by H1, H2...; hypotheses are asked at 0.8;
    # ratings start at 1200 and move by a K factor of 32.
    script = ExploreScript(generated=STRONG[:3])

    def batch(request: ModelRequest) -> HypothesisBatch:
        named = zip(("H9", "idea-a", "H1"), script.generated, strict=True)
        return HypothesisBatch(
            hypotheses=[i.hypothesis().model_copy(update={"id": n}) for n, i in named]
        )

    script.broken["hypotheses"] = batch
    outcome = await run_explore(explore_spec(), script)
    [added] = [e for e in outcome.journal if e.kind == "hypotheses_added"]
    assert [h.id for h in added.hypotheses] == ["H1", "H2", "H3"]
    assert [h.statement for h in added.hypotheses] == [
        i.statement for i in script.generated
    ]
    [generate] = outcome.model.calls_for("planner", "hypotheses")
    assert generate.temperature == 0.8
    first = next(e for e in outcome.journal if e.kind == "hypotheses_compared")
    record = first.comparisons[0]
    # Equal ratings at 1200: the winner takes K/2 = 16 from the loser.
    assert sorted((record.rating_a, record.rating_b)) == [1184.0, 1216.0]


async def test_malformed_output_is_asked_once_more_then_recorded() -> None:
    answered: list[str] = []

    def broken_review(request):
        answered.append(request.context["hypothesis_id"])
        if request.context["hypothesis_id"] == "H2":
            return {"scores": {"novelty": 0.5}}  # misses six lenses
        return Critique(scores=scores())

    script = ExploreScript(generated=STRONG, broken={"critique": broken_review})
    outcome = await run_explore(explore_spec(), script)
    brief = outcome.result.brief
    assert outcome.result.status is RunStatus.COMPLETED
    assert brief is not None
    # two reviewers, each asked twice for H2
    assert answered.count("H2") == 4
    malformed = [e for e in brief.errors if "malformed output" in e]
    assert len(malformed) == 4
    assert all("reviewer/critique" in e and "miss the lens" in e for e in malformed)
    assert {r.hypothesis_id: r.reason for r in brief.rejected} == {
        "H2": "could not be reviewed (malformed or failed reviews)"
    }
    assert any("malformed or failed" in note for note in brief.limitations)


async def test_a_critique_missing_a_lens_is_asked_again_naming_it_and_then_used() -> (
    None
):
    asked: list[dict[str, Any]] = []

    def forgets_safety_at_first(request: ModelRequest) -> Critique:
        asked.append(request.context)
        full = scores()
        if "answer_problem" not in request.context:
            del full["safety"]
        return Critique(scores=full)

    script = ExploreScript(
        generated=STRONG[:3], broken={"critique": forgets_safety_at_first}
    )
    outcome = await run_explore(explore_spec(), script)
    brief = outcome.result.brief
    assert brief is not None
    # Three hypotheses, two reviewers: each critique asked twice.
    assert len(asked) == 12
    problems = [ctx.get("answer_problem") for ctx in asked]
    assert problems.count(None) == 6
    assert problems.count("scores miss the lens(es) safety") == 6
    # The second answers were whole: every hypothesis reviewed, no error kept.
    assert brief.status == "completed"
    assert [s.hypothesis.id for s in brief.selected] == ["H1", "H2", "H3"]
    assert brief.errors == []


async def test_the_tokens_of_a_rejected_answer_count_toward_the_runs_usage() -> None:
    # As OpenAIModel reports an answer still invalid after its re-ask.
    def costly_failure(request):
        if request.context["hypothesis_id"] == "H2":
            raise ModelOutputError(
                "not a Critique", usage=TokenUsage(input_tokens=10, calls=1)
            )
        return Critique(scores=scores())

    script = ExploreScript(generated=STRONG, broken={"critique": costly_failure})
    outcome = await run_explore(explore_spec(), script)
    reviewer = outcome.result.usage.by_role["reviewer"]
    # Two reviewers, each asked twice for H2; the accepted calls cost nothing.
    assert reviewer.input_tokens == 4 * 10
    assert outcome.replayed == outcome.result


async def test_rejected_credentials_end_an_explore_run_after_one_call() -> None:
    def rejected(request: ModelRequest) -> Any:
        raise ModelAuthenticationError(
            "the endpoint rejected the credentials (401): check OPENAI_API_KEY"
        )

    script = ExploreScript(generated=STRONG, broken={"hypotheses": rejected})
    outcome = await run_explore(explore_spec(max_iterations=10), script)
    result = outcome.result
    assert result.status is RunStatus.FAILED
    assert "OPENAI_API_KEY" in (result.stop_reason or "")
    # Asked once: neither re-asked as a malformed answer nor retried.
    assert purposes(outcome.model)["planner/hypotheses"] == 1
    assert [f.error_type for f in result.model_failures] == ["ModelAuthenticationError"]
    assert outcome.replayed == result


async def test_a_wrong_type_or_a_model_error_is_recorded_not_raised() -> None:
    calls = {"n": 0}

    def flaky_generation(request):
        calls["n"] += 1
        if calls["n"] == 1:
            return Critique(scores={})  # the wrong type
        if calls["n"] == 2:
            raise ModelError("the model returned invalid JSON")
        return HypothesisBatch(hypotheses=[i.hypothesis() for i in STRONG])

    script = ExploreScript(generated=STRONG, broken={"hypotheses": flaky_generation})
    outcome = await run_explore(explore_spec(max_iterations=2), script)
    result, brief = outcome.result, outcome.result.brief
    assert brief is not None
    assert result.status is RunStatus.COMPLETED
    assert brief.status == "completed"
    assert brief.errors[0].startswith("planner/hypotheses: malformed output: ")
    assert (
        "expected HypothesisBatch" in brief.errors[0] or "Critique" in brief.errors[0]
    )
    assert "invalid JSON" in brief.errors[1]
    # the first cycle had nothing to review; the second generated again
    assert purposes(outcome.model)["planner/hypotheses"] == 3
    assert result.iterations == 2
    errors = [e for e in outcome.journal if e.kind == "explore_error"]
    assert errors
    assert errors[0].errors[:2] == brief.errors[:2]


async def test_a_call_crashing_on_every_attempt_is_recorded_and_the_run_goes_on() -> (
    None
):
    plain = ExploreScript(generated=STRONG)
    crashed: list[tuple[str, str]] = []

    def crash_on_first_pair(request):
        pair = (request.context["a_id"], request.context["b_id"])
        if not crashed or (crashed[0] == pair and len(crashed) < 2):
            crashed.append(pair)
            raise RuntimeError("ranker process died")
        return plain(request)

    script = ExploreScript(generated=STRONG, broken={"compare": crash_on_first_pair})
    outcome = await run_explore(explore_spec(), script)
    brief = outcome.result.brief
    assert outcome.result.status is RunStatus.COMPLETED
    assert brief is not None
    assert brief.status == "completed"
    assert len(crashed) == 2  # asked, then retried once, like any crash
    failures = [e for e in brief.errors if e.startswith("ranker/compare: ")]
    assert failures == [failures[0]]
    assert "ranker failed 2 time(s)" in failures[0]
    played = [
        c
        for e in outcome.journal
        if e.kind == "hypotheses_compared"
        for c in e.comparisons
    ]
    # every comparison asked made a record, except the one that crashed twice
    assert len(played) == len(outcome.model.calls_for("ranker", "compare")) - 2
    assert outcome.replayed == outcome.result


async def test_a_role_that_stops_fails_the_run_with_a_brief_of_what_was_found() -> None:
    def crash(request):
        raise RuntimeError("ranker process died")

    script = ExploreScript(generated=STRONG, broken={"compare": crash})
    outcome = await run_explore(explore_spec(), script, max_restarts=1)
    result, brief = outcome.result, outcome.result.brief
    assert result.status is RunStatus.FAILED
    assert "the ranker role stopped" in result.stop_reason
    assert brief is not None
    assert brief.status == "needs_review"
    assert "ended early" in brief.summary
    assert outcome.replayed == result


async def test_a_spent_token_budget_ends_the_run_with_a_brief_of_what_was_found() -> (
    None
):
    spec = explore_spec().model_copy(
        update={"limits": Limits(token_budget=60, max_iterations=3)}
    )
    from replan import TokenUsage

    model = ScriptedModel(
        ExploreScript(generated=STRONG), usage=TokenUsage(input_tokens=5, calls=1)
    )
    outcome = await run_explore(spec, model)
    result, brief = outcome.result, outcome.result.brief
    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason.startswith("token_budget")
    assert brief is not None
    assert brief.status in ("needs_review", "failed")
    assert "ended early" in brief.summary
    assert outcome.replayed == result


async def test_a_deadline_ends_the_run_with_a_brief_of_what_was_found() -> None:
    spec = explore_spec().model_copy(
        update={"limits": Limits(deadline_s=0.3, max_iterations=3)}
    )
    model = ScriptedModel(ExploreScript(generated=STRONG), latency_s=0.1)
    outcome = await run_explore(spec, model)
    result, brief = outcome.result, outcome.result.brief
    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason == "deadline_s: 0.3s passed"
    assert brief is not None
    assert "ended early (deadline_s: 0.3s passed)" in brief.summary
    # The brief of an early end: candidates for a person, or none at all.
    assert brief.status == ("needs_review" if brief.selected else "failed")
    [issued] = [e for e in outcome.journal if e.kind == "brief_issued"]
    assert (issued.ended, issued.stop_reason) == (
        RunStatus.LIMIT_REACHED,
        result.stop_reason,
    )
    assert outcome.replayed == result


async def test_a_cancelled_run_ends_with_a_brief_of_what_was_found() -> None:
    model = ScriptedModel(ExploreScript(generated=STRONG), latency_s=0.05)
    with anyio.fail_after(20):
        async with Supervisor(model=model, store=MemoryStore()) as sup:
            handle = await sup.submit(explore_spec())
            async for event in handle.events():
                if event.kind == "hypotheses_added":
                    break
            await handle.cancel()
            result = await handle.result()
            replayed = await sup.replay(result.run_id)
    assert result.status is RunStatus.CANCELLED
    assert result.brief is not None
    assert "ended early (cancelled on request)" in result.brief.summary
    assert result.brief.status == (
        "needs_review" if result.brief.selected else "failed"
    )
    assert replayed == result


async def test_evolving_never_changes_an_existing_hypothesis() -> None:
    weak = scores(plausibility=0.3)
    script = ExploreScript(
        generated=[Idea("Solo cooks leave because every recipe serves four", [weak])],
        evolved=[[Idea("Solo cooks stay with single-portion recipes")]],
    )
    outcome = await run_explore(explore_spec(max_iterations=2, select=1), script)
    added = [
        h for e in outcome.journal if e.kind == "hypotheses_added" for h in e.hypotheses
    ]
    assert [h.id for h in added] == ["H1", "H2"]
    assert added[0].statement == "Solo cooks leave because every recipe serves four"
    assert added[1].origin == "evolved"
    assert added[1].parent_ids == ["H1"]


async def test_a_selection_approved_past_the_iteration_limit_keeps_the_limit() -> None:
    # Refinement stopped at max_iterations; reviewers disagree on H1, so a
    # person reviews: told of the limit too, and the limit stays the run's
    # stop reason once the person approves.
    ideas = [
        Idea(
            "Solo cooks leave because recipes serve four",
            [scores(0.8), scores(0.8, plausibility=0.1)],
            strength=0.9,
        ),
        Idea(
            "Leftovers make the weekly plan feel wasteful",
            [scores(0.2, safety=0.9)],
            strength=0.7,
        ),
    ]
    script = ExploreScript(
        generated=ideas,
        evolved=[[Idea("Weak evolved portions idea", [scores(0.2, safety=0.9)])]],
    )
    asked: list[str] = []

    def approve(request: Any) -> GateResolution:
        asked.append(request.reason)
        return GateResolution(decision="approve", by="ana")

    spec = explore_spec(max_iterations=1, select=2, disagreement=0.5)
    outcome = await run_explore(spec, script, resolve=approve)
    result, brief = outcome.result, outcome.result.brief
    assert brief is not None
    [reason] = asked
    assert "disagree" in reason
    assert "max_iterations: 1 cycle(s)" in reason
    assert brief.status == "completed"
    assert brief.reviewed_by == "ana"
    assert (result.stop_reason or "").startswith("max_iterations: 1 cycle(s)")
    assert outcome.replayed == result


async def test_a_malformed_answer_counts_when_its_re_ask_fails_transiently() -> None:
    # The re-ask of a malformed batch fails transiently on every attempt:
    # the first answer's tokens were still spent, and are the run's.
    handed: dict[str, int] = {}

    def usage(request: ModelRequest) -> TokenUsage:
        handed[request.role] = handed.get(request.role, 0) + 1
        return TokenUsage(input_tokens=3, calls=1)

    script = ExploreScript(generated=STRONG)

    def flaky(request: ModelRequest) -> Any:
        if "answer_problem" in request.context:
            raise TransientModelError("503 the server is restarting")
        return {"hypotheses": "many"}

    script.broken["hypotheses"] = flaky
    spec = explore_spec(max_iterations=1).model_copy(
        update={"limits": Limits(max_iterations=1, max_task_attempts=1)}
    )
    outcome = await run_explore(spec, ScriptedModel(script, usage=usage))
    planner = outcome.result.usage.by_role["planner"]
    assert (planner.calls, planner.input_tokens) == (handed["planner"], 3 * 2)
    assert outcome.replayed == outcome.result
