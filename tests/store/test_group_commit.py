"""The SQLite journal's group commit: appends of several live runs that
become ready together share one transaction, each still atomic on its own."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from write_samples import started, summary

from replan.messages import RunStatus
from replan.store import JournalConflict, SQLiteStore


@contextmanager
def statements(store: SQLiteStore) -> Iterator[list[str]]:
    """Every SQL statement the store's connection runs meanwhile."""
    seen: list[str] = []
    conn = store._connection()
    conn.set_trace_callback(lambda sql: seen.append(" ".join(sql.split())))
    try:
        yield seen
    finally:
        conn.set_trace_callback(None)


class Attempts:
    """A store's connection that lists the statements it is asked to run,
    whether or not they get to run."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.sql: list[str] = []

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self.sql.append(sql)
        return self.conn.execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self.sql.append(sql)
        return self.conn.executemany(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def commits(seen: list[str]) -> int:
    """Transactions committed: explicit COMMITs plus lone INSERTs outside one."""
    count, open_ = 0, False
    for sql in seen:
        if sql.startswith("BEGIN"):
            open_ = True
        elif sql in ("COMMIT", "ROLLBACK"):
            count += sql == "COMMIT"
            open_ = False
        elif sql.startswith("INSERT INTO events") and not open_:
            count += 1
    return count


def journaled(db: Path) -> dict[str, list[int]]:
    """Each run's event seqs, as another connection reads the file."""
    runs: dict[str, list[int]] = {}
    with closing(sqlite3.connect(db)) as raw:
        for run_id, seq in raw.execute(
            "SELECT run_id, seq FROM events ORDER BY run_id, seq"
        ):
            runs.setdefault(run_id, []).append(seq)
    return runs


async def start_runs(store: SQLiteStore, run_ids: list[str]) -> None:
    for run_id in run_ids:
        await store.append(run_id, [started(1)], summary(1, run_id=run_id))


async def start_runs_and_a_bystander(store: SQLiteStore, run_ids: list[str]) -> None:
    """Start the runs, then a live one that writes nothing more: none of the
    runs wrote last, so each of their appends waits for the others'."""
    await start_runs(store, [*run_ids, "bystander"])


async def test_appends_of_live_runs_that_are_ready_together_share_one_commit(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    runs = [f"run-{i}" for i in range(5)]
    async with SQLiteStore(db) as store:
        await start_runs_and_a_bystander(store, runs)
        with statements(store) as seen:
            async with anyio.create_task_group() as tg:
                for run_id in runs:
                    tg.start_soon(
                        store.append, run_id, [started(2)], summary(2, run_id=run_id)
                    )
        assert commits(seen) == 1
        assert journaled(db) == {**{key: [1, 2] for key in runs}, "bystander": [1]}
        for run_id in runs:
            assert await store.read(run_id, after=1) == [started(2)]


async def test_a_lone_live_run_commits_each_append_at_once(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "j.db") as store:
        await start_runs(store, ["run-a"])
        with statements(store) as seen:
            for seq in range(2, 5):
                await store.append(
                    "run-a", [started(seq)], summary(seq, run_id="run-a")
                )
                # Committed before the append returned, with no wait for others.
                assert journaled(tmp_path / "j.db")["run-a"][-1] == seq
        # One INSERT each, its own transaction: no BEGIN, no savepoints.
        assert len(seen) == 3
        assert all(sql.startswith("INSERT INTO events") for sql in seen)


async def test_an_append_that_conflicts_fails_alone_and_the_others_commit(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    runs = ["run-a", "run-b", "run-c"]
    async with SQLiteStore(db) as store:
        await start_runs_and_a_bystander(store, runs)
        # Another writer journals run-b's seq 2 behind this store's back.
        with closing(sqlite3.connect(db)) as other:
            other.execute(
                "INSERT INTO events VALUES ('run-b', 2, 'task_started', '{}', 'x')"
            )
            other.commit()
        outcomes: dict[str, BaseException | None] = {}

        async def append(run_id: str) -> None:
            try:
                await store.append(run_id, [started(2)], summary(2, run_id=run_id))
                outcomes[run_id] = None
            except JournalConflict as exc:
                outcomes[run_id] = exc

        async with anyio.create_task_group() as tg:
            for run_id in runs:
                tg.start_soon(append, run_id)
        assert outcomes["run-a"] is None
        assert outcomes["run-c"] is None
        assert isinstance(outcomes["run-b"], JournalConflict)
        assert journaled(db) == {
            "run-a": [1, 2],
            "run-b": [1, 2],
            "run-c": [1, 2],
            "bystander": [1],
        }
        # The failed run reads the journal again on its next append.
        with pytest.raises(JournalConflict):
            await store.append("run-b", [started(2)], summary(2, run_id="run-b"))
        await store.append("run-b", [started(3)], summary(3, run_id="run-b"))
        assert journaled(db)["run-b"] == [1, 2, 3]


async def test_a_caller_cancelled_while_in_a_batch_finds_its_append_committed(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    runs = ["run-a", "run-b"]
    async with SQLiteStore(db) as store:
        await start_runs_and_a_bystander(store, runs)
        returned: list[str] = []

        async def append(run_id: str) -> None:
            await store.append(run_id, [started(2)], summary(2, run_id=run_id))
            returned.append(run_id)
            await anyio.sleep_forever()

        async with anyio.create_task_group() as tg:
            for run_id in runs:
                tg.start_soon(append, run_id)
            # Both appends are handed over; cancel before the batch commits.
            await anyio.lowlevel.checkpoint()
            tg.cancel_scope.cancel()
        # Each append finished before its caller saw the cancellation, so no
        # caller can believe its events were not journaled.
        assert sorted(returned) == runs
        assert journaled(db) == {"run-a": [1, 2], "run-b": [1, 2], "bystander": [1]}
        for run_id in runs:
            await store.append(run_id, [started(3)], summary(3, run_id=run_id))
        assert journaled(db)["run-a"] == journaled(db)["run-b"] == [1, 2, 3]


async def test_a_run_that_ended_no_longer_makes_appends_wait_for_others(
    tmp_path: Path,
) -> None:
    async with SQLiteStore(tmp_path / "j.db") as store:
        await start_runs(store, ["run-a", "run-b"])
        await store.append(
            "run-b", [started(2)], summary(2, RunStatus.COMPLETED, run_id="run-b")
        )
        with statements(store) as seen:
            await store.append("run-a", [started(2)], summary(2, run_id="run-a"))
        assert len(seen) == 1
        assert seen[0].startswith("INSERT INTO events")


async def test_a_batch_on_a_store_closed_meanwhile_fails_every_append(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "j.db")
    await start_runs_and_a_bystander(store, ["run-a", "run-b"])
    failures: list[BaseException] = []

    async def append(run_id: str) -> None:
        try:
            await store.append(run_id, [started(2)], summary(2, run_id=run_id))
        except anyio.ClosedResourceError as exc:
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(append, "run-a")
        tg.start_soon(append, "run-b")
        await anyio.lowlevel.checkpoint()
        await store.aclose()
    assert len(failures) == 2


async def test_a_run_writing_alone_while_another_waits_does_not_yield(
    tmp_path: Path,
) -> None:
    async with SQLiteStore(tmp_path / "j.db") as store:
        # Both live; run-b then waits (for a person, say) and writes nothing.
        await start_runs(store, ["run-a", "run-b"])
        await store.append("run-a", [started(2)], summary(2, run_id="run-a"))
        others_ran = False

        async def other() -> None:
            nonlocal others_ran
            others_ran = True

        async with anyio.create_task_group() as tg:
            tg.start_soon(other)
            for seq in range(3, 6):
                await store.append(
                    "run-a", [started(seq)], summary(seq, run_id="run-a")
                )
            # No append passed through the event loop to wait for others.
            assert not others_ran
        assert others_ran
        assert journaled(tmp_path / "j.db")["run-a"] == [1, 2, 3, 4, 5]


async def test_a_batch_that_cannot_get_the_write_lock_fails_each_append_once(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    runs = ["run-a", "run-b"]
    async with SQLiteStore(db) as store:
        await start_runs_and_a_bystander(store, runs)
        store._connection().execute("PRAGMA busy_timeout = 50")
        failures: dict[str, BaseException] = {}

        async def append(run_id: str) -> None:
            try:
                await store.append(run_id, [started(2)], summary(2, run_id=run_id))
            except sqlite3.OperationalError as exc:
                failures[run_id] = exc

        attempts = Attempts(store._connection())
        store._conn = attempts  # type: ignore[assignment]
        with closing(sqlite3.connect(db, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")  # another process writes
            async with anyio.create_task_group() as tg:
                for run_id in runs:
                    tg.start_soon(append, run_id)
            other.execute("ROLLBACK")
        store._conn = attempts.conn
        assert sorted(failures) == runs
        assert all("locked" in str(exc) for exc in failures.values())
        # One wait for the lock for the batch, not one more per append.
        assert attempts.sql == ["BEGIN IMMEDIATE"]
        # Once the lock is free, the runs go on from what the journal holds.
        for run_id in runs:
            await store.append(run_id, [started(2)], summary(2, run_id=run_id))
        assert journaled(db) == {"run-a": [1, 2], "run-b": [1, 2], "bystander": [1]}


@pytest.mark.parametrize("seed", range(3))
async def test_many_runs_cancelled_at_random_journal_exactly_the_appends_that_returned(
    tmp_path: Path, seed: int
) -> None:
    rnd = random.Random(seed)
    db = tmp_path / "j.db"
    returned: dict[str, int] = {}  # run -> the last seq whose append returned

    async def run(run_id: str, store: SQLiteStore) -> None:
        seq = 0
        while seq < 40:
            count = rnd.randint(1, 3)
            events = [started(seq + i + 1) for i in range(count)]
            status = RunStatus.COMPLETED if seq + count >= 40 else RunStatus.RUNNING
            await store.append(
                run_id, events, summary(seq + count, status, run_id=run_id)
            )
            seq += count
            returned[run_id] = seq
            if rnd.random() < 0.3:
                await anyio.lowlevel.checkpoint()
            if rnd.random() < 0.1:
                await anyio.sleep(rnd.random() / 1000)

    async with SQLiteStore(db) as store, anyio.create_task_group() as tg:
        scopes = [anyio.CancelScope() for _ in range(40)]
        for index, scope in enumerate(scopes):

            async def one(run_id: str = f"run-{index}", scope=scope) -> None:
                with scope:
                    await run(run_id, store)

            tg.start_soon(one)
        for _ in range(15):
            await anyio.sleep(rnd.random() / 500)
            rnd.choice(scopes).cancel()
    runs = journaled(db)
    for run_id, seqs in runs.items():
        assert seqs == list(range(1, len(seqs) + 1)), run_id
    assert {run_id: seqs[-1] for run_id, seqs in runs.items()} == returned
