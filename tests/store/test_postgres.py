"""The PostgreSQL journal: its schema, two processes on one run, damaged
rows, cancellation and lost connections (its run leases: see
``test_postgres_leases.py``)."""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from postgres_server import USER, PostgresServer
from write_samples import started, summary

from replan import ConfigurationError
from replan.messages import TaskOutcome
from replan.store import (
    EffectRecord,
    JournalCorrupt,
    PostgresStore,
    SQLiteStore,
    ToolEffectRecord,
)

CHILD = Path(__file__).with_name("postgres_child.py")


def sql(dsn: str, statement: str, params: tuple[object, ...] = ()) -> list[Any]:
    """Run one statement on a connection of its own; its rows, if any."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(statement, params)  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description else []


def child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def line_of(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    with anyio.fail_after(30):
        return await anyio.to_thread.run_sync(
            process.stdout.readline, abandon_on_cancel=True
        )


async def eventually(check: Callable[[], bool], timeout_s: float = 10) -> None:
    with anyio.fail_after(timeout_s):
        while True:
            if check():
                return
            await anyio.sleep(0.05)


# The schema


async def test_the_tables_are_created_in_the_replan_schema_with_a_version(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn):
        pass
    tables = sql(
        postgres_dsn,
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = 'replan' ORDER BY table_name",
    )
    assert [name for (name,) in tables] == [
        "effects",
        "events",
        "journal_schema",
        "requests",
        "runs",
        "tool_effects",
    ]
    assert sql(postgres_dsn, "SELECT version FROM replan.journal_schema") == [(3,)]


async def test_the_rows_are_those_of_the_sqlite_journal(
    postgres_dsn: str, tmp_path: Path
) -> None:
    done = EffectRecord(task_id="t1", attempt=1, outcome=TaskOutcome(success=True))
    call = ToolEffectRecord(key="k", task_id="t1", tool="mail", arguments={})
    for store in (PostgresStore(postgres_dsn), SQLiteStore(tmp_path / "j.db")):
        async with store:
            await store.append("run-1", [started(1), started(2)], summary(2))
            await store.record_effect("run-1", done)
            await store.record_tool_effect("run-1", call)
    queries = {
        "events": "SELECT run_id, seq, type, payload, at FROM events ORDER BY seq",
        "runs": "SELECT run_id, goal, kind, pattern, status, created_at, "
        "updated_at, last_seq, stop_reason FROM runs",
        "effects": "SELECT run_id, task_id, attempt, payload FROM effects",
        "tool_effects": "SELECT run_id, task_id, key, payload FROM tool_effects",
    }
    with closing(sqlite3.connect(tmp_path / "j.db")) as conn:
        in_sqlite = {name: conn.execute(q).fetchall() for name, q in queries.items()}
    with psycopg.connect(f"{postgres_dsn} options='-c search_path=replan'") as conn:
        in_postgres = {
            name: [tuple(row) for row in conn.execute(q).fetchall()]  # type: ignore[arg-type]
            for name, q in queries.items()
        }
    assert in_postgres == in_sqlite
    (event,) = [row for row in in_postgres["events"] if row[1] == 1]
    assert event[4] == "2026-01-05T08:30:01.000000+00:00"  # ISO-8601, in UTC
    assert json.loads(event[3])["kind"] == "task_started"


async def test_two_schemas_of_one_database_are_two_journals(
    postgres_dsn: str,
) -> None:
    async with (
        PostgresStore(postgres_dsn, schema="team a") as first,
        PostgresStore(postgres_dsn, schema="team b") as second,
    ):
        await first.append("run-1", [started(1)], summary(1))
        assert await second.read("run-1") == []
        assert await second.list_runs() == []


async def test_a_schema_from_a_newer_replan_is_refused(postgres_dsn: str) -> None:
    async with PostgresStore(postgres_dsn):
        pass
    sql(postgres_dsn, "UPDATE replan.journal_schema SET version = 99")
    with pytest.raises(ConfigurationError, match="journal schema 99") as caught:
        PostgresStore(postgres_dsn)
    assert caught.value.field == "schema"


async def test_a_schema_with_another_applications_tables_is_refused_and_left_alone(
    postgres_dsn: str,
) -> None:
    sql(postgres_dsn, "CREATE SCHEMA replan")
    sql(postgres_dsn, "CREATE TABLE replan.events (what text)")
    with pytest.raises(ConfigurationError, match="another application's") as caught:
        PostgresStore(postgres_dsn)
    assert caught.value.field == "schema"
    tables = sql(
        postgres_dsn,
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = 'replan'",
    )
    assert tables == [("events",)]
    # Tables in other schemas are no obstacle.
    async with PostgresStore(postgres_dsn, schema="journal") as store:
        await store.append("run-1", [started(1)], summary(1))


def test_stores_opening_a_new_database_at_once_create_the_tables_once(
    postgres_dsn: str,
) -> None:
    opened: list[PostgresStore] = []

    async def open_one() -> None:
        opened.append(await anyio.to_thread.run_sync(PostgresStore, postgres_dsn))

    async def open_four() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(open_one)
        for store in opened:
            await store.aclose()

    anyio.run(open_four)
    assert len(opened) == 4
    assert sql(postgres_dsn, "SELECT version FROM replan.journal_schema") == [(3,)]


def test_a_server_that_cannot_be_reached_is_a_configuration_error_without_password(
    postgres_dsn: str,
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(postgres_dsn)
    dsn = psycopg.conninfo.make_conninfo(
        "", **{**params, "dbname": "no_such_db", "password": "s3cret"}
    )
    with pytest.raises(ConfigurationError) as caught:
        PostgresStore(dsn)
    assert caught.value.field == "dsn"
    assert "no_such_db" in str(caught.value)
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://replan:s3cr%zzet@localhost/journal",
        "postgresql://replan:s3cret@[::1/journal",
        "postgres://replan:s3cret@localhost:5x/journal",
        "host=localhost password=s3cret port='x",
        "host=localhost password = 's3cret with space' port='x",
    ],
)
def test_a_dsn_that_cannot_be_read_is_named_without_its_password(dsn: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        PostgresStore(dsn, connect_timeout_s=1)
    assert caught.value.field == "dsn"
    assert "s3cr" not in str(caught.value)


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"dsn": "host='unclosed"}, "dsn"),
        ({"schema": ""}, "schema"),
        ({"schema": "x" * 64}, "schema"),
        ({"schema": "pg_journal"}, "schema"),
        ({"pool_size": 0}, "pool_size"),
        ({"pool_size": 2.5}, "pool_size"),
        ({"connect_timeout_s": 0}, "connect_timeout_s"),
        ({"connect_timeout_s": float("inf")}, "connect_timeout_s"),
    ],
)
def test_bad_arguments_are_configuration_errors_naming_them(
    postgres_dsn: str, arguments: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        PostgresStore(**{"dsn": postgres_dsn, **arguments})
    assert caught.value.field == field


def test_a_read_only_server_is_a_configuration_error_naming_the_dsn(
    postgres_dsn: str,
) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(postgres_dsn)["dbname"]
    sql(
        postgres_dsn,
        f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on',
    )
    with pytest.raises(ConfigurationError, match="read-only") as caught:
        PostgresStore(postgres_dsn)
    assert caught.value.field == "dsn"


async def test_a_journal_on_a_server_become_read_only_is_refused_on_open(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn):
        pass
    dbname = psycopg.conninfo.conninfo_to_dict(postgres_dsn)["dbname"]
    sql(
        postgres_dsn,
        f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on',
    )
    # Opened, it would fail every append of every run.
    with pytest.raises(ConfigurationError, match="read-only") as caught:
        PostgresStore(postgres_dsn)
    assert caught.value.field == "dsn"


async def test_a_dsn_may_be_a_uri(postgres_dsn: str) -> None:
    params = psycopg.conninfo.conninfo_to_dict(postgres_dsn)
    uri = (
        f"postgresql://{params['user']}@:{params['port']}/{params['dbname']}"
        f"?host={params['host']}"
    )
    async with PostgresStore(uri) as store:
        await store.append("run-1", [started(1)], summary(1))
    async with PostgresStore(postgres_dsn) as store:
        assert [e.seq for e in await store.read("run-1")] == [1]
    assert f"postgresql://{params['user']}@{params['host']}:" in store.journal


def test_a_database_that_is_not_utf8_is_a_configuration_error_naming_the_dsn(
    postgres_server: PostgresServer, postgres_dsn: str
) -> None:
    name = f"{psycopg.conninfo.conninfo_to_dict(postgres_dsn)['dbname']}_ascii"
    sql(
        postgres_dsn,
        f'CREATE DATABASE "{name}" ENCODING SQL_ASCII TEMPLATE template0 '
        "LC_COLLATE 'C' LC_CTYPE 'C'",
    )
    try:
        with pytest.raises(ConfigurationError, match="SQL_ASCII") as caught:
            PostgresStore(postgres_server.dsn(name))
        assert caught.value.field == "dsn"
        assert sql(postgres_server.dsn(name), "SELECT to_regnamespace('replan')") == [
            (None,)
        ]
    finally:
        postgres_server.drop_database(name)


def login_role(dsn: str, suffix: str) -> tuple[str, str]:
    """A new login role with no rights in the DSN's database; its name, and
    the DSN that logs in as it."""
    name = f"{psycopg.conninfo.conninfo_to_dict(dsn)['dbname']}_{suffix}"
    sql(dsn, f'CREATE ROLE "{name}" LOGIN')
    return name, dsn.replace(f"user={USER}", f"user={name}")


def test_a_login_the_server_refuses_is_a_configuration_error_naming_the_dsn(
    postgres_dsn: str,
) -> None:
    refused = postgres_dsn.replace(f"user={USER}", "user=no_such_role")
    with pytest.raises(ConfigurationError, match="no_such_role") as caught:
        PostgresStore(refused)
    assert caught.value.field == "dsn"


def test_a_role_that_cannot_create_the_journal_is_a_configuration_error(
    postgres_dsn: str,
) -> None:
    _, dsn = login_role(postgres_dsn, "guest")
    with pytest.raises(ConfigurationError, match="cannot create") as caught:
        PostgresStore(dsn)
    assert caught.value.field == "dsn"
    assert sql(postgres_dsn, "SELECT to_regnamespace('replan')") == [(None,)]


async def test_a_journal_the_role_can_read_but_not_write_is_refused_on_open(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn) as store:
        await store.append("run-1", [started(1)], summary(1))
    role, dsn = login_role(postgres_dsn, "reader")
    sql(postgres_dsn, f'GRANT USAGE ON SCHEMA replan TO "{role}"')
    sql(postgres_dsn, f'GRANT SELECT ON ALL TABLES IN SCHEMA replan TO "{role}"')
    # Opened, it would fail every append of every run.
    with pytest.raises(ConfigurationError, match="INSERT on events") as caught:
        PostgresStore(dsn)
    assert caught.value.field == "dsn"
    assert role in str(caught.value)


async def test_a_role_granted_the_journals_tables_writes_every_record(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn):
        pass
    role, dsn = login_role(postgres_dsn, "writer")
    sql(postgres_dsn, f'GRANT USAGE ON SCHEMA replan TO "{role}"')
    sql(
        postgres_dsn,
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA replan "
        f'TO "{role}"',
    )
    async with PostgresStore(dsn) as store:
        await store.append("run-1", [started(1)], summary(1))
        done = EffectRecord(task_id="t1", attempt=1, outcome=TaskOutcome(success=True))
        await store.record_effect("run-1", done)
        call = ToolEffectRecord(key="k", task_id="t1", tool="mail", arguments={})
        await store.record_tool_effect("run-1", call)
        request, added = await store.add_request("run-1", "host-b:2")
        assert added
        await store.delete_run("run-1")
        assert await store.get_request(request.id) is None
        assert await store.get_run("run-1") is None


def test_a_dsn_that_is_no_connection_string_is_named_in_one_line(
    postgres_dsn: str,
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        PostgresStore("not a dsn")
    assert caught.value.field == "dsn"
    assert "\n" not in str(caught.value)


# Stores on one journal


async def test_two_writers_in_two_processes_win_each_seq_exactly_once(
    postgres_dsn: str,
) -> None:
    count = 150
    async with PostgresStore(postgres_dsn) as store:  # the tables, made once
        writers = {
            name: child("append", postgres_dsn, "run-1", name, str(count))
            for name in ("a", "b")
        }
        try:
            for process in writers.values():
                assert await line_of(process) == "ready\n"
            for process in writers.values():
                assert process.stdin is not None
                process.stdin.write("go\n")
                process.stdin.flush()
            outcome = {
                name: json.loads(await line_of(p)) for name, p in writers.items()
            }
        finally:
            for process in writers.values():
                process.kill()
                process.wait()
                for stream in (process.stdin, process.stdout):
                    assert stream is not None
                    stream.close()
        events = await store.read("run-1")

    every = list(range(1, count + 1))
    assert [e.seq for e in events] == every
    a, b = outcome["a"], outcome["b"]
    assert sorted(a["won"] + b["won"]) == every
    for name in ("a", "b"):
        assert sorted(outcome[name]["won"] + outcome[name]["lost"]) == every
    winners = {e.seq: e.task_id for e in events}  # type: ignore[attr-defined]
    assert all(winners[seq] == "a" for seq in a["won"])
    assert all(winners[seq] == "b" for seq in b["won"])


# Damaged rows

_DAMAGE = {
    "event not json": (
        "UPDATE replan.events SET payload = '{broken' WHERE seq = 2",
        "read",
    ),
    "no such event": (
        'UPDATE replan.events SET payload = \'{"kind": "nope"}\' WHERE seq = 2',
        "read",
    ),
    "summary time": ("UPDATE replan.runs SET created_at = 'yesterday'", "get_run"),
    "summary status": ("UPDATE replan.runs SET status = 'dozing'", "list_runs"),
    "effect": ("UPDATE replan.effects SET payload = '{broken'", "read_effects"),
    "tool effect": (
        "UPDATE replan.tool_effects SET payload = '{\"key\": 1}'",
        "read_tool_effects",
    ),
}


@pytest.mark.parametrize("damage", list(_DAMAGE))
async def test_a_damaged_row_reads_as_journal_corrupt_naming_the_run(
    postgres_dsn: str, damage: str
) -> None:
    statement, call = _DAMAGE[damage]
    async with PostgresStore(postgres_dsn) as store:
        await store.append("run-1", [started(1), started(2)], summary(2))
        done = EffectRecord(task_id="t1", attempt=1, outcome=TaskOutcome(success=True))
        await store.record_effect("run-1", done)
        await store.record_tool_effect(
            "run-1",
            ToolEffectRecord(key="k", task_id="t1", tool="mail", arguments={}),
        )
        sql(postgres_dsn, statement)
        reads = {
            "read": lambda: store.read("run-1"),
            "get_run": lambda: store.get_run("run-1"),
            "list_runs": lambda: store.list_runs(),
            "read_effects": lambda: store.read_effects("run-1"),
            "read_tool_effects": lambda: store.read_tool_effects("run-1"),
        }
        with pytest.raises(JournalCorrupt, match="run run-1") as caught:
            await reads[call]()
    assert caught.value.run_id == "run-1"
    assert caught.value.seq == (2 if call == "read" else None)
    assert "schema replan" in str(caught.value)
    dbname = psycopg.conninfo.conninfo_to_dict(postgres_dsn)["dbname"]
    assert f"/{dbname} " in str(caught.value)


# Cancellation and connections


async def test_an_append_cancelled_in_flight_finishes_and_the_store_goes_on(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn, pool_size=1) as store:
        await store.append("run-1", [started(1)], summary(1))
        with psycopg.connect(postgres_dsn, autocommit=True) as blocker:
            # Another session holds the run's row: the append waits for it.
            blocker.execute("BEGIN")
            blocker.execute("SELECT 1 FROM replan.runs FOR UPDATE")
            steps: list[str] = []
            scope = anyio.CancelScope()

            async def append() -> None:
                with scope:
                    await store.append("run-1", [started(2)], summary(2))
                    steps.append("appended")
                    await anyio.sleep_forever()

            def waiting() -> bool:
                rows = blocker.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = 'replan' AND wait_event_type = 'Lock'"
                ).fetchall()
                return bool(rows[0][0])

            async with anyio.create_task_group() as tg:
                tg.start_soon(append)
                await eventually(waiting)
                scope.cancel()
                await anyio.sleep(0.2)
                assert not scope.cancelled_caught  # its transaction runs on
                blocker.execute("ROLLBACK")
        assert scope.cancelled_caught
        assert steps == ["appended"]
        assert await store.read("run-1") == [started(1), started(2)]
        # The one connection is not left in a transaction: the store goes on.
        await store.append("run-1", [started(3)], summary(3))
        states = sql(
            postgres_dsn,
            "SELECT state FROM pg_stat_activity WHERE application_name = 'replan'",
        )
        assert states == [("idle",)]


async def test_an_append_waiting_for_a_lock_held_elsewhere_gives_up_in_time(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("replan.store._postgres_pool.LOCK_TIMEOUT_MS", 300)
    async with PostgresStore(postgres_dsn) as store:
        await store.append("run-1", [started(1)], summary(1))
        with psycopg.connect(postgres_dsn, autocommit=True) as blocker:
            # A long transaction elsewhere holds the run's row and keeps it.
            blocker.execute("BEGIN")
            blocker.execute("SELECT 1 FROM replan.runs FOR UPDATE")
            with anyio.fail_after(10), pytest.raises(psycopg.errors.LockNotAvailable):
                await store.append("run-1", [started(2)], summary(2))
            blocker.execute("ROLLBACK")
        # Nothing of the failed append was kept; the next one goes in.
        assert [e.seq for e in await store.read("run-1")] == [1]
        await store.append("run-1", [started(2)], summary(2))
        assert [e.seq for e in await store.read("run-1")] == [1, 2]


async def test_a_lock_timeout_the_server_sets_is_kept(postgres_dsn: str) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(postgres_dsn)["dbname"]
    sql(postgres_dsn, f"ALTER DATABASE \"{dbname}\" SET lock_timeout = '42s'")
    async with PostgresStore(postgres_dsn) as store:
        setting = await store._connections().run(
            lambda conn: conn.execute("SHOW lock_timeout").fetchone()
        )
    assert setting == ("42s",)


async def test_a_lock_timeout_the_dsn_sets_is_kept(postgres_dsn: str) -> None:
    async with PostgresStore(f"{postgres_dsn} options='-c lock_timeout=42s'") as store:
        setting = await store._connections().run(
            lambda conn: conn.execute("SHOW lock_timeout").fetchone()
        )
    assert setting == ("42s",)


async def test_a_connection_past_descriptor_1023_is_used_again(
    postgres_dsn: str,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"at most {hard} open files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    # A daemon with a thousand clients: the store's socket comes after them.
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1030)]
    try:
        async with PostgresStore(postgres_dsn, pool_size=1) as store:

            def backend(conn: Any) -> int:
                fd = conn.fileno()
                assert isinstance(fd, int)
                assert fd > 1023
                row = conn.execute("SELECT pg_backend_pid()").fetchone()
                return int(row[0])

            pids = {await store._connections().run(backend) for _ in range(3)}
        assert len(pids) == 1
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize(
    "encoding", ["client_encoding=LATIN1", "options='-c client_encoding=SQL_ASCII'"]
)
async def test_text_of_any_script_is_kept_whatever_client_encoding_the_dsn_asks(
    postgres_dsn: str, encoding: str
) -> None:
    goal = "résumé 日本語 ✓"
    async with PostgresStore(f"{postgres_dsn} {encoding}") as store:
        await store.append(
            "run-1", [started(1)], summary(1).model_copy(update={"goal": goal})
        )
        found = await store.get_run("run-1")
    assert found is not None
    assert found.goal == goal


async def test_text_of_any_script_is_kept_whatever_pgclientencoding_asks(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGCLIENTENCODING", "LATIN1")
    goal = "résumé 日本語 ✓"
    async with PostgresStore(postgres_dsn) as store:
        await store.append(
            "run-1", [started(1)], summary(1).model_copy(update={"goal": goal})
        )
        found = await store.get_run("run-1")
    assert found is not None
    assert found.goal == goal


async def test_ids_with_a_nul_character_cannot_be_stored(postgres_dsn: str) -> None:
    # PostgreSQL's text holds no NUL; replan's own ids never have one.
    async with PostgresStore(postgres_dsn) as store:
        with pytest.raises(psycopg.DataError, match="NUL"):
            await store.append("run\x00", [started(1)], summary(1, run_id="run\x00"))
        assert await store.list_runs() == []
        await store.append("run-1", [started(1)], summary(1))
        done = EffectRecord(
            task_id="t\x00", attempt=1, outcome=TaskOutcome(success=True)
        )
        with pytest.raises(psycopg.DataError, match="NUL"):
            await store.record_effect("run-1", done)
        call = ToolEffectRecord(key="k\x00", task_id="t1", tool="mail", arguments={})
        with pytest.raises(psycopg.DataError, match="NUL"):
            await store.record_tool_effect("run-1", call)
        assert await store.read_effects("run-1") == []
        assert await store.read_tool_effects("run-1") == []


async def test_runs_appending_at_once_do_not_fail_under_a_serializable_default(
    postgres_dsn: str,
) -> None:
    isolation = "default_transaction_isolation=serializable"
    dsn = f"{postgres_dsn} options='-c {isolation}'"
    async with PostgresStore(dsn, pool_size=8) as store:

        async def run(name: str) -> None:
            for seq in range(1, 11):
                await store.append(name, [started(seq)], summary(seq, run_id=name))

        async with anyio.create_task_group() as tg:
            for n in range(40):
                tg.start_soon(run, f"run-{n}")
        level = await store._connections().run(
            lambda conn: conn.execute("SHOW transaction_isolation").fetchone()
        )
        runs = await store.list_runs()
    assert level == ("read committed",)
    assert sorted(r.last_seq for r in runs) == [10] * 40


def test_a_store_serves_one_event_loop_after_another(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn, pool_size=1)

    async def append(seq: int) -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(3):  # more calls than connections: some wait
                tg.start_soon(store.read, "run-1")
        await store.append("run-1", [started(seq)], summary(seq))

    for seq, backend in enumerate(["asyncio", "trio", "asyncio", "trio"], start=1):
        anyio.run(append, seq, backend=backend)
    anyio.run(store.aclose)
    assert [e.seq for e in anyio.run(_read_all, postgres_dsn)] == [1, 2, 3, 4]


async def _read_all(dsn: str) -> list[Any]:
    async with PostgresStore(dsn) as store:
        return await store.read("run-1")


async def test_calls_use_at_most_pool_size_connections(postgres_dsn: str) -> None:
    async with PostgresStore(postgres_dsn, pool_size=2) as store:
        await store.append("run-1", [started(1)], summary(1))
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(store.read, "run-1")
        count = sql(
            postgres_dsn,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'replan'",
        )
        assert count[0][0] <= 2
    # A closed connection's server process ends a moment after the client
    # has hung up: wait for it rather than race it.
    with anyio.move_on_after(10):
        while True:
            count = sql(
                postgres_dsn,
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = 'replan'",
            )
            if count == [(0,)]:
                break
            await anyio.sleep(0.05)
    assert count == [(0,)]


async def test_an_append_waits_for_no_crowd_of_readers(postgres_dsn: str) -> None:
    # Event streams following runs in the journal read and read again:
    # they take at most all but one of the connections, so a run's append
    # waits for one read at most, not for every read queued before it.
    async with PostgresStore(postgres_dsn, pool_size=2) as store:
        slow_reads = []
        original = store.read

        async def slow_read(run_id: str, after: int = 0) -> list[Any]:
            await store._connections().run(
                lambda conn: conn.execute("SELECT pg_sleep(0.3)"), read=True
            )
            slow_reads.append(run_id)
            return await original(run_id, after)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for _ in range(10):
                    tg.start_soon(slow_read, "run-1")
                await anyio.sleep(0.1)
                await store.append("run-1", [started(1)], summary(1))
                appended_after = len(slow_reads)
        assert appended_after <= 2, appended_after
        assert len(slow_reads) == 10


async def test_connections_the_server_ended_are_replaced_without_a_failed_call(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn) as store:
        await store.append("run-1", [started(1)], summary(1))
        sql(
            postgres_dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'replan'",
        )
        await eventually(
            lambda: (
                sql(
                    postgres_dsn,
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = 'replan'",
                )
                == [(0,)]
            )
        )
        assert await store.read("run-1") == [started(1)]
        await store.append("run-1", [started(2)], summary(2))
