from __future__ import annotations

import os
import sqlite3
import typing
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import closing
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import anyio
import pytest
from explore_samples import explore_events
from hypothesis import given, settings
from hypothesis import strategies as st
from stores import STORE_KINDS, open_store

from replan._errors import ConfigurationError
from replan.messages import (
    EVENT_ADAPTER,
    Event,
    GateOpened,
    GatePolicy,
    GateRequest,
    GateResolution,
    GateResolved,
    Limits,
    MilestoneReviewed,
    ModelCallFailed,
    ModelFailure,
    PlanCreated,
    PlanVersion,
    ReplanApplied,
    ReplanOutcome,
    ReplanRecord,
    ReplanRefused,
    RetryScheduled,
    RunCompacted,
    RunFinished,
    RunResult,
    RunSpec,
    RunStatus,
    RunSubmitted,
    Synthesis,
    Task,
    TaskDraft,
    TaskFinished,
    TaskInterrupted,
    TaskOutcome,
    TaskStarted,
    TaskStatus,
    TokenUsage,
    TraceStarted,
    TraceSuspended,
    Trigger,
    Usage,
    UsageRecorded,
    Verdict,
)
from replan.store import (
    EffectLedger,
    JournalConflict,
    JournalRetention,
    RunSummary,
    SQLiteStore,
    Store,
    ToolEffectLedger,
)

T0 = datetime(2025, 3, 14, 9, 26, 53, 589793, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def summary(
    run_id: str,
    last_seq: int,
    *,
    status: RunStatus = RunStatus.RUNNING,
    created_at: datetime = T0,
    stop_reason: str | None = None,
) -> RunSummary:
    return RunSummary(
        run_id=run_id,
        goal="Find why checkout latency doubled last week",
        kind="plan",
        pattern="discovery",
        status=status,
        created_at=created_at,
        updated_at=at(last_seq),
        last_seq=last_seq,
        stop_reason=stop_reason,
    )


def started(seq: int, task_id: str = "t1") -> TaskStarted:
    return TaskStarted(seq=seq, at=at(seq), task_id=task_id, attempt=1)


def sample_events(run_id: str = "run-1") -> list[Event]:
    """One realistic event of every type, numbered 1 to 13."""
    drafts = [
        TaskDraft(key="metrics", description="Pull p50/p99 latency per service"),
        TaskDraft(
            key="deploys",
            description="List deploys in the window",
            depends_on=["metrics"],
            milestone=True,
        ),
    ]
    tasks_v1 = [
        Task(id="t1", key="metrics", description=drafts[0].description),
        Task(
            id="t2",
            key="deploys",
            description=drafts[1].description,
            depends_on=["t1"],
            milestone=True,
        ),
        Task(id="t3", key="profile", description="Profile the payment service"),
    ]
    done = TaskOutcome(
        success=True,
        summary="p99 went from 420 ms to 910 ms on 2025-03-07 — “payments” only",
        findings=["payments p99 doubled", "cache hit rate fell to 31 %"],
    )
    tasks_v2 = [
        tasks_v1[0].model_copy(
            update={"status": TaskStatus.COMPLETED, "attempts": 1, "result": done}
        ),
        tasks_v1[1],
        Task(
            id="t4",
            key="cache",
            description="Check the cache eviction policy change",
            version=2,
            requires_approval=True,
        ),
    ]
    version_1 = PlanVersion(version=1, tasks_after=tasks_v1, added=["t1", "t2", "t3"])
    version_2 = PlanVersion(
        version=2,
        trigger=Trigger.CONTRADICTION,
        reason="The cache, not the code, changed",
        tasks_before=tasks_v1,
        tasks_after=tasks_v2,
        removed=["t3"],
        added=["t4"],
        preserved=["t1", "t2"],
        findings_at_replan=["cache hit rate fell to 31 %"],
        approved_by="alice",
    )
    verdict = Verdict(
        decision="replan",
        trigger=Trigger.CONTRADICTION,
        rationale="Profiling is moot if the cache regressed",
        confidence=0.85,
        affected_tasks=["t3"],
        corroborating_sources=2,
    )
    spec = RunSpec(
        goal="Find why checkout latency doubled last week",
        pattern="hybrid",
        tasks=drafts,
        context=["Only EU traffic is affected"],
        limits=Limits(max_replans=2, token_budget=50_000, deadline_s=900.0),
        gate_policy=GatePolicy(
            gate_on=frozenset({Trigger.SCOPE_SHIFT, Trigger.CONTRADICTION}),
            on_timeout="approve",
        ),
        metadata={"team": "payments", "priority": 2, "tags": ["latency", "eu"]},
    )
    paris = timezone(timedelta(hours=1))
    return [
        RunSubmitted(
            seq=1,
            at=at(0),
            run_id=run_id,
            spec=spec,
            deadline_at=at(15).astimezone(paris),
        ),
        PlanCreated(seq=2, at=at(1), version=version_1),
        TaskStarted(seq=3, at=at(2), task_id="t1", attempt=1),
        TaskFinished(
            seq=4,
            at=at(3),
            task_id="t1",
            outcome=done,
            usage=TokenUsage(input_tokens=40, output_tokens=12, calls=1),
        ),
        MilestoneReviewed(seq=5, at=at(4), index=1, verdict=verdict, by="model"),
        ReplanRefused(
            seq=6,
            at=at(5),
            record=ReplanRecord(
                trigger=Trigger.OBSOLESCENCE,
                outcome=ReplanOutcome.REFUSED_THRESHOLD,
                reason="only one task became redundant",
                confidence=0.6,
            ),
        ),
        GateOpened(
            seq=7,
            at=at(6),
            request=GateRequest(
                gate_id="gate-1",
                run_id=run_id,
                reason="A contradiction needs a person's approval",
                trigger=Trigger.CONTRADICTION,
                proposal=version_2,
                created_at=at(6),
                expires_at=at(66),
            ),
        ),
        GateResolved(
            seq=8,
            at=at(7),
            gate_id="gate-1",
            resolution=GateResolution(
                decision="edit",
                tasks=[TaskDraft(key="cache", description="Check the cache policy")],
                by="alice",
                note="narrowed it to the cache",
            ),
        ),
        ReplanApplied(
            seq=9,
            at=at(8),
            record=ReplanRecord(
                trigger=Trigger.CONTRADICTION,
                outcome=ReplanOutcome.APPLIED,
                reason="The cache, not the code, changed",
                confidence=0.85,
                version=2,
                proposed=version_2,
            ),
            version=version_2,
        ),
        UsageRecorded(
            seq=10,
            at=at(9),
            role="planner",
            purpose="replan",
            usage=TokenUsage(
                input_tokens=1_812, output_tokens=407, cached_tokens=1_024, calls=2
            ),
        ),
        TraceStarted(
            seq=11,
            at=at(10),
            carrier={
                "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            },
            segment=1,
        ),
        TraceSuspended(
            seq=12,
            at=at(10),
            carrier={
                "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            },
            reason="the supervisor stopped with the run in flight",
        ),
        ModelCallFailed(
            seq=13,
            at=at(11),
            failure=ModelFailure(
                role="executor",
                purpose="execute",
                task_id="t4",
                error_type="ModelOutputError",
                message="the answer is not a valid TaskOutcome",
                raw_output='{"success": "maybe"',
                usage=TokenUsage(input_tokens=900, output_tokens=40, calls=2),
            ),
        ),
        RunFinished(
            seq=14,
            at=at(12),
            status=RunStatus.COMPLETED,
            synthesis=Synthesis(
                output="A cache eviction change halved the hit rate.",
                sources=["t1", "t4"],
            ),
        ),
    ]


def detached_samples() -> list[Event]:
    """The event types that do not fit in ``sample_events``' one journal: an
    interrupted attempt (a resume after a crash), a retry that waits (for a
    failure) and a compacted run."""
    submitted, created = sample_events()[:2]
    assert isinstance(submitted, RunSubmitted)
    assert isinstance(created, PlanCreated)
    result = RunResult(
        run_id="run-1",
        goal=submitted.spec.goal,
        pattern=submitted.spec.pattern,
        status=RunStatus.CANCELLED,
        tasks=created.version.tasks_after,
        versions=[created.version],
        replans=[],
        usage=Usage(),
        stop_reason="cancelled on request",
    )
    return [
        TaskInterrupted(seq=4, at=at(3), task_id="t1"),
        RetryScheduled(seq=5, at=at(3), task_id="t1", retry_at=at(9)),
        RunCompacted(
            seq=3,
            at=at(2),
            run_id="run-1",
            spec=submitted.spec,
            created_at=at(0),
            result=result,
            task_count=3,
            phase="collection",
            events=3,
        ),
    ]


@pytest.fixture(params=STORE_KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    journal: Store = open_store(request.param, request, tmp_path)
    yield journal
    await journal.aclose()


# Both stores


def test_the_samples_hold_one_event_of_every_type() -> None:
    (union, _) = typing.get_args(Event)
    samples = [*sample_events(), *explore_events(), *detached_samples()]
    assert sorted(type(e).__name__ for e in samples) == sorted(
        t.__name__ for t in typing.get_args(union)
    )


@pytest.mark.parametrize(
    "event", sample_events() + detached_samples(), ids=lambda e: type(e).__name__
)
def test_every_event_type_round_trips_through_the_event_adapter(event: Event) -> None:
    assert EVENT_ADAPTER.validate_json(EVENT_ADAPTER.dump_json(event)) == event


async def test_every_event_type_round_trips_through_append_and_read(
    store: Store,
) -> None:
    events = sample_events()
    await store.append("run-1", events, summary("run-1", len(events)))
    assert await store.read("run-1") == events


async def test_events_appended_one_call_at_a_time_read_back_in_order(
    store: Store,
) -> None:
    events = sample_events()
    for event in events:
        await store.append("run-1", [event], summary("run-1", event.seq))
    assert await store.read("run-1") == events


async def test_a_draft_journaled_before_a_check_was_added_stays_readable(
    store: Store,
) -> None:
    # Blank task descriptions are refused now; a journal written before that
    # may hold one, and what was journaled must read back and replay.
    blank = TaskDraft.model_construct(
        key="a", description="   ", depends_on=[], milestone=False
    )
    submitted = sample_events()[0]
    assert isinstance(submitted, RunSubmitted)
    spec = submitted.spec.model_copy(update={"tasks": [blank]})
    event = submitted.model_copy(update={"spec": spec})
    await store.append("run-1", [event], summary("run-1", 1))
    (read,) = await store.read("run-1")
    assert isinstance(read, RunSubmitted)
    assert read.spec.tasks is not None
    assert read.spec.tasks[0].description == "   "
    with pytest.raises(ValueError, match="description must not be blank"):
        TaskDraft(key="a", description="   ")


async def test_both_stores_satisfy_the_store_protocol(store: Store) -> None:
    assert isinstance(store, Store)


async def test_read_after_a_seq_returns_only_later_events(store: Store) -> None:
    events = sample_events()
    await store.append("run-1", events, summary("run-1", len(events)))
    assert await store.read("run-1", after=4) == events[4:]
    assert await store.read("run-1", after=len(events)) == []


async def test_reading_an_unknown_run_returns_no_events(store: Store) -> None:
    assert await store.read("nobody") == []


async def test_each_run_has_its_own_journal_numbered_from_one(store: Store) -> None:
    await store.append("a", [started(1), started(2)], summary("a", 2))
    await store.append("b", [started(1, "x")], summary("b", 1))
    assert [e.seq for e in await store.read("a")] == [1, 2]
    assert await store.read("b") == [started(1, "x")]


async def test_an_append_whose_caller_is_cancelled_as_it_calls_journals_its_events(
    store: Store,
) -> None:
    # A supervisor cancelled as it appends (a run's cancel) stages its end
    # after the events it handed over: none may be left out of the journal.
    await store.append("run-1", [started(1)], summary("run-1", 1))
    with anyio.CancelScope() as scope:
        scope.cancel()
        await store.append("run-1", [started(2)], summary("run-1", 2))
    assert await store.read("run-1") == [started(1), started(2)]
    await store.append("run-1", [started(3)], summary("run-1", 3))
    assert [e.seq for e in await store.read("run-1")] == [1, 2, 3]


async def test_an_append_that_skips_a_seq_raises_a_conflict_and_stores_nothing(
    store: Store,
) -> None:
    await store.append("run-1", [started(1)], summary("run-1", 1))
    with pytest.raises(JournalConflict, match="expected seq 2, got 3"):
        await store.append("run-1", [started(3), started(4)], summary("run-1", 4))
    assert await store.read("run-1") == [started(1)]
    assert await store.get_run("run-1") == summary("run-1", 1)


async def test_an_append_that_repeats_a_seq_raises_a_conflict(store: Store) -> None:
    await store.append("run-1", [started(1), started(2)], summary("run-1", 2))
    with pytest.raises(JournalConflict):
        await store.append("run-1", [started(2, "t9")], summary("run-1", 2))
    assert await store.read("run-1") == [started(1), started(2)]


async def test_a_first_event_other_than_seq_one_is_a_conflict(store: Store) -> None:
    with pytest.raises(JournalConflict):
        await store.append("run-1", [started(2)], summary("run-1", 2))
    assert await store.read("run-1") == []
    assert await store.get_run("run-1") is None


async def test_a_batch_with_a_gap_in_the_middle_stores_none_of_it(
    store: Store,
) -> None:
    await store.append("run-1", [started(1)], summary("run-1", 1))
    with pytest.raises(JournalConflict):
        await store.append(
            "run-1", [started(2), started(3), started(5)], summary("run-1", 5)
        )
    assert await store.read("run-1") == [started(1)]
    assert await store.get_run("run-1") == summary("run-1", 1)
    await store.append("run-1", [started(2)], summary("run-1", 2))
    assert [e.seq for e in await store.read("run-1")] == [1, 2]


async def test_an_append_without_events_still_updates_the_summary(
    store: Store,
) -> None:
    await store.append("run-1", [started(1)], summary("run-1", 1))
    waiting = summary("run-1", 1, status=RunStatus.WAITING_FOR_HUMAN)
    await store.append("run-1", [], waiting)
    assert await store.get_run("run-1") == waiting


async def test_get_run_returns_the_latest_summary(store: Store) -> None:
    await store.append("run-1", [started(1)], summary("run-1", 1))
    await store.append("run-1", [started(2)], summary("run-1", 2))
    finished = summary(
        "run-1", 3, status=RunStatus.LIMIT_REACHED, stop_reason="max_iterations"
    )
    await store.append(
        "run-1",
        [RunFinished(seq=3, at=at(3), status=RunStatus.LIMIT_REACHED)],
        finished,
    )
    assert await store.get_run("run-1") == finished


@pytest.mark.parametrize(
    "text", ["a NUL \x00 in it", "\ufdd0 a noncharacter first", "\ufdd0\x00", ""]
)
async def test_a_summary_with_any_text_reads_back_equal(
    store: Store, text: str
) -> None:
    row = summary("run-1", 1, stop_reason=text).model_copy(update={"goal": text})
    await store.append("run-1", [started(1)], row)
    assert await store.get_run("run-1") == row
    assert await store.list_runs() == [row]


async def test_get_run_of_an_unknown_run_returns_none(store: Store) -> None:
    assert await store.get_run("nobody") is None


async def fill(store: Store, statuses: Sequence[RunStatus]) -> list[RunSummary]:
    """Append one run per status, created a minute apart; return newest first."""
    rows = []
    for i, status in enumerate(statuses):
        row = summary(f"run-{i}", 1, status=status, created_at=at(i))
        await store.append(row.run_id, [started(1)], row)
        rows.append(row)
    return rows[::-1]


async def test_list_runs_returns_the_newest_first(store: Store) -> None:
    newest_first = await fill(store, [RunStatus.RUNNING] * 4)
    assert await store.list_runs() == newest_first


async def test_list_runs_breaks_ties_by_run_id_descending(store: Store) -> None:
    for run_id in ("b", "c", "a"):
        await store.append(run_id, [started(1)], summary(run_id, 1))
    assert [r.run_id for r in await store.list_runs()] == ["c", "b", "a"]


async def test_list_runs_orders_by_instant_whatever_the_utc_offset(
    store: Store,
) -> None:
    # 10:00 in UTC+2 is 08:00 UTC: earlier than 09:00 UTC despite the digits.
    plus_two = timezone(timedelta(hours=2))
    early = summary("early", 1, created_at=datetime(2025, 1, 1, 10, tzinfo=plus_two))
    late = summary("late", 1, created_at=datetime(2025, 1, 1, 9, tzinfo=UTC))
    for row in (early, late):
        await store.append(row.run_id, [started(1)], row)
    assert await store.list_runs() == [late, early]


@pytest.mark.parametrize(
    ("limit", "offset", "field"), [(-1, 0, "limit"), (5, -2, "offset")]
)
async def test_list_runs_refuses_a_negative_page_naming_it(
    store: Store, limit: int, offset: int, field: str
) -> None:
    # SQLite read a negative limit as none, a list sliced from its end, and
    # PostgreSQL refused it with its own error: every journal now says so.
    with pytest.raises(ConfigurationError) as caught:
        await store.list_runs(limit=limit, offset=offset)
    assert caught.value.field == field


async def test_list_runs_filters_by_status(store: Store) -> None:
    rows = await fill(
        store,
        [
            RunStatus.RUNNING,
            RunStatus.COMPLETED,
            RunStatus.WAITING_FOR_HUMAN,
            RunStatus.FAILED,
            RunStatus.RUNNING,
        ],
    )
    live = [RunStatus.RUNNING, RunStatus.WAITING_FOR_HUMAN]
    assert await store.list_runs(statuses=live) == [r for r in rows if r.status in live]
    assert await store.list_runs(statuses=[RunStatus.FAILED]) == [rows[1]]
    assert await store.list_runs(statuses=[RunStatus.CANCELLED]) == []
    assert await store.list_runs(statuses=[]) == []


async def test_list_runs_follows_a_status_change(store: Store) -> None:
    await store.append("run-1", [started(1)], summary("run-1", 1))
    done = summary("run-1", 2, status=RunStatus.COMPLETED)
    await store.append(
        "run-1", [RunFinished(seq=2, at=at(2), status=RunStatus.COMPLETED)], done
    )
    assert await store.list_runs(statuses=[RunStatus.RUNNING]) == []
    assert await store.list_runs(statuses=[RunStatus.COMPLETED]) == [done]


async def test_list_runs_pages_with_limit_and_offset(store: Store) -> None:
    rows = await fill(store, [RunStatus.RUNNING] * 7)
    assert await store.list_runs(limit=3) == rows[:3]
    assert await store.list_runs(limit=3, offset=3) == rows[3:6]
    assert await store.list_runs(limit=3, offset=6) == rows[6:]
    assert await store.list_runs(limit=3, offset=9) == []


# The durable stores

Opener = Callable[[], Store]


@pytest.fixture(params=["sqlite", "postgres"])
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens a new store object on one durable journal each time it is called."""
    if request.param == "sqlite":
        return lambda: SQLiteStore(tmp_path / "j.db")
    from replan.store import PostgresStore

    dsn = request.getfixturevalue("postgres_dsn")
    return lambda: PostgresStore(dsn)


async def test_events_and_runs_survive_closing_and_reopening_the_journal(
    reopen: Opener,
) -> None:
    events = sample_events()
    row = summary("run-1", len(events), status=RunStatus.COMPLETED).model_copy(
        update={"updated_at": events[-1].at}
    )
    async with reopen() as store:
        await store.append("run-1", events, row)
    async with reopen() as store:
        assert await store.read("run-1") == events
        assert await store.get_run("run-1") == row
        assert await store.list_runs() == [row]
        with pytest.raises(JournalConflict):
            await store.append("run-1", [started(12)], row)


# SQLite only


async def test_the_database_is_in_wal_mode_with_a_schema_version(
    tmp_path: Path,
) -> None:
    async with SQLiteStore(tmp_path / "j.db"):
        pass
    with closing(sqlite3.connect(tmp_path / "j.db")) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA user_version").fetchone() == (3,)


@pytest.mark.parametrize(
    ("asked", "level"), [({}, 1), ({"synchronous": "FULL"}, 2)], ids=["NORMAL", "FULL"]
)
async def test_commits_are_synced_at_the_level_asked_normal_by_default(
    tmp_path: Path, asked: dict[str, typing.Any], level: int
) -> None:
    async with SQLiteStore(tmp_path / "j.db", **asked) as store:
        conn = store._connection()
        assert conn.execute("PRAGMA synchronous").fetchone() == (level,)


async def test_a_database_from_a_newer_schema_is_refused(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "j.db"):
        pass
    with closing(sqlite3.connect(tmp_path / "j.db")) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(ConfigurationError, match="journal schema 99"):
        SQLiteStore(tmp_path / "j.db")


def _another_apps_database(path: Path) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE events (what TEXT)")
        conn.commit()


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda p: p.mkdir(), "is a directory, not a journal file"),
        (lambda p: p.write_text("no database here " * 20), "file is not a database"),
        (_another_apps_database, "holds another application's tables"),
    ],
    ids=["a directory", "not sqlite", "another app's tables"],
)
def test_a_path_that_cannot_hold_a_journal_is_a_configuration_error_naming_it(
    tmp_path: Path, make: Callable[[Path], object], problem: str
) -> None:
    path = tmp_path / "j.db"
    make(path)
    with pytest.raises(ConfigurationError) as caught:
        SQLiteStore(path)
    assert caught.value.field == "path"
    assert str(path) in caught.value.problem
    assert problem in caught.value.problem


async def test_an_empty_file_becomes_a_journal(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    path.touch()  # made ready by a deployment, say
    async with SQLiteStore(path) as store:
        await store.append("run-1", [started(1)], summary("run-1", 1))
    async with SQLiteStore(path, read_only=True) as reader:
        assert await reader.read("run-1") == [started(1)]


def test_another_applications_database_is_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('keep me')")
        conn.commit()
    before = path.read_bytes()

    with pytest.raises(ConfigurationError, match="another application's tables"):
        SQLiteStore(path)

    assert path.read_bytes() == before  # still its own journal mode, no tables added
    assert sorted(os.listdir(tmp_path)) == ["app.db"]


def test_a_journal_under_a_regular_file_is_a_configuration_error(
    tmp_path: Path,
) -> None:
    (tmp_path / "afile").touch()
    with pytest.raises(ConfigurationError) as caught:
        SQLiteStore(tmp_path / "afile" / "j.db")
    assert caught.value.field == "path"
    assert "afile" in caught.value.problem


# Both durable stores, again


async def test_two_stores_on_one_journal_see_each_others_appends(
    reopen: Opener,
) -> None:
    async with reopen() as first, reopen() as second:
        await first.append("run-1", [started(1)], summary("run-1", 1))
        assert await second.read("run-1") == [started(1)]
        await second.append("run-1", [started(2)], summary("run-1", 2))
        assert await first.read("run-1") == [started(1), started(2)]
        assert await first.get_run("run-1") == summary("run-1", 2)


async def test_a_second_writer_that_lost_the_race_gets_a_conflict(
    reopen: Opener,
) -> None:
    async with reopen() as first, reopen() as second:
        await first.append("run-1", [started(1)], summary("run-1", 1))
        await first.append("run-1", [started(2)], summary("run-1", 2))
        with pytest.raises(JournalConflict):
            await second.append("run-1", [started(2, "t9")], summary("run-1", 2))
        assert await second.read("run-1") == [started(1), started(2)]


async def test_a_second_writer_starting_a_journaled_run_gets_a_conflict(
    reopen: Opener,
) -> None:
    # A run's first append skips the last-seq query: the primary key alone
    # must refuse another writer's seq 1, and leave the run as it was.
    async with reopen() as first, reopen() as second:
        await first.append("run-1", [started(1)], summary("run-1", 1))
        with pytest.raises(JournalConflict):
            await second.append("run-1", [started(1, "t9")], summary("run-1", 1))
        assert await second.read("run-1") == [started(1)]
        listed = await second.get_run("run-1")
        assert listed is not None
        assert listed.last_seq == 1


async def test_a_writer_behind_another_gets_a_conflict_then_catches_up(
    reopen: Opener,
) -> None:
    async with reopen() as first, reopen() as second:
        await first.append("run-1", [started(1)], summary("run-1", 1))
        await second.append("run-1", [started(2)], summary("run-1", 2))
        # first last wrote seq 1: its next append must not pass as seq 2.
        with pytest.raises(JournalConflict):
            await first.append("run-1", [started(2, "t9")], summary("run-1", 2))
        with pytest.raises(JournalConflict, match="expected seq 3, got 4"):
            await first.append("run-1", [started(4)], summary("run-1", 4))
        await first.append("run-1", [started(3)], summary("run-1", 3))
        assert await second.read("run-1") == [started(1), started(2), started(3)]


# SQLite only, again


async def test_missing_parent_directories_are_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "j.db"
    async with SQLiteStore(str(path), synchronous="FULL") as store:
        await store.append("run-1", [started(1)], summary("run-1", 1))
    assert path.exists()


async def test_closing_twice_is_harmless(reopen: Opener) -> None:
    store = reopen()
    await store.aclose()
    await store.aclose()


async def test_a_closed_store_refuses_calls(store: Store) -> None:
    await store.append("run-1", [started(1)], summary("run-1", 1))
    assert store.closed is False
    await store.aclose()
    assert store.closed is True
    calls = [
        store.append("run-1", [started(2)], summary("run-1", 2)),
        store.read("run-1"),
        store.get_run("run-1"),
        store.list_runs(),
    ]
    # The effect ledgers and the retention calls each store has too.
    if isinstance(store, EffectLedger):
        calls.append(store.read_effects("run-1"))
    if isinstance(store, ToolEffectLedger):
        calls.append(store.read_tool_effects("run-1"))
    if isinstance(store, JournalRetention):
        calls.append(store.delete_run("run-1"))
    assert len(calls) == 7
    for call in calls:
        # Saying what is closed: the message a journal failure shows.
        with pytest.raises(anyio.ClosedResourceError, match=r"\S+ is closed$"):
            await call
    await store.aclose()  # closing again is harmless


def test_an_unknown_synchronous_level_is_a_configuration_error(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigurationError, match="synchronous"):
        SQLiteStore(tmp_path / "j.db", synchronous="OFF")  # type: ignore[arg-type]
    assert not (tmp_path / "j.db").exists()


def test_a_store_dropped_without_closing_warns(reopen: Opener) -> None:
    store = reopen()
    with pytest.warns(ResourceWarning, match=f"unclosed {type(store).__name__}"):
        del store  # CPython finalizes it right here


# Property: any task outcome survives the journal exactly.

outcomes = st.builds(
    TaskOutcome,
    success=st.booleans(),
    summary=st.text(),
    findings=st.lists(st.text(), max_size=4),
    reason=st.none() | st.text(),
    transient=st.booleans(),
)
offsets = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
moments = st.datetimes(timezones=offsets)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.text(min_size=1), outcomes, moments), min_size=1, max_size=8),
    st.text(min_size=1),
)
def test_any_task_outcomes_round_trip_exactly_through_sqlite(
    tmp_path_factory: pytest.TempPathFactory,
    finished: list[tuple[str, TaskOutcome, datetime]],
    run_id: str,
) -> None:
    events = [
        TaskFinished(seq=seq, at=moment, task_id=task_id, outcome=outcome)
        for seq, (task_id, outcome, moment) in enumerate(finished, start=1)
    ]
    row = summary(run_id, len(events), created_at=events[0].at).model_copy(
        update={"updated_at": events[-1].at}
    )

    async def round_trip() -> None:
        path = tmp_path_factory.mktemp("journal") / "j.db"
        async with SQLiteStore(path) as store:
            for event in events:
                await store.append(run_id, [event], row)
            assert await store.read(run_id) == events
            assert await store.get_run(run_id) == row

    anyio.run(round_trip, backend="asyncio")
