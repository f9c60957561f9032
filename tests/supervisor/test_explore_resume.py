"""Resuming explore runs: the journaled steps are replayed, never redone."""

from __future__ import annotations

import signal
import sys
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
    ExploreErrorRecorded,
    GateOpened,
    GateRequest,
    GateResolved,
    HypothesesReviewed,
    Hypothesis,
    HypothesisCritiqued,
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
    """Add a hypothesis of one's own; approve the selection it changed."""
    if "the selection changed after the edit" in request.reason:
        return approve(request)
    return GateResolution(
        decision="edit",
        hypotheses=[Hypothesis(statement=MINE.statement, evidence_refs=["E2"])],
        by="ana",
    )


async def next_gate(handle: Any, after: GateRequest) -> GateRequest:
    """The first gate of the run opened after ``after``."""
    async for event in handle.events():
        if isinstance(event, GateOpened) and event.request.gate_id != after.gate_id:
            return event.request
    raise AssertionError("no other gate opened")


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
            if answer is add_mine:
                # The selection the hypothesis changed is shown again.
                again = await next_gate(handle, gate)
                await sup.gates.resolve(again.gate_id, answer(again))
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
    gates = 2 if answer is add_mine else 1
    assert [e.kind for e in journal].count("gate_opened") == gates


async def test_a_run_stopped_at_its_second_review_gate_resumes_at_that_gate(
    tmp_path: Path,
) -> None:
    baseline = await run_explore(explore_spec(), two_cycles(), resolve=add_mine)
    with anyio.fail_after(20):
        first = ScriptedModel(two_cycles())
        async with (
            SQLiteStore(tmp_path / "j.db") as store,
            Supervisor(first, store) as sup,
        ):
            handle = await sup.submit(explore_spec())
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    await sup.gates.resolve(
                        event.request.gate_id, add_mine(event.request)
                    )
                    break
            gate = await next_gate(handle, event.request)
        second = ScriptedModel(two_cycles())
        async with (
            SQLiteStore(tmp_path / "j.db") as store,
            Supervisor(second, store, resume=True) as sup,
        ):
            assert sup.gates.pending() == [gate]
            assert second.calls == []
            handle = sup.get(handle.run_id)
            await sup.gates.resolve(gate.gate_id, add_mine(gate))
            result = await handle.result()
            assert await sup.replay(handle.run_id) == result
    assert purposes(second) == {"planner/validation": 1}
    assert purposes(first) + purposes(second) == purposes(baseline.model)
    assert same_run(result, baseline.result)
    assert result.brief is not None
    assert result.brief.reviewed_by == "ana"
    assert result.brief.review_reasons[0].startswith("the selection changed")


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
    # The run's usage counts every comparison that answered: those of the
    # round cut short too (the stop journals their tokens), which the
    # resumed run asks again; the one that never answered is not counted.
    answered = purposes(first)["ranker/compare"] - 1 + made["ranker/compare"]
    usage = result.usage.by_role
    assert usage["ranker"].calls == answered
    assert {r: u for r, u in usage.items() if r != "ranker"} == {
        r: u for r, u in baseline.result.usage.by_role.items() if r != "ranker"
    }
    assert same_run(
        result.model_copy(update={"usage": baseline.result.usage}), baseline.result
    )


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


def stuck_at_critique(
    script: ExploreScript, nth: int, reached: anyio.Event
) -> Callable[[ModelRequest], Any]:
    """The script, except that the ``nth`` critique never returns."""
    critiques = 0

    async def answer(request: ModelRequest) -> Any:
        nonlocal critiques
        if request.purpose == "critique":
            critiques += 1
            if critiques == nth:
                reached.set()
                await anyio.sleep_forever()
        return script(request)

    return answer


def critiqued(journal: list[Event]) -> set[tuple[str, int]]:
    return {
        (e.hypothesis_id, e.reviewer)
        for e in journal
        if isinstance(e, HypothesisCritiqued)
    }


@pytest.mark.parametrize("nth", [2, 6, 9])
async def test_a_run_stopped_mid_review_asks_only_for_the_critiques_it_lacks(
    nth: int, tmp_path: Path
) -> None:
    # Six critiques in the first batch (three candidates, two reviewers),
    # four in the second: the stop comes in one batch or the other, and all
    # the batch's other calls answer meanwhile.
    answered = (6 if nth <= 6 else 10) - 1
    baseline = await run_explore(explore_spec(), two_cycles(), resolve=approve)
    reached = anyio.Event()
    first = ScriptedModel(stuck_at_critique(two_cycles(), nth, reached))
    with anyio.fail_after(20):
        async with (
            SQLiteStore(tmp_path / "j.db") as store,
            Supervisor(first, store) as sup,
        ):
            run_id = (await sup.submit(explore_spec())).run_id
            await reached.wait()
            while True:  # the others in flight answer; one never does
                if len(critiqued(await store.read(run_id))) == answered:
                    break
                await anyio.sleep(0.01)
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
            after = await store.read(run_id)
    kept = critiqued(before)
    assert len(kept) == answered
    assert not any(isinstance(e, HypothesesReviewed) for e in before[-answered:])
    made = purposes(second)
    wanted = purposes(baseline.model)
    # Every answered critique was kept: only the unanswered one (and those
    # of the batches after it) are asked.
    assert made["reviewer/critique"] == wanted["reviewer/critique"] - len(kept)
    assert made["planner/gaps"] == made["planner/hypotheses"] == 0
    assert (
        len([e for e in after if isinstance(e, HypothesisCritiqued)])
        == (wanted["reviewer/critique"])
    )
    assert same_run(result, baseline.result)
    assert replay(after).result() == result


async def test_a_process_killed_mid_review_keeps_the_critiques_it_was_given(
    tmp_path: Path,
) -> None:
    # kill -9 while the fourth critique of the first batch is out: the five
    # others were answered, and are not asked (nor paid for) again.
    baseline = await run_explore(explore_spec(), two_cycles(), resolve=approve)
    path = tmp_path / "j.db"
    child = Path(__file__).with_name("explore_killed.py")
    command = [sys.executable, str(child), str(path), "4", "5"]
    with anyio.fail_after(30):
        async with await anyio.open_process(command, stderr=None) as proc:
            assert proc.stdout is not None
            try:  # until the child says the five are journaled
                printed = (await proc.stdout.receive()).decode()
            finally:
                proc.kill()  # SIGKILL: no cleanup of any kind
                await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    run_id = printed.strip()
    second = ScriptedModel(two_cycles())
    with anyio.fail_after(20):
        async with SQLiteStore(path) as store:
            before = await store.read(run_id)
            assert len(critiqued(before)) == 5
            assert not any(isinstance(e, HypothesesReviewed) for e in before)
            async with Supervisor(second, store, resume=True) as sup:
                [gate] = await wait_for_gate(sup, run_id)
                await sup.gates.resolve(gate.gate_id, approve(gate))
                result = await sup.get(run_id).result()
    made = purposes(second)
    assert made["reviewer/critique"] == purposes(baseline.model)[
        "reviewer/critique"
    ] - len(critiqued(before))
    assert made["planner/gaps"] == made["planner/hypotheses"] == 0
    assert same_run(result, baseline.result)


def some_critiques_fail() -> ExploreScript:
    """Two cycles and a review gate; some critiques are malformed, so the
    review batches journal errors."""
    script = two_cycles()

    def critique(request: ModelRequest) -> Any:
        if request.context["reviewer_index"] == 1 and (
            request.context["hypothesis_id"] in ("H1", "H3", "H5")
        ):
            return {"scores": "none"}
        script.broken.pop("critique")
        try:
            return script(request)
        finally:
            script.broken["critique"] = critique

    script.broken["critique"] = critique
    return script


async def test_a_run_stopped_between_any_two_appends_of_a_review_ends_alike() -> None:
    """A crash can only leave whole appends; resumed after any append of a
    review batch (or from the batch's start), the run asks for what it
    lacks and ends as it would have, errors included, in the same order."""
    baseline = await run_explore(explore_spec(), some_critiques_fail(), resolve=approve)
    brief = baseline.result.brief
    assert brief is not None
    assert len(brief.errors) == 6  # three malformed critiques, asked twice each
    assert [e for e in brief.errors if "reviewer/critique" in e] == brief.errors
    kinds = [kind for append in baseline.appends for kind in append]
    assert kinds == [e.kind for e in baseline.journal]
    in_review = [
        i
        for i, append in enumerate(baseline.appends)
        if "hypothesis_critiqued" in append or "hypotheses_added" in append
    ]
    assert len(in_review) > 4
    run_id = baseline.result.run_id
    for kept in (i + 1 for i in in_review):
        length = sum(len(append) for append in baseline.appends[:kept])
        events = baseline.journal[:length]
        store = MemoryStore()
        await store.append(run_id, events, summary_of(replay(events)))
        model = ScriptedModel(some_critiques_fail())
        with anyio.fail_after(10):
            result = await resume_approving(store, run_id, model)
        assert result == baseline.result, f"resumed after {kept} appends"
        asked = purposes(model)["reviewer/critique"]
        answered = len(critiqued(events))
        wanted = purposes(baseline.model)["reviewer/critique"]
        # Each malformed answer was asked twice, and journaled once.
        malformed_kept = sum(
            1 for e in events if isinstance(e, HypothesisCritiqued) and e.errors
        )
        assert asked == wanted - answered - malformed_kept, kept


async def resume_approving(
    store: MemoryStore, run_id: str, model: ScriptedModel
) -> RunResult:
    """Resume ``run_id`` to its end, approving at its review gate if any."""
    async with Supervisor(model, store, resume=True) as sup:
        handle = sup.get(run_id)
        for gate in sup.gates.pending(run_id):
            await sup.gates.resolve(gate.gate_id, approve(gate))
        async for event in handle.events():
            if isinstance(event, GateOpened):
                await sup.gates.resolve(event.request.gate_id, approve(event.request))
        return await handle.result()


def in_the_old_shape(outcome: Outcome) -> list[list[Event]]:
    """The appends of ``outcome`` as an earlier version made them: a review
    batch in one append, without critiques of their own, and the batch's
    errors just before its ``hypotheses_reviewed``."""
    events = iter(outcome.journal)
    old: list[list[Event]] = []
    batch: list[Event] = []
    errors: list[str] = []
    for kinds in outcome.appends:
        append = [next(events) for _ in kinds]
        if "hypothesis_critiqued" not in kinds:
            old.append(append)
            continue
        for e in append:
            if isinstance(e, HypothesisCritiqued):
                errors.extend(e.errors)
            elif isinstance(e, HypothesesReviewed):
                if errors:
                    batch.append(ExploreErrorRecorded(seq=1, at=e.at, errors=errors))
                old.append([*batch, e])
                batch, errors = [], []
            else:
                batch.append(e)
    seq = iter(range(1, len(outcome.journal) + 1))
    return [[e.model_copy(update={"seq": next(seq)}) for e in a] for a in old]


async def test_a_journal_of_the_earlier_shape_replays_and_resumes_as_before() -> None:
    baseline = await run_explore(explore_spec(), some_critiques_fail(), resolve=approve)
    appends = in_the_old_shape(baseline)
    old = [e for append in appends for e in append]
    assert not any(isinstance(e, HypothesisCritiqued) for e in old)
    assert replay(old).result() == baseline.result
    run_id = baseline.result.run_id
    batches = [
        n
        for n, append in enumerate(appends)
        if any(isinstance(e, HypothesesReviewed) for e in append)
    ]
    assert len(batches) == 2
    # Stopped during a batch (it journaled nothing then), or just after it.
    for kept in (batches[1], batches[1] + 1):
        events = [e for append in appends[:kept] for e in append]
        store = MemoryStore()
        await store.append(run_id, events, summary_of(replay(events)))
        model = ScriptedModel(some_critiques_fail())
        with anyio.fail_after(10):
            result = await resume_approving(store, run_id, model)
        assert result == baseline.result, f"resumed after {kept} appends"
        made = purposes(model)["reviewer/critique"]
        # The batch under way is reviewed again in full, as before; a
        # finished one is not. (Two candidates, two reviewers; the second
        # review of H5 is malformed, so asked twice.)
        assert made == (5 if kept == batches[1] else 0), kept
