"""Explore events survive the journal byte for byte and fold into the state."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from explore_samples import T0, explore_events
from stores import STORE_KINDS, open_store

from replan import replay
from replan.messages import EVENT_ADAPTER, RunSpec, RunStatus, RunSubmitted
from replan.store import RunSummary, Store


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
