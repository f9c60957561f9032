"""Resuming explore runs: the journaled steps are replayed, never redone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from explore_scripts import (
    ExploreScript,
    Idea,
    Outcome,
    explore_spec,
    run_explore,
    scores,
)

from replan import (
    GateResolution,
    MemoryStore,
    ModelRequest,
    RunResult,
    RunSpec,
    RunStatus,
    ScriptedModel,
    Supervisor,
    SupervisorError,
    TokenUsage,
)
from replan.messages import (
    Event,
    GateOpened,
    GateRequest,
    GateResolved,
    Hypothesis,
    Limits,
)
from replan.store import SQLiteStore
from replan.supervisor import replay
from replan.supervisor._run import summary_of

WEAK = scores(plausibility=0.2)
MINE = Idea(
    "Cooks stay when the app plans around what is already in the fridge",
    strength=1.0,
)


def two_cycles() -> ExploreScript:
    """Two cycles (the first evolves), then reviewers who disagree sharply
    about the strongest candidate open a review gate."""
    return ExploreScript(
        generated=[
            Idea(
                "Solo cooks leave because every recipe serves four",
                [scores(plausibility=0.95), scores(plausibility=0.15)],
                strength=0.9,
            ),
            Idea("Leftovers make planning feel wasteful", [WEAK], strength=0.5),
            Idea("Cooks quit when they cannot skip a week", [WEAK], strength=0.4),
        ],
        evolved=[
            [
                Idea("Solo cooks with leftovers quit when recipes serve four"),
                Idea("Cooks quit when skipping a week wastes bought food"),
            ]
        ],
        extra=[MINE],
    )


def approve(request: GateRequest) -> GateResolution:
    return GateResolution(decision="approve", by="ana")


def add_mine(request: GateRequest) -> GateResolution:
    return GateResolution(
        decision="edit",
        hypotheses=[Hypothesis(statement=MINE.statement, evidence_refs=["E2"])],
        by="ana",
    )


def purposes(model: ScriptedModel) -> Counter[str]:
    return Counter(f"{c.role}/{c.purpose}" for c in model.calls)


def same_run(result: RunResult, baseline: RunResult) -> bool:
    return result.model_copy(update={"run_id": baseline.run_id}) == baseline


async def stopped_at_gate(path: Path) -> tuple[str, GateRequest, ScriptedModel]:
    """Start a run, stop the supervisor while it waits at its review gate."""
    model = ScriptedModel(two_cycles())
    async with SQLiteStore(path) as store, Supervisor(model, store) as sup:
        handle = await sup.submit(explore_spec())
        async for event in handle.events():
            if isinstance(event, GateOpened):
                gate = event.request
                break
    return handle.run_id, gate, model


@pytest.mark.parametrize("answer", [approve, add_mine], ids=["approve", "edit"])
async def test_a_run_stopped_at_its_review_gate_resumes_at_that_gate(
    answer: Callable[[GateRequest], GateResolution], tmp_path: Path
) -> None:
    baseline = await run_explore(explore_spec(), two_cycles(), resolve=answer)
    with anyio.fail_after(20):
        run_id, gate, first = await stopped_at_gate(tmp_path / "j.db")
        second = ScriptedModel(two_cycles())
        async with (
            SQLiteStore(tmp_path / "j.db") as store,
            Supervisor(second, store, resume=True) as sup,
        ):
            # The same gate, listed once; nothing was asked again.
            assert sup.gates.pending() == [gate]
            assert second.calls == []
            handle = sup.get(run_id)
            assert handle.status is RunStatus.WAITING_FOR_HUMAN
            await sup.gates.resolve(gate.gate_id, answer(gate))
            result = await handle.result()
            assert sup.gates.pending() == []
            assert await sup.replay(run_id) == result
            journal = await store.read(run_id)
    made = purposes(second)
    assert made["planner/validation"] == 1
    if answer is add_mine:
        # A person's hypothesis: reviewed and played, as without the stop.
        assert made.keys() == {
            "planner/validation",
            "reviewer/critique",
            "ranker/compare",
        }
        assert made["reviewer/critique"] == 2
    else:
        assert made.keys() == {"planner/validation"}
    assert purposes(first) + purposes(second) == purposes(baseline.model)
    assert same_run(result, baseline.result)
    assert result.brief is not None
    assert result.brief.reviewed_by == "ana"
    assert [e.kind for e in journal].count("gate_opened") == 1


async def test_a_review_answered_just_before_the_stop_is_acted_on(
    tmp_path: Path,
) -> None:
    baseline = await run_explore(explore_spec(), two_cycles(), resolve=approve)
    with anyio.fail_after(20):
        run_id, gate, _ = await stopped_at_gate(tmp_path / "j.db")
        async with SQLiteStore(tmp_path / "j.db") as store:
            # Journal the answer by hand, as if the stop came right after it.
            events = await store.read(run_id)
            answered = GateResolved(
                seq=len(events) + 1,
                at=events[-1].at,
                gate_id=gate.gate_id,
                resolution=approve(gate),
            )
            await store.append(
                run_id, [answered], summary_of(replay([*events, answered]))
            )
        second = ScriptedModel(two_cycles())
        async with (
            SQLiteStore(tmp_path / "j.db") as store,
            Supervisor(second, store, resume=True) as sup,
        ):
            assert sup.gates.pending() == []
            result = await sup.get(run_id).result()
    assert purposes(second) == Counter({"planner/validation": 1})
    assert same_run(result, baseline.result)


def stuck_at_compare(
    script: ExploreScript, nth: int, reached: anyio.Event
) -> Callable[[ModelRequest], Any]:
    """The script, except that the ``nth`` comparison never returns."""
    compares = 0

    async def answer(request: ModelRequest) -> Any:
        nonlocal compares
        if request.purpose == "compare":
            compares += 1
            if compares == nth:
                reached.set()
                await anyio.sleep_forever()
        return script(request)

    return answer


@pytest.mark.parametrize("nth", [2, 9])
async def test_a_run_stopped_mid_tournament_redoes_only_the_unjournaled_round(
    nth: int, tmp_path: Path
) -> None:
    baseline: Outcome = await run_explore(explore_spec(), two_cycles(), resolve=approve)
    reached = anyio.Event()
    first = ScriptedModel(stuck_at_compare(two_cycles(), nth, reached))
    with anyio.fail_after(20):
        async with (
            SQLiteStore(tmp_path / "j.db") as store,
            Supervisor(first, store) as sup,
        ):
            run_id = (await sup.submit(explore_spec())).run_id
            await reached.wait()
        async with SQLiteStore(tmp_path / "j.db") as store:
            before: list[Event] = await store.read(run_id)
        second = ScriptedModel(two_cycles())
        async with (
            SQLiteStore(tmp_path / "j.db") as store,
            Supervisor(second, store, resume=True) as sup,
        ):
            [gate] = await wait_for_gate(sup, run_id)
            await sup.gates.resolve(gate.gate_id, approve(gate))
            result = await sup.get(run_id).result()
    journaled = sum(
        len(e.comparisons) for e in before if e.kind == "hypotheses_compared"
    )
    assert 0 < journaled < nth
    made = purposes(second)
    wanted = purposes(baseline.model)
    # Journaled comparisons are not judged again; the rest of the tournament
    # (and the round cut short) is, and the run ends as it would have.
    assert made["ranker/compare"] == wanted["ranker/compare"] - journaled
    assert made["planner/gaps"] == made["planner/hypotheses"] == 0
    reviewed_before = sum(
        len(e.reviews) + len(e.rejected)
        for e in before
        if e.kind == "hypotheses_reviewed"
    )
    assert made["reviewer/critique"] == (
        wanted["reviewer/critique"] - 2 * reviewed_before
    )
    assert same_run(result, baseline.result)


async def wait_for_gate(sup: Supervisor, run_id: str) -> list[GateRequest]:
    handle = sup.get(run_id)
    async for event in handle.events():
        if isinstance(event, GateOpened):
            break
    return sup.gates.pending(run_id)


def ranker_dies(script: ExploreScript) -> Callable[[ModelRequest], Any]:
    """The script, except that every comparison crashes the ranker."""

    def answer(request: ModelRequest) -> Any:
        if request.purpose == "compare":
            raise RuntimeError("ranker process died")
        return script(request)

    return answer


async def budget_spent_at_validation(spec: RunSpec, usage: TokenUsage) -> RunSpec:
    """``spec`` with a token budget spent just as the validation plans are
    asked for: the run ends early at its last model call."""
    free = await run_explore(
        spec, ScriptedModel(two_cycles(), usage=usage), resolve=approve
    )
    purposes = [call.purpose for call in free.model.calls]
    before = purposes.index("validation")
    budget = before * usage.total_tokens
    return spec.model_copy(update={"limits": Limits(token_budget=budget)})


@pytest.mark.parametrize(
    "ending", ["brief", "budget", "budget-at-the-last-call", "role-stopped"]
)
async def test_a_run_stopped_after_its_brief_ends_as_it_would_have(
    ending: str,
) -> None:
    spec = explore_spec()
    usage = TokenUsage()
    script: Callable[[ModelRequest], Any] = two_cycles()
    supervisor: dict[str, Any] = {}
    if ending == "budget":
        # The budget runs out mid-run: the brief says what was found so far.
        spec = spec.model_copy(update={"limits": Limits(token_budget=60)})
        usage = TokenUsage(input_tokens=5, calls=1)
    elif ending == "role-stopped":
        script, supervisor = ranker_dies(two_cycles()), {"max_restarts": 1}
    elif ending == "budget-at-the-last-call":
        # Replayed without model calls, the flow reaches its normal end here.
        usage = TokenUsage(input_tokens=5, calls=1)
        spec = await budget_spent_at_validation(spec, usage)
    baseline = await run_explore(
        spec, ScriptedModel(script, usage=usage), resolve=approve, **supervisor
    )
    wanted = {
        "brief": RunStatus.COMPLETED,
        "budget": RunStatus.LIMIT_REACHED,
        "role-stopped": RunStatus.FAILED,
        "budget-at-the-last-call": RunStatus.LIMIT_REACHED,
    }
    assert baseline.result.status is wanted[ending]
    *events, finished = baseline.journal
    assert finished.kind == "run_finished"
    # The journal as if the stop came between the brief and the run's end.
    store = MemoryStore()
    run_id = baseline.result.run_id
    await store.append(run_id, events, summary_of(replay(events)))
    model = ScriptedModel(two_cycles())
    with anyio.fail_after(10):
        async with Supervisor(model, store, resume=True, **supervisor) as sup:
            result = await sup.get(run_id).result()
    assert model.calls == []
    # Also the stop reason: "the ranker role stopped: ...", not a vaguer one.
    assert result == baseline.result


def malformed_plans() -> ExploreScript:
    """Two cycles and a review gate; the validation plans are malformed, so
    the errors are gathered just before the brief."""
    script = two_cycles()
    script.broken["validation"] = lambda request: {"plans": "none"}
    return script


async def test_a_run_stopped_between_any_two_appends_after_its_gate_ends_alike() -> (
    None
):
    """A crash can only leave whole appends; the run resumed from any of them
    ends as it would have. Errors journaled apart from their step would be
    gathered again by the redone step and listed twice."""
    baseline = await run_explore(explore_spec(), malformed_plans(), resolve=approve)
    brief = baseline.result.brief
    assert brief is not None
    assert len(brief.errors) == 2  # asked twice for the plans, both malformed
    kinds = [kind for append in baseline.appends for kind in append]
    assert kinds == [e.kind for e in baseline.journal]
    answered = next(
        i for i, append in enumerate(baseline.appends) if "gate_resolved" in append
    )
    run_id = baseline.result.run_id
    for kept in range(answered + 1, len(baseline.appends)):
        length = sum(len(append) for append in baseline.appends[:kept])
        events = baseline.journal[:length]
        store = MemoryStore()
        await store.append(run_id, events, summary_of(replay(events)))
        with anyio.fail_after(10):
            async with Supervisor(
                ScriptedModel(malformed_plans()), store, resume=True
            ) as sup:
                result = await sup.get(run_id).result()
        assert result == baseline.result, f"resumed after {kept} appends"


async def test_a_journal_that_does_not_fit_the_flow_leaves_the_run_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(20):
        run_id, _, _ = await stopped_at_gate(tmp_path / "j.db")
        async with SQLiteStore(tmp_path / "j.db") as store:
            events = await store.read(run_id)
        # Nothing between the context and the gate: no flow journals that.
        kept = [
            e
            for e in events
            if e.kind in ("run_submitted", "goal_screened", "context_explored")
            or isinstance(e, GateOpened)
        ]
        kept = [e.model_copy(update={"seq": i}) for i, e in enumerate(kept, 1)]
        store = MemoryStore()
        await store.append(run_id, kept, summary_of(replay(kept)))
        model = ScriptedModel(two_cycles())
        async with Supervisor(model, store, resume=True) as sup:
            with pytest.raises(SupervisorError, match="crashed"):
                await sup.get(run_id).result()
            assert sup.gates.pending() == []
        assert await store.read(run_id) == kept
    assert model.calls == []
    assert f"run {run_id} crashed" in caplog.text
    assert "expected CycleFinished next in the journal, found gate_opened" in (
        caplog.text
    )


@pytest.mark.parametrize("purpose", ["critique", "compare"])
async def test_answers_that_come_during_a_drain_are_journaled_before_the_stop(
    tmp_path: Path, purpose: str
) -> None:
    # A drain lets the calls in flight finish and reach the journal: the
    # answers taken are busy work until the append that journals them.
    ideas = [
        Idea("Solo cooks leave because recipes serve four", strength=0.9),
        Idea("Leftovers make the weekly plan feel wasteful", strength=0.7),
        Idea("Cooks without a budget lose a reason to plan", strength=0.6),
    ]
    path = tmp_path / "journal.db"
    slow = ScriptedModel(ExploreScript(generated=ideas), latency_s=0.2)
    with anyio.fail_after(20):
        async with SQLiteStore(path) as store, Supervisor(slow, store) as sup:
            handle = await sup.submit(explore_spec(select=2))
            while True:  # until one of the calls is in flight
                if any(c.purpose == purpose for c in slow.calls):
                    break
                await anyio.sleep(0.01)
            await sup.drain(10)
            made = len(slow.calls)  # the calls in flight when it began, too
        again = ScriptedModel(ExploreScript(generated=ideas))
        async with (
            SQLiteStore(path) as store,
            Supervisor(again, store, resume=True) as sup,
        ):
            result = await sup.get(handle.run_id).result()
    assert result.status is RunStatus.COMPLETED
    # What was asked before the drain is not asked again.
    uninterrupted = await run_explore(
        explore_spec(select=2), ExploreScript(generated=ideas)
    )
    assert made + len(again.calls) == len(uninterrupted.model.calls)
    assert result.usage.total.calls == uninterrupted.result.usage.total.calls
