"""The effect ledger and retention: compacting and deleting finished runs."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
from stores import STORE_KINDS, open_store

from replan import GateResolution, RunSpec, RunStatus, Supervisor
from replan._demo import demo_model, demo_spec
from replan._demo_explore import explore_demo_spec
from replan.messages import GateOpened, ModelFailure, TaskOutcome
from replan.store import (
    EffectLedger,
    EffectRecord,
    JournalConflict,
    JournalCorrupt,
    JournalRetention,
    SQLiteStore,
    Store,
    ToolEffectLedger,
    ToolEffectRecord,
)
from replan.supervisor import replay, snapshot

FAR_FUTURE = datetime.now(UTC) + timedelta(days=1)


@pytest.fixture(params=STORE_KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    journal: Store = open_store(request.param, request, tmp_path)
    yield journal
    await journal.aclose()


async def finished_demo_run(store: Store, spec: RunSpec | None = None) -> str:
    """One demo run to its end (the gate approved), journaled in ``store``."""
    with anyio.fail_after(10):
        async with Supervisor(demo_model(), store) as sup:
            handle = await sup.submit(spec or demo_spec())
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    await sup.gates.resolve(
                        event.request.gate_id, GateResolution(decision="approve")
                    )
            await handle.result()
    return handle.run_id


async def test_both_stores_are_effect_ledgers_and_support_retention(
    store: Store,
) -> None:
    assert isinstance(store, EffectLedger)
    assert isinstance(store, ToolEffectLedger)
    assert isinstance(store, JournalRetention)


def sent(key: str, to: str = "ana") -> ToolEffectRecord:
    return ToolEffectRecord(
        key=key,
        task_id="t1",
        tool="send_email",
        arguments={"to": to, "cc": [to, None, 1.5]},
        content=f"sent to {to}",
    )


async def test_tool_effects_are_read_by_run_and_task_in_the_order_they_ran(
    store: Store,
) -> None:
    assert isinstance(store, ToolEffectLedger)
    first, other = sent("run-1:t1:s1c0"), sent("run-1:t1:s1c1", to="bo")
    elsewhere = sent("run-1:t2:s1c0").model_copy(update={"task_id": "t2"})
    for record in (first, elsewhere, other):
        await store.record_tool_effect("run-1", record)
    assert await store.read_tool_effects("run-1", "t1") == [first, other]
    assert await store.read_tool_effects("run-1", "t2") == [elsewhere]
    assert await store.read_tool_effects("run-2", "t1") == []
    again = sent(first.key, to="cy")
    await store.record_tool_effect("run-1", again)
    assert again in await store.read_tool_effects("run-1", "t1")
    assert first not in await store.read_tool_effects("run-1", "t1")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_tool_effects_survive_reopening_the_journal(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    record = sent("run-1:t1:s1c0")
    async with open_store(kind, request, tmp_path) as store:
        assert isinstance(store, ToolEffectLedger)
        await store.record_tool_effect("run-1", record)
    async with open_store(kind, request, tmp_path) as store:
        assert isinstance(store, ToolEffectLedger)
        assert await store.read_tool_effects("run-1", "t1") == [record]


async def test_a_damaged_tool_effect_is_journal_corrupt(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "j.db") as store:
        await store.record_tool_effect("run-1", sent("k"))
    with closing(sqlite3.connect(tmp_path / "j.db")) as conn:
        conn.execute("UPDATE tool_effects SET payload = '{\"key\": 1}'")
        conn.commit()
    async with SQLiteStore(tmp_path / "j.db") as store:
        with pytest.raises(JournalCorrupt, match="run-1"):
            await store.read_tool_effects("run-1", "t1")


async def test_the_ledger_keeps_one_record_per_attempt(store: Store) -> None:
    assert isinstance(store, EffectLedger)
    first = EffectRecord(task_id="t1", attempt=1, outcome=TaskOutcome(success=False))
    again = EffectRecord(task_id="t1", attempt=1, outcome=TaskOutcome(success=True))
    other = EffectRecord(task_id="t2", attempt=1, outcome=TaskOutcome(success=True))
    await store.record_effect("run-1", first)
    await store.record_effect("run-1", again)
    await store.record_effect("run-1", other)
    await store.record_effect("run-2", other)
    assert sorted(await store.read_effects("run-1"), key=lambda r: r.task_id) == [
        again,
        other,
    ]


async def test_the_ledger_keeps_an_attempts_failures_and_the_time_its_retry_waits_for(
    store: Store,
) -> None:
    assert isinstance(store, EffectLedger)
    failure = ModelFailure(
        role="executor",
        purpose="execute",
        task_id="t1",
        error_type="TransientModelError",
        message="HTTP 429",
        transient=True,
        retry_after_s=30,
    )
    record = EffectRecord(
        task_id="t1",
        attempt=1,
        outcome=TaskOutcome(success=False, transient=True, reason="HTTP 429"),
        failures=[failure],
        retry_at=datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
    )
    await store.record_effect("run-1", record)
    assert await store.read_effects("run-1") == [record]


async def test_a_ledger_record_kept_before_its_failures_were_still_loads(
    tmp_path: Path,
) -> None:
    async with SQLiteStore(tmp_path / "j.db") as store:
        pass
    old = '{"task_id": "t1", "attempt": 1, "outcome": {"success": false}}'
    with closing(sqlite3.connect(tmp_path / "j.db")) as conn:
        conn.execute(
            "INSERT INTO effects (run_id, task_id, attempt, payload) "
            "VALUES ('run-1', 't1', 1, ?)",
            (old,),
        )
        conn.commit()
    async with SQLiteStore(tmp_path / "j.db") as store:
        (record,) = await store.read_effects("run-1")
    assert record.failures == []
    assert record.retry_at is None


@pytest.mark.parametrize("kind", ["plan", "explore"])
async def test_a_compacted_run_replays_to_the_same_result(
    store: Store, kind: str
) -> None:
    assert isinstance(store, JournalRetention)
    spec = explore_demo_spec() if kind == "explore" else demo_spec()
    run_id = await finished_demo_run(store, spec)
    events = await store.read(run_id)
    before = replay(events)
    assert await store.finished_before(
        FAR_FUTURE, include_compacted=False, limit=10
    ) == [run_id]

    assert isinstance(store, ToolEffectLedger)
    await store.record_tool_effect(run_id, sent("k"))
    await store.compact_run(run_id, snapshot(before, len(events)))
    assert await store.read_tool_effects(run_id, "t1") == []

    (compacted,) = await store.read(run_id)
    assert compacted.kind == "run_compacted"
    assert compacted.seq == before.seq
    after = replay([compacted])
    assert after.result() == before.result()
    assert after.gates == before.gates
    assert after.spec == before.spec
    assert await store.read(run_id, after=before.seq) == []
    assert (
        await store.finished_before(FAR_FUTURE, include_compacted=False, limit=10) == []
    )
    assert await store.finished_before(
        FAR_FUTURE, include_compacted=True, limit=10
    ) == [run_id]
    summary = await store.get_run(run_id)
    assert summary is not None
    assert summary.status is RunStatus.COMPLETED


async def test_a_stale_snapshot_is_refused(store: Store) -> None:
    assert isinstance(store, JournalRetention)
    run_id = await finished_demo_run(store)
    events = await store.read(run_id)
    stale = snapshot(
        replay(events[:-1]).model_copy(update={"status": RunStatus.FAILED}), 1
    )
    with pytest.raises(JournalConflict):
        await store.compact_run(run_id, stale)
    assert await store.read(run_id) == events


def test_only_a_finished_run_can_be_folded_into_a_snapshot() -> None:
    from replan import RunSpec
    from replan.messages import RunSubmitted

    state = replay(
        [RunSubmitted(seq=1, at=datetime.now(UTC), run_id="r", spec=RunSpec(goal="g"))]
    )
    with pytest.raises(ValueError, match="has not finished"):
        snapshot(state, 1)


async def test_a_deleted_run_is_gone_with_its_ledger(store: Store) -> None:
    assert isinstance(store, JournalRetention)
    assert isinstance(store, EffectLedger)
    run_id = await finished_demo_run(store)
    kept = await finished_demo_run(store)
    done = EffectRecord(task_id="t1", attempt=1, outcome=TaskOutcome(success=True))
    await store.record_effect(run_id, done)
    await store.record_effect(kept, done)
    assert isinstance(store, ToolEffectLedger)
    await store.record_tool_effect(run_id, sent("k"))
    await store.record_tool_effect(kept, sent("k"))
    await store.delete_run(run_id)
    assert await store.read_tool_effects(run_id, "t1") == []
    assert await store.read_tool_effects(kept, "t1") == [sent("k")]
    assert await store.read(run_id) == []
    assert await store.get_run(run_id) is None
    assert await store.read_effects(run_id) == []
    assert await store.read_effects(kept) == [done]
    assert [s.run_id for s in await store.list_runs()] == [kept]
    # The id is free again: a journal under it starts over at seq 1.
    (first, *_) = await store.read(kept)
    await store.append(run_id, [first], await store.get_run(kept))  # type: ignore[arg-type]
    assert await store.read(run_id) == [first]


async def test_runs_newer_than_the_cutoff_or_unfinished_are_not_expired(
    store: Store,
) -> None:
    assert isinstance(store, JournalRetention)
    run_id = await finished_demo_run(store)
    summary = await store.get_run(run_id)
    assert summary is not None
    at_finish = summary.updated_at
    assert await store.finished_before(at_finish, include_compacted=True, limit=5) == []
    assert await store.finished_before(
        at_finish + timedelta(microseconds=1), include_compacted=True, limit=5
    ) == [run_id]


async def test_a_version_1_journal_is_migrated_to_the_ledger_schema(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    with closing(sqlite3.connect(path)) as conn:
        from replan.store._sqlite import _SCHEMA_V1

        for statement in _SCHEMA_V1:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        conn.commit()
    async with SQLiteStore(path) as store:
        record = EffectRecord(
            task_id="t1", attempt=1, outcome=TaskOutcome(success=True)
        )
        await store.record_effect("run-1", record)
        assert await store.read_effects("run-1") == [record]
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (3,)


async def test_a_version_2_journal_gains_the_tool_effects_and_keeps_its_runs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    from replan.store._sqlite import _SCHEMA_V1, _SCHEMA_V2

    with closing(sqlite3.connect(path)) as conn:
        for statement in (*_SCHEMA_V1, *_SCHEMA_V2):
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 2")
        conn.commit()
    async with SQLiteStore(path) as store:
        run_id = await finished_demo_run(store)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("DROP TABLE tool_effects")
        conn.execute("PRAGMA user_version = 2")
        conn.commit()
    async with SQLiteStore(path) as store:
        summary = await store.get_run(run_id)
        assert summary is not None
        assert summary.status is RunStatus.COMPLETED
        await store.record_tool_effect(run_id, sent("k"))
        assert await store.read_tool_effects(run_id, "t1") == [sent("k")]
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (3,)


async def test_tool_effects_keep_their_first_place_when_they_are_finished(
    store: Store,
) -> None:
    assert isinstance(store, ToolEffectLedger)
    first, second = sent("run-1:t1:s1c0"), sent("run-1:t2:s1c0", to="bo")
    second = second.model_copy(update={"task_id": "t2"})
    started = [r.model_copy(update={"content": None}) for r in (first, second)]
    for record in (*started, second, first):
        await store.record_tool_effect("run-1", record)
    assert await store.read_tool_effects("run-1") == [first, second]
    assert await store.read_tool_effects("run-1", "t2") == [second]
