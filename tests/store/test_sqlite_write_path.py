"""The SQLite journal's commit path: checkpoints off the writer, lean rows."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from write_samples import T0, started, summary

from replan import ConfigurationError, GatePolicy, MemoryStore, Supervisor
from replan._demo import demo_model, demo_spec
from replan.daemon import DaemonSettings, Token
from replan.daemon._retention import apply_retention
from replan.daemon._service import Daemon
from replan.messages import RunStatus, TaskStarted
from replan.store import (
    JournalConflict,
    JournalCorrupt,
    SQLiteStore,
    ToolEffectRecord,
)
from replan.store._sqlite import CHECKPOINT_EVERY
from replan.supervisor import replay, snapshot


def events_in_main_file(db: Path, copy: Path) -> int:
    """Events in the database file alone, without its WAL: what checkpoints
    have copied there."""
    shutil.copyfile(db, copy)
    with closing(sqlite3.connect(copy)) as conn:
        try:
            (count,) = conn.execute("SELECT count(*) FROM events").fetchone()
        except sqlite3.OperationalError:  # not even the schema copied yet
            return 0
    return int(count)


async def test_a_thread_of_the_store_checkpoints_not_the_commit_that_crosses(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with SQLiteStore(db) as store:
        conn = store._connection()
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
        for seq in range(1, CHECKPOINT_EVERY):
            await store.append("run-1", [started(seq)], summary(seq))
        # Below the threshold nothing has reached the database file yet.
        assert events_in_main_file(db, tmp_path / "copy.db") == 0
        await store.append("run-1", [started(CHECKPOINT_EVERY)], summary(seq + 1))
        rounds = store._checkpointer.rounds
        assert await anyio.to_thread.run_sync(rounds.acquire, True, 10)
        assert events_in_main_file(db, tmp_path / "copy.db") == CHECKPOINT_EVERY
        assert await store.read("run-1", after=CHECKPOINT_EVERY - 1) == [
            started(CHECKPOINT_EVERY)
        ]
    # Closing stops the thread and checkpoints the rest.
    assert events_in_main_file(db, tmp_path / "copy.db") == CHECKPOINT_EVERY
    assert not (tmp_path / "j.db-wal").exists()


async def test_a_store_that_closes_before_any_checkpoint_starts_no_thread(
    tmp_path: Path,
) -> None:
    async with SQLiteStore(tmp_path / "j.db") as store:
        await store.append("run-1", [started(1)], summary(1))
        assert store._checkpointer._thread is None


async def test_the_summary_follows_the_newest_event_between_status_changes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with SQLiteStore(db) as store:
        for seq in range(1, 6):
            await store.append("run-1", [started(seq)], summary(seq))
            assert await store.get_run("run-1") == summary(seq)
            assert await store.list_runs() == [summary(seq)]
        # The row itself was written once: the status never changed.
        with closing(sqlite3.connect(db)) as raw:
            assert raw.execute("SELECT last_seq FROM runs").fetchall() == [(1,)]
        await store.append("run-1", [started(6)], summary(6, RunStatus.COMPLETED))
        with closing(sqlite3.connect(db)) as raw:
            assert raw.execute("SELECT last_seq, status FROM runs").fetchall() == [
                (6, "completed")
            ]
    async with SQLiteStore(db) as store:
        assert await store.get_run("run-1") == summary(6, RunStatus.COMPLETED)
        assert await store.list_runs(statuses=[RunStatus.COMPLETED]) == [
            summary(6, RunStatus.COMPLETED)
        ]


async def test_a_long_lived_store_keeps_no_cache_of_finished_runs(
    tmp_path: Path,
) -> None:
    # Its per-run caches (the last seq, the row) grew with every run it had
    # journaled: about 175 bytes a run, for the life of the process.
    async with SQLiteStore(tmp_path / "j.db") as store:
        for number in range(50):
            run_id = f"run-{number}"
            for seq in range(1, 4):
                await store.append(run_id, [started(seq)], summary(seq, run_id=run_id))
            done = summary(4, RunStatus.COMPLETED, run_id=run_id)
            await store.append(run_id, [started(4)], done)
        await store.append("live", [started(1)], summary(1, run_id="live"))
        assert set(store._last_seq) == set(store._row) == {"live"}
        assert await store.get_run("run-49") == summary(
            4, RunStatus.COMPLETED, run_id="run-49"
        )
        assert [e.seq for e in await store.read("run-7")] == [1, 2, 3, 4]


async def test_a_reopened_store_rewrites_the_row_on_its_first_append(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with SQLiteStore(db) as store:
        await store.append("run-1", [started(1)], summary(1))
    async with SQLiteStore(db) as store:
        await store.append("run-1", [started(2)], summary(2))
    with closing(sqlite3.connect(db)) as raw:
        assert raw.execute("SELECT last_seq FROM runs").fetchall() == [(2,)]


async def test_a_batch_colliding_with_another_writer_is_refused_whole(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with SQLiteStore(db) as first, SQLiteStore(db) as second:
        await first.append("run-1", [started(1)], summary(1))
        # Another writer appends seq 2 behind the first store's back.
        await second.append("run-1", [started(2)], summary(2))
        with pytest.raises(JournalConflict):
            await first.append("run-1", [started(2), started(3)], summary(3))
        # Nothing of the refused batch was stored, seq 3 included.
        assert await first.read("run-1") == [started(1), started(2)]
        # The first store re-reads where the journal stands and goes on.
        await first.append("run-1", [started(3)], summary(3))
        assert [e.seq for e in await second.read("run-1")] == [1, 2, 3]


async def test_the_wal_is_rewound_under_a_steady_stream_of_commits(
    tmp_path: Path,
) -> None:
    # A passive checkpoint alone never catches up with a writer that keeps
    # committing; the writer finishes each of the thread's rounds, so the WAL
    # starts over instead of growing with every commit.
    db = tmp_path / "j.db"
    wal = tmp_path / "j.db-wal"
    payload = "x" * 2000  # about a page of WAL per commit
    sizes = []
    async with SQLiteStore(db) as store:
        rounds = store._checkpointer.rounds
        one_round = 0
        for seq in range(1, 12 * CHECKPOINT_EVERY + 1):
            event = TaskStarted(
                seq=seq, at=T0 + timedelta(seconds=seq), task_id=payload, attempt=1
            )
            await store.append("run-1", [event], summary(seq))
            if seq == CHECKPOINT_EVERY:
                # The first round starts: nothing is copied yet.
                one_round = wal.stat().st_size
            elif seq % CHECKPOINT_EVERY == 0:
                # The round the last multiple started ran while these appends
                # were committed. Wait for its end, however busy the machine
                # (a fixed sleep was not always enough), then look.
                assert await anyio.to_thread.run_sync(rounds.acquire, True, 10)
                sizes.append(wal.stat().st_size)
        assert len(await store.read("run-1")) == 12 * CHECKPOINT_EVERY
    # Without rewinding, the WAL would hold all twelve rounds' appends; the
    # writer's finishing step keeps it to the rounds in flight.
    assert max(sizes) < 3.5 * one_round


def test_a_store_left_open_does_not_keep_the_interpreter_alive(
    tmp_path: Path,
) -> None:
    # Past CHECKPOINT_EVERY commits the checkpoint thread is running; the
    # program then ends without closing the store.
    script = f"""
import anyio
from datetime import UTC, datetime
from replan.messages import RunStatus, TaskStarted
from replan.store import RunSummary, SQLiteStore
from replan.store._sqlite import CHECKPOINT_EVERY

KEPT = []  # referenced until the interpreter exits: no __del__ before

async def main():
    store = SQLiteStore({str(tmp_path / "j.db")!r})
    KEPT.append(store)
    now = datetime.now(UTC)
    for seq in range(1, CHECKPOINT_EVERY + 2):
        summary = RunSummary(
            run_id="r", goal="g", kind="plan", pattern="discovery",
            status=RunStatus.RUNNING, created_at=now, updated_at=now, last_seq=seq,
        )
        event = TaskStarted(seq=seq, at=now, task_id="t", attempt=1)
        await store.append("r", [event], summary)
    assert store._checkpointer._thread is not None
    print("done", flush=True)

anyio.run(main)
"""
    finished = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip() == "done"


async def test_a_read_only_store_sees_a_live_writer_and_refuses_to_write(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with SQLiteStore(db) as writer:
        await writer.append("run-1", [started(1), started(2)], summary(2))
        async with SQLiteStore(db, read_only=True) as reader:
            assert [e.seq for e in await reader.read("run-1")] == [1, 2]
            # Committed after the reader opened: seen on its next read.
            await writer.append("run-1", [started(3)], summary(3))
            assert [e.seq for e in await reader.read("run-1", after=2)] == [3]
            listed = await reader.list_runs()
            assert [(s.run_id, s.last_seq) for s in listed] == [("run-1", 3)]
            with pytest.raises(PermissionError, match="read-only"):
                await reader.append("run-1", [started(4)], summary(4))
            with pytest.raises(PermissionError, match="read-only"):
                await reader.delete_run("run-1")
            with pytest.raises(PermissionError, match="read-only"):
                await reader.record_tool_effect(
                    "run-1",
                    ToolEffectRecord(
                        key="k", task_id="t1", tool="send_email", arguments={}
                    ),
                )
        assert [e.seq for e in await writer.read("run-1")] == [1, 2, 3]


async def test_reading_an_idle_journal_leaves_no_wal_files_behind(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with SQLiteStore(db) as writer:
        await writer.append("run-1", [started(1), started(2)], summary(2))
    assert sorted(os.listdir(tmp_path)) == ["j.db"]

    async with SQLiteStore(db, read_only=True) as reader:
        assert [e.seq for e in await reader.read("run-1")] == [1, 2]
        assert [s.run_id for s in await reader.list_runs()] == ["run-1"]
        with pytest.raises(PermissionError, match="read-only"):
            await reader.append("run-1", [started(3)], summary(3))

    assert sorted(os.listdir(tmp_path)) == ["j.db"]
    async with SQLiteStore(db) as writer:  # nothing was written
        assert [e.seq for e in await writer.read("run-1")] == [1, 2]


async def test_a_read_only_store_reads_a_journal_it_may_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "j.db"
    async with SQLiteStore(db) as writer:
        await writer.append("run-1", [started(1)], summary(1))
    # As a user without write permission sees it (root may write anything).
    opened: list[str] = []
    connect = sqlite3.connect

    def recording_connect(target: str, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(target))
        return connect(target, *args, **kwargs)

    monkeypatch.setattr(os, "access", lambda path, mode: mode != os.W_OK)
    monkeypatch.setattr(sqlite3, "connect", recording_connect)
    async with SQLiteStore(db, read_only=True) as reader:
        assert [e.seq for e in await reader.read("run-1")] == [1]
    assert opened == [f"{db.resolve().as_uri()}?mode=ro"]


async def test_reading_an_archived_journal_nobody_may_write_leaves_no_files(
    tmp_path: Path,
) -> None:
    # Mode 0444 in a writable directory: a plain read-only open would create
    # -wal and -shm files that only a writer could remove.
    db = tmp_path / "j.db"
    async with SQLiteStore(db) as writer:
        await writer.append("run-1", [started(1), started(2)], summary(2))
    db.chmod(0o444)
    try:
        async with SQLiteStore(db, read_only=True) as reader:
            assert [e.seq for e in await reader.read("run-1")] == [1, 2]
            assert sorted(os.listdir(tmp_path)) == ["j.db"]
        assert sorted(os.listdir(tmp_path)) == ["j.db"]
    finally:
        db.chmod(0o644)


@pytest.mark.parametrize("content", ["missing", "empty", "foreign", "newer"])
def test_a_read_only_store_opens_only_a_journal_and_changes_nothing(
    tmp_path: Path, content: str
) -> None:
    db = tmp_path / "j.db"
    if content == "empty":
        db.touch()
    elif content in ("foreign", "newer"):
        with closing(sqlite3.connect(db)) as conn:
            conn.execute("CREATE TABLE notes (body TEXT)")
            if content == "newer":
                conn.execute("PRAGMA user_version = 99")
            conn.commit()
    before = db.read_bytes() if db.exists() else None

    with pytest.raises(ConfigurationError) as caught:
        SQLiteStore(db, read_only=True)

    assert caught.value.field == "path"
    assert str(db) in caught.value.problem
    assert (db.read_bytes() if db.exists() else None) == before


@pytest.mark.parametrize(
    ("table", "column", "value", "what", "seq"),
    [
        ("events", "payload", "{broken", "event 2", 2),
        ("events", "payload", '{"type": "no_such_event"}', "event 2", 2),
        ("runs", "status", "bogus", "summary row", None),
    ],
    ids=["not json", "no event", "unknown status"],
)
async def test_a_row_edited_by_hand_is_reported_naming_file_run_and_seq(
    tmp_path: Path, table: str, column: str, value: str, what: str, seq: int | None
) -> None:
    db = tmp_path / "j.db"
    async with SQLiteStore(db) as writer:
        await writer.append("run-1", [started(1), started(2)], summary(2))
    where = "seq = 2" if table == "events" else "run_id = 'run-1'"
    with closing(sqlite3.connect(db)) as conn:
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE {where}", (value,))
        conn.commit()

    async with SQLiteStore(db, read_only=True) as reader:
        reading = reader.read("run-1") if table == "events" else reader.list_runs()
        with pytest.raises(JournalCorrupt) as caught:
            await reading

    message = str(caught.value)
    assert message.startswith(f"{db}: run run-1: {what} cannot be read (")
    assert "\n" not in message
    assert (caught.value.run_id, caught.value.seq) == ("run-1", seq)


_READ_WITHOUT_PRIVILEGES = """
import ctypes, os, sys, anyio
from replan.store import SQLiteStore

if os.geteuid() == 0:
    # Root may write anything: give up every capability, as an ordinary
    # user of a read-only copy would be.
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint32) for name in ("eff", "perm", "inh")]

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()) != 0:
        sys.exit(77)
    try:
        open(os.path.join(os.path.dirname(sys.argv[1]), "probe"), "w")
        sys.exit(77)  # still privileged
    except PermissionError:
        pass

async def main() -> None:
    async with SQLiteStore(sys.argv[1], read_only=True) as reader:
        runs = [s.run_id for s in await reader.list_runs()]
        print(len(await reader.read("run-1")), runs)

anyio.run(main)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="drops Linux capabilities")
def test_a_journal_in_a_directory_nobody_may_write_is_still_read(
    tmp_path: Path,
) -> None:
    # A copied or archived journal: file and directory read-only, no -wal.
    directory = tmp_path / "archive"
    db = directory / "j.db"

    async def write() -> None:
        async with SQLiteStore(db) as writer:
            await writer.append("run-1", [started(1), started(2)], summary(2))

    anyio.run(write)
    db.chmod(0o444)
    directory.chmod(0o555)
    try:
        read = subprocess.run(
            [sys.executable, "-W", "error", "-c", _READ_WITHOUT_PRIVILEGES, str(db)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if read.returncode == 77:
            pytest.skip("cannot drop the privilege to write here")
        assert read.returncode == 0, read.stderr
        assert read.stdout.split() == ["2", "['run-1']"]
        assert sorted(os.listdir(directory)) == ["j.db"]
    finally:
        directory.chmod(0o755)


async def test_the_drivers_lease_is_shared_by_starters_and_held_alone_to_resume(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with SQLiteStore(db) as a, SQLiteStore(db) as b, SQLiteStore(db) as c:
        a.hold_lease(a, exclusive=False)
        b.hold_lease(b, exclusive=False)  # two supervisors starting runs: fine
        with pytest.raises(ConfigurationError, match="resuming runs needs") as caught:
            c.hold_lease(c, exclusive=True)
        assert caught.value.field == "store"
        assert str(db) in caught.value.problem

        # A refused conversion keeps the shared lease it had.
        with pytest.raises(ConfigurationError):
            a.hold_lease(a, exclusive=True)
        b.release_lease(b)
        with pytest.raises(ConfigurationError):
            c.hold_lease(c, exclusive=True)  # a still shares it

        a.release_lease(a)
        c.hold_lease(c, exclusive=True)
        with pytest.raises(ConfigurationError, match="is resuming runs"):
            a.hold_lease(a, exclusive=False)
    # Closing a store lets go of its lease.
    async with SQLiteStore(db) as d:
        d.hold_lease(d, exclusive=True)
        async with SQLiteStore(db, read_only=True) as reader:
            reader.hold_lease(reader, exclusive=True)  # a reader drives nothing: no-op


async def test_every_name_of_one_journal_shares_its_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "j.db"
    link = tmp_path / "alias.db"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    async with SQLiteStore(db) as store:
        link.symlink_to(db)
        monkeypatch.chdir(tmp_path)
        relative = SQLiteStore("j.db")
        monkeypatch.chdir(elsewhere)  # a daemon changing directory, say
        async with relative, SQLiteStore(link) as aliased:
            store.hold_lease(store, exclusive=True)
            for other in (aliased, relative):
                with pytest.raises(ConfigurationError, match="is resuming runs"):
                    other.hold_lease(other, exclusive=False)
    assert sorted(os.listdir(elsewhere)) == []


async def test_supervisors_sharing_one_store_object_are_told_apart_by_holder(
    tmp_path: Path,
) -> None:
    first, second = object(), object()
    async with SQLiteStore(tmp_path / "j.db") as store:
        store.hold_lease(first, exclusive=False)
        with pytest.raises(ConfigurationError, match="resuming runs needs"):
            store.hold_lease(second, exclusive=True)
        store.hold_lease(second, exclusive=False)
        store.release_lease(first)
        # The second still holds the lease: another process cannot resume.
        async with SQLiteStore(tmp_path / "j.db") as other:
            with pytest.raises(ConfigurationError):
                other.hold_lease(other, exclusive=True)
            store.release_lease(second)
            other.hold_lease(other, exclusive=True)
            with pytest.raises(ConfigurationError, match="is resuming runs"):
                store.hold_lease(first, exclusive=False)


async def test_deleting_runs_counts_toward_the_checkpoints_as_appending_does(
    tmp_path: Path,
) -> None:
    # A retention pass commits only deletions: they write pages to the WAL
    # as appends do, so they start the thread's rounds too.
    async with SQLiteStore(tmp_path / "j.db") as store:
        runs = CHECKPOINT_EVERY // 4
        for n in range(runs):
            run_id = f"run-{n}"
            await store.append(
                run_id, [started(1), started(2)], summary(2, run_id=run_id)
            )
        assert store._checkpointer._thread is None  # 2 * runs < CHECKPOINT_EVERY
        for n in range(runs):
            await store.delete_run(f"run-{n}")
        rounds = store._checkpointer.rounds
        assert await anyio.to_thread.run_sync(rounds.acquire, True, 10)
        assert await store.list_runs() == []


async def test_compacting_runs_counts_toward_the_checkpoints_as_appending_does(
    tmp_path: Path,
) -> None:
    memory = MemoryStore()
    async with Supervisor(demo_model(), memory) as sup:
        no_gate = demo_spec().model_copy(
            update={"gate_policy": GatePolicy(gate_on=frozenset())}
        )
        with anyio.fail_after(10):
            finished = await (await sup.submit(no_gate)).result()
    folded = snapshot(replay(await memory.read(finished.run_id)), 2)
    async with SQLiteStore(tmp_path / "j.db") as store:
        runs = CHECKPOINT_EVERY // 4
        for n in range(runs):  # one append per event, as a run makes them
            run_id = f"run-{n}"
            for seq in (1, 2):
                await store.append(run_id, [started(seq)], summary(seq, run_id=run_id))
        assert store._checkpointer._thread is None  # 2 * runs < CHECKPOINT_EVERY
        for n in range(runs):
            run_id = f"run-{n}"
            await store.compact_run(
                run_id, folded.model_copy(update={"run_id": run_id, "seq": 2})
            )
        rounds = store._checkpointer.rounds
        assert await anyio.to_thread.run_sync(rounds.acquire, True, 10)


async def test_a_wal_grown_past_its_bound_is_truncated_once_asked(
    tmp_path: Path,
) -> None:
    from replan.store._sqlite import WAL_SIZE_LIMIT

    db, wal = tmp_path / "j.db", tmp_path / "j.db-wal"
    async with SQLiteStore(db) as store:
        await store.append("run-1", [started(1)], summary(1))
        # A burst with no append after it to rewind the WAL (what a
        # retention pass leaves), made here in one transaction.
        with closing(sqlite3.connect(db)) as other:
            other.execute("CREATE TABLE scratch (x BLOB)")
            other.executemany(
                "INSERT INTO scratch VALUES (?)",
                [(os.urandom(4096),) for _ in range(WAL_SIZE_LIMIT // 4096 + 512)],
            )
            other.execute("DROP TABLE scratch")
            other.commit()
        assert wal.stat().st_size > WAL_SIZE_LIMIT
        store.checkpoint_soon()
        rounds = store._checkpointer.rounds
        assert await anyio.to_thread.run_sync(rounds.acquire, True, 10)
        assert wal.stat().st_size <= WAL_SIZE_LIMIT
        assert await store.read("run-1") == [started(1)]


async def test_a_retention_pass_that_removed_runs_ends_with_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Deleting runs grows the WAL and no append may follow to rewind it.
    settings = DaemonSettings(
        data_dir=tmp_path,
        retention="delete",
        retention_age_s=0,
        retention_interval_s=3600,
    )
    no_gate = demo_spec().model_copy(
        update={"gate_policy": GatePolicy(gate_on=frozenset())}
    )
    with anyio.fail_after(20):
        async with (
            SQLiteStore(settings.journal_path) as store,
            Supervisor(demo_model(), store) as sup,
        ):
            for _ in range(2):
                await (await sup.submit(no_gate)).result()
    asked: list[SQLiteStore] = []
    checkpoint_soon = SQLiteStore.checkpoint_soon

    def counted(store: SQLiteStore) -> None:
        asked.append(store)
        checkpoint_soon(store)

    monkeypatch.setattr(SQLiteStore, "checkpoint_soon", counted)
    daemon = Daemon(settings=settings, token=Token("t" * 32), model=demo_model())
    with anyio.fail_after(20):
        async with daemon.running():
            while not asked:  # noqa: ASYNC110 (the daemon's first pass, as it starts)
                await anyio.sleep(0.01)
            assert daemon.counters.deleted == 2
            assert await apply_retention(daemon) == 0  # nothing left to remove
    assert len(asked) == 1
