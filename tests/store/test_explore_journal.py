"""Explore events survive the journal byte for byte and fold into the state."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from explore_samples import T0, explore_events
from stores import STORE_KINDS, open_store

from replan import replay
from replan.messages import (
    EVENT_ADAPTER,
    Critique,
    HypothesesReviewed,
    HypothesisCritiqued,
    RunSpec,
    RunStatus,
    RunSubmitted,
)
from replan.store import RunSummary, Store
from replan.supervisor._explore_state import fold_explore


def journal() -> list:
    submitted = RunSubmitted(
        seq=1,
        at=T0,
        run_id="x-1",
        spec=RunSpec(goal="why do solo cooks leave?", kind="explore"),
    )
    return [submitted, *explore_events(2)]


@pytest.fixture(params=STORE_KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    journal_store: Store = open_store(request.param, request, tmp_path)
    yield journal_store
    await journal_store.aclose()


@pytest.mark.parametrize("event", explore_events(), ids=lambda e: type(e).__name__)
def test_every_explore_event_round_trips_through_the_event_adapter(event) -> None:
    assert EVENT_ADAPTER.validate_json(EVENT_ADAPTER.dump_json(event)) == event


async def test_explore_events_round_trip_through_append_and_read(store: Store) -> None:
    events = journal()
    now = datetime.now(UTC)
    summary = RunSummary(
        run_id="x-1",
        goal="g",
        kind="explore",
        pattern="discovery",
        status=RunStatus.RUNNING,
        created_at=now,
        updated_at=now,
        last_seq=len(events),
    )
    await store.append("x-1", events, summary)
    assert await store.read("x-1") == events


def test_replaying_explore_events_rebuilds_ratings_rejections_and_the_brief() -> None:
    state = replay(journal())
    explore = state.explore
    assert explore is not None
    assert list(explore.hypotheses) == ["H1", "H2"]
    assert explore.ratings["H1"].rating == 1216.0
    assert (explore.ratings["H1"].wins, explore.ratings["H2"].losses) == (1, 1)
    assert explore.rejected["H2"].reason == "dup"
    assert explore.active == ["H1"]
    assert state.iterations == 1
    assert state.result().brief == explore_events()[-1].brief


def test_a_journal_that_reuses_a_hypothesis_id_is_refused() -> None:
    events = journal()
    added = events[3]
    again = added.model_copy(update={"seq": len(events) + 1})
    with pytest.raises(ValueError, match="H1 already exists"):
        replay([*events, again])


def critiqued(hid: str, reviewer: int, *errors: str) -> HypothesisCritiqued:
    return HypothesisCritiqued(
        seq=99,
        at=T0,
        hypothesis_id=hid,
        reviewer=reviewer,
        critique=None if errors else Critique(scores={"safety": 0.9}),
        errors=list(errors),
    )


def test_a_batchs_critiques_fold_alike_in_whatever_order_they_came() -> None:
    # The calls of a review batch answer in any order (and a resumed run
    # journals the rest after the ones it kept): the state, the errors the
    # brief lists included, does not depend on it.
    before = replay(journal()[:4])  # submitted, screened, context, H1 and H2
    assert before.explore is not None
    start = before.explore.model_copy(update={"errors": ["planner/gaps: late"]})
    answers = [
        critiqued("H2", 1, "reviewer/critique: H2 r1 failed"),
        critiqued("H1", 0),
        critiqued("H2", 0, "reviewer/critique: H2 r0 malformed", "again"),
        critiqued("H1", 1, "reviewer/critique: H1 r1 failed"),
    ]
    states = set()
    for order in itertools.permutations(answers):
        state = start
        for event in order:
            state = fold_explore(state, event)
        states.add(state.model_dump_json())
        assert [(c.hypothesis_id, c.reviewer) for c in state.critiqued] == [
            ("H1", 0),
            ("H1", 1),
            ("H2", 0),
            ("H2", 1),
        ]
        assert state.errors == [
            "planner/gaps: late",
            "reviewer/critique: H1 r1 failed",
            "reviewer/critique: H2 r0 malformed",
            "again",
            "reviewer/critique: H2 r1 failed",
        ]
    assert len(states) == 1
    # The batch's end keeps the errors where they are and starts afresh.
    reviewed = HypothesesReviewed(seq=99, at=T0, reviews=[], rejected=[])
    ended = fold_explore(state, reviewed)
    assert ended.critiqued == []
    assert ended.errors == state.errors
    again = fold_explore(ended, critiqued("H1", 0, "reviewer/critique: next"))
    assert again.errors == [*state.errors, "reviewer/critique: next"]


def test_a_critique_journaled_twice_or_of_a_reviewed_hypothesis_is_refused() -> None:
    events = journal()
    state = replay(events).explore
    assert state is not None
    with pytest.raises(ValueError, match="H1 was reviewed already"):
        fold_explore(state, critiqued("H1", 0))
    fresh = replay(events[:4]).explore
    once = fold_explore(fresh, critiqued("H2", 1))
    with pytest.raises(ValueError, match="reviewer 1 of H2 answered already"):
        fold_explore(once, critiqued("H2", 1))
    with pytest.raises(ValueError, match="unknown hypothesis H9"):
        fold_explore(once, critiqued("H9", 0))
