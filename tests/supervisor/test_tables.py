"""Large plans fold without copying their tables, and stay pure doing it."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from replan import RunSpec, TaskDraft, TaskOutcome, TaskStatus, apply, replay
from replan.messages import (
    Event,
    PlanCreated,
    RunFinished,
    RunSubmitted,
    Task,
    TaskFinished,
    TaskStarted,
)
from replan.supervisor import RunState, build_version, snapshot
from replan.supervisor._tables import (
    CHUNK,
    SMALL,
    IdLog,
    TaskTable,
    with_id,
    with_tasks,
)

NOW = datetime(2026, 11, 26, tzinfo=UTC)
OK = TaskOutcome(success=True, summary="done", findings=["f"])
FAILED = TaskOutcome(success=False, reason="broken")


def _task(i: int) -> Task:
    return Task(id=f"t{i}", key=f"k{i}", description=f"task {i}")


def _events(count: int) -> list[Event]:
    """A run of ``count`` tasks, every third depending on the one before;
    each started and finished in turn, every seventh failing."""
    spec = RunSpec(
        goal="g",
        tasks=[
            TaskDraft(
                key=f"k{i}",
                description=f"task {i}",
                depends_on=[f"k{i - 1}"] if i % 3 == 2 else [],
            )
            for i in range(count)
        ],
    )
    first = RunSubmitted(seq=1, at=NOW, run_id="r", spec=spec)
    state = apply(None, first)
    assert spec.tasks is not None
    version = build_version(
        state, spec.tasks, trigger=None, reason="", phase="main", replace_pending=False
    )
    events: list[Event] = [first, PlanCreated(seq=2, at=NOW, version=version)]
    state = apply(state, events[-1])
    for task in list(state.tasks.values()):
        if state.tasks[task.id].status is not TaskStatus.PENDING:
            continue  # skipped: a dependency failed
        for event in (
            TaskStarted(seq=state.seq + 1, at=NOW, task_id=task.id, attempt=1),
            TaskFinished(
                seq=state.seq + 2,
                at=NOW,
                task_id=task.id,
                outcome=FAILED if task.id.endswith("7") else OK,
            ),
        ):
            state = apply(state, event)
            events.append(event)
    return events


def test_a_large_plan_folds_as_a_small_one_does() -> None:
    count = SMALL + 3 * CHUNK + 5
    events = _events(count)
    states = []
    state: RunState | None = None
    for event in events:
        state = apply(state, event)
        states.append(state)
    assert state is not None
    assert isinstance(state.tasks, TaskTable)
    assert isinstance(state.completion_order, IdLog)
    # What a plain dict and list fold gives, read back every way they are read.
    plain: dict[str, Task] = {}
    failed = {t.id for t in state.tasks.values() if t.status is TaskStatus.FAILED}
    assert failed  # the plan has failures, and skips behind them
    assert any(t.status is TaskStatus.SKIPPED for t in state.tasks.values())
    for task in state.result().tasks:
        plain[task.id] = task
    completed = [
        event.task_id
        for event in events
        if isinstance(event, TaskFinished) and event.outcome.success
    ]
    assert len(state.tasks) == count
    assert list(state.tasks) == [f"t{i}" for i in range(1, count + 1)]
    assert dict(state.tasks.items()) == plain
    assert list(state.tasks.values()) == list(plain.values())
    assert state.tasks == plain
    assert state.tasks.get("t1") == plain["t1"]
    assert state.tasks.get("t0") is None
    assert "t5" in state.tasks
    assert "t0" not in state.tasks
    assert state.completion_order == completed
    assert list(reversed(state.completion_order)) == completed[::-1]
    assert state.completion_order[-1] == completed[-1]
    assert state.completion_order[CHUNK] == completed[CHUNK]
    assert state.last_findings(2) == ["f", "f"]
    assert replay(events) == state


def test_states_held_across_events_of_a_large_plan_do_not_change() -> None:
    events = _events(SMALL + CHUNK)
    states: list[RunState] = []
    state: RunState | None = None
    for event in events:
        state = apply(state, event)
        states.append(state)
    # Each state folded again from the journal alone is the one held.
    for i in (1, len(events) // 3, len(events) // 2, len(events) - 2):
        assert replay(events[: i + 1]) == states[i]
        assert list(states[i].tasks.values()) == list(
            replay(events[: i + 1]).tasks.values()
        )
    # A branch from an old state leaves the states after it as they were.
    old = states[len(events) // 2]
    before = list(states[-1].tasks.values()), list(states[-1].completion_order)
    end = RunFinished(seq=old.seq + 1, at=NOW, status="failed", stop_reason="x")
    ended = apply(old, end)
    assert ended.status == "failed"
    assert (list(states[-1].tasks.values()), list(states[-1].completion_order)) == (
        before
    )
    assert not any(t.status is TaskStatus.IN_PROGRESS for t in ended.tasks.values())


def test_a_finished_large_run_compacts_to_a_snapshot_that_folds_back() -> None:
    events = _events(SMALL + 10)
    state = replay(events)
    state = apply(state, RunFinished(seq=state.seq + 1, at=NOW, status="completed"))
    compacted = snapshot(state, len(events) + 1)
    assert compacted.completion_order == list(state.completion_order)
    again = apply(None, compacted)
    assert again.result() == state.result()


def test_an_update_copies_one_chunk_and_shares_the_others() -> None:
    table = TaskTable.of(_task(i) for i in range(4 * CHUNK))
    changed = _task(CHUNK + 1).evolve(status=TaskStatus.IN_PROGRESS)
    after = with_tasks(table, {changed.id: changed})
    assert isinstance(after, TaskTable)
    assert after[changed.id] is changed
    assert table[changed.id].status is TaskStatus.PENDING
    shared = [a is b for a, b in zip(after._chunks, table._chunks, strict=True)]
    assert shared == [True, False, True, True]
    assert after._positions is table._positions


@given(
    start=st.integers(0, 3 * CHUNK),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(1, CHUNK + 3)),
            st.tuples(st.just("set"), st.integers(0, 10**6)),
        ),
        max_size=12,
    ),
)
def test_task_tables_and_dicts_agree_and_old_versions_stay(
    start: int, steps: list[tuple[str, int]]
) -> None:
    table = TaskTable.of(_task(i) for i in range(start))
    plain = {t.id: t for t in table.values()}
    history: list[tuple[TaskTable, dict[str, Task]]] = []
    made = start
    for what, n in steps:
        history.append((table, dict(plain)))
        if what == "add":
            new = [_task(made + i) for i in range(n)]
            made += n
            table = table.added(new)
            plain.update((t.id, t) for t in new)
        elif plain:
            key = list(plain)[n % len(plain)]
            task = plain[key].evolve(attempts=plain[key].attempts + 1)
            table = table.replaced({key: task})
            plain[key] = task
        assert dict(table.items()) == plain
        assert list(table) == list(plain)
        assert len(table) == len(plain)
    for old, as_it_was in history:
        assert dict(old.items()) == as_it_was
        assert list(old.values()) == list(as_it_was.values())


@given(start=st.integers(0, 3 * CHUNK), more=st.integers(0, 2 * CHUNK))
def test_id_logs_and_lists_agree_and_old_versions_stay(start: int, more: int) -> None:
    ids = [f"t{i}" for i in range(start)]
    log = IdLog.of(ids)
    held = log
    for i in range(more):
        log = log.appended(f"n{i}")
    expected = ids + [f"n{i}" for i in range(more)]
    assert log == expected
    assert list(log) == expected
    assert len(log) == len(expected)
    assert list(reversed(log)) == expected[::-1]
    assert [log[i] for i in range(-len(expected), len(expected))] == expected * 2
    assert log[1:3] == expected[1:3]
    assert held == ids


def test_small_tables_stay_plain_dicts_and_lists() -> None:
    tasks = {t.id: t for t in (_task(i) for i in range(SMALL - 1))}
    bigger = with_tasks(tasks, {}, [_task(SMALL)])
    assert type(bigger) is dict
    assert len(tasks) == SMALL - 1
    assert isinstance(with_tasks(bigger, {}, [_task(SMALL + 1)]), TaskTable)
    ids = [f"t{i}" for i in range(SMALL - 1)]
    assert type(with_id(ids, "x")) is list
    assert len(ids) == SMALL - 1
    assert isinstance(with_id([*ids, "x"], "y"), IdLog)
