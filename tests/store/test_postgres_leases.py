"""The PostgreSQL journal's run leases: claimed, renewed, expired, let go
of, fencing the appends of a supervisor that lost one; and a journal of the
first schema version, migrated on open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from write_samples import started, summary

from replan import ConfigurationError, LeaseLost
from replan.messages import RunStatus
from replan.store import (
    JournalConflict,
    MemoryStore,
    PostgresStore,
    RunLeases,
    RunOwner,
    SQLiteStore,
)
from replan.store._postgres_schema import _TABLES

A = RunOwner(id="owner-a", holder="host-a:1")
B = RunOwner(id="owner-b", holder="host-b:2")


def sql(dsn: str, statement: str, params: tuple[object, ...] = ()) -> list[Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(statement, params)  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description else []


def expire(dsn: str, run_id: str = "run-1") -> None:
    """Let the run's lease expire now (by the server's clock) without
    waiting, as its owner's dying a lease ago would, while the store that
    takes it over reaches the server."""
    sql(
        dsn,
        "UPDATE replan.runs SET lease_expires = now() WHERE run_id = %s",
        (run_id,),
    )


async def test_the_postgres_store_has_run_leases_and_the_others_do_not(
    postgres_dsn: str, tmp_path: Path
) -> None:
    async with PostgresStore(postgres_dsn) as store:
        assert isinstance(store, RunLeases)
        assert store.lease_s == 30
    async with SQLiteStore(tmp_path / "j.db") as other:
        assert not isinstance(other, RunLeases)
    assert not isinstance(MemoryStore(), RunLeases)


@pytest.mark.parametrize("lease_s", [0.5, 3601, float("nan"), True, "30"])
def test_a_lease_duration_out_of_bounds_is_a_configuration_error(
    postgres_dsn: str, lease_s: Any
) -> None:
    with pytest.raises(ConfigurationError, match="from 1 to 3600") as caught:
        PostgresStore(postgres_dsn, lease_s=lease_s)
    assert caught.value.field == "lease_s"


async def test_the_first_append_leases_the_run_to_its_owner(postgres_dsn: str) -> None:
    async with PostgresStore(postgres_dsn, lease_s=30) as store:
        await store.append("run-1", [started(1)], summary(1), owner=A)
        lease = await store.run_lease("run-1")
        assert lease is not None
        assert (lease.owner, lease.holder) == (A.id, A.holder)
        # The server's clock: about lease_s from now.
        (left,) = sql(
            postgres_dsn,
            "SELECT extract(epoch FROM lease_expires - now()) FROM replan.runs",
        )[0]
        assert 25 < float(left) <= 30
        # Its owner renews it; another is shown who holds it.
        assert await store.claim_run("run-1", A) == await store.run_lease("run-1")
        held = await store.claim_run("run-1", B)
        assert held is not None
        assert held.holder == A.holder


async def test_a_run_whose_lease_expired_is_claimed_by_another_and_fences_the_first(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn) as store:
        await store.append("run-1", [started(1)], summary(1), owner=A)
        await store.append("run-1", [started(2)], summary(2), owner=A)
        expire(postgres_dsn)
        assert await store.run_lease("run-1") is None
        lease = await store.claim_run("run-1", B)
        assert lease is not None
        assert lease.owner == B.id
        # The stale owner's next append is refused, naming who holds it now...
        with pytest.raises(LeaseLost, match="host-b:2") as caught:
            await store.append("run-1", [started(3)], summary(3), owner=A)
        assert isinstance(caught.value, JournalConflict)
        assert caught.value.holder == B.holder
        # ...its renewal no longer counts the run among its own...
        assert await store.renew_leases(A, ["run-1"]) == set()
        assert await store.renew_leases(B, ["run-1"]) == {"run-1"}
        # ...and the new owner goes on from where the journal stands.
        await store.append("run-1", [started(3)], summary(3), owner=B)
        assert [e.seq for e in await store.read("run-1")] == [1, 2, 3]


async def test_an_expired_lease_still_lets_its_owner_append_until_another_claims(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn, lease_s=1) as store:
        await store.append("run-1", [started(1)], summary(1), owner=A)
        expire(postgres_dsn)
        # Nobody took it: the owner is still its only writer, and the
        # append renews the lease.
        await store.append("run-1", [started(2)], summary(2), owner=A)
        lease = await store.run_lease("run-1")
        assert lease is not None
        assert lease.owner == A.id


async def test_a_lease_expires_by_itself_once_its_duration_passed(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn, lease_s=1) as store:
        await store.append("run-1", [started(1)], summary(1), owner=A)
        held = await store.claim_run("run-1", B)
        assert held is not None
        assert held.owner == A.id
        sql(postgres_dsn, "SELECT pg_sleep(1.1)")
        lease = await store.claim_run("run-1", B)
        assert lease is not None
        assert lease.owner == B.id


async def test_renewing_extends_the_owners_leases_of_the_runs_it_drives_alone(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn) as store:
        for run_id, owner in (("r1", A), ("r2", A), ("r3", B), ("r4", A)):
            await store.append(
                run_id, [started(1)], summary(1, run_id=run_id), owner=owner
            )
        sql(postgres_dsn, "UPDATE replan.runs SET lease_expires = now()")
        # r4 is A's, but A no longer drives it (its driver crashed, say).
        assert await store.renew_leases(A, ["r1", "r2", "r3"]) == {"r1", "r2"}
        assert await store.renew_leases(A, []) == set()
        rows = sql(
            postgres_dsn,
            "SELECT run_id, lease_expires > now() + interval '20 seconds' "
            "FROM replan.runs ORDER BY run_id",
        )
        assert rows == [("r1", True), ("r2", True), ("r3", False), ("r4", False)]


async def test_a_finished_run_lets_go_of_its_lease_and_cannot_be_claimed(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn) as store:
        await store.append("run-1", [started(1)], summary(1), owner=A)
        await store.append(
            "run-1", [started(2)], summary(2, RunStatus.COMPLETED), owner=A
        )
        assert await store.run_lease("run-1") is None
        assert sql(postgres_dsn, "SELECT owner, holder FROM replan.runs") == [
            (None, None)
        ]
        assert await store.claim_run("run-1", B) is None
        assert await store.claim_run("no-such-run", B) is None


async def test_released_leases_are_claimed_at_once(postgres_dsn: str) -> None:
    async with PostgresStore(postgres_dsn) as store:
        for run_id in ("r1", "r2", "r3"):
            await store.append(run_id, [started(1)], summary(1, run_id=run_id), owner=A)
        await store.release_leases(A, ["r1"])
        lease = await store.claim_run("r1", B)
        assert lease is not None
        assert lease.owner == B.id
        await store.release_leases(A)
        assert await store.renew_leases(A, ["r1", "r2", "r3"]) == set()
        assert {await store.run_lease(r) for r in ("r2", "r3")} == {None}
        # Another owner's leases are not its to let go of.
        await store.release_leases(A, ["r1"])
        assert await store.renew_leases(B, ["r1"]) == {"r1"}


async def test_the_claimable_runs_are_the_unfinished_ones_nobody_else_holds(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn) as store:
        for run_id, owner in (("r1", A), ("r2", B), ("r3", None), ("r4", B)):
            await store.append(
                run_id, [started(1)], summary(1, run_id=run_id), owner=owner
            )
        await store.append(
            "r5", [started(1)], summary(1, RunStatus.FAILED, run_id="r5"), owner=B
        )
        expire(postgres_dsn, "r4")
        # Newest first (these were created at once: by id, descending).
        assert await store.claimable_runs(A) == ["r4", "r3", "r1"]
        assert await store.claimable_runs(B) == ["r4", "r3", "r2"]


async def test_an_append_without_an_owner_is_refused_while_a_lease_holds(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn) as store:
        await store.append("run-1", [started(1)], summary(1), owner=A)
        with pytest.raises(JournalConflict, match="host-a:1 holds its lease") as caught:
            await store.append("run-1", [started(2)], summary(2))
        assert not isinstance(caught.value, LeaseLost)
        # A run nobody leases takes appends with no owner, as before.
        await store.append("run-2", [started(1)], summary(1, run_id="run-2"))
        await store.append("run-2", [started(2)], summary(2, run_id="run-2"))
        # And an owner's append of a run nobody holds is refused: it is no
        # longer (or never was) its run.
        with pytest.raises(LeaseLost, match="nobody's"):
            await store.append(
                "run-2", [started(3)], summary(3, run_id="run-2"), owner=A
            )


async def test_a_seq_conflict_of_the_owner_is_a_plain_journal_conflict(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn) as store:
        await store.append("run-1", [started(1)], summary(1), owner=A)
        with pytest.raises(JournalConflict, match="expected seq 2") as caught:
            await store.append("run-1", [started(1)], summary(1), owner=A)
        assert not isinstance(caught.value, LeaseLost)


# The schema's first version, migrated


def create_first_version(dsn: str) -> None:
    """A journal as the first schema version wrote it, with one run."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA replan")
        for statement in _TABLES:
            conn.execute(
                psycopg.sql.SQL(statement).format(
                    schema=psycopg.sql.Identifier("replan")
                )
            )  # type: ignore[arg-type]
        conn.execute("INSERT INTO replan.journal_schema (version) VALUES (1)")
        conn.execute(
            "INSERT INTO replan.runs (run_id, goal, kind, pattern, status, "
            "created_at, updated_at, last_seq, head, head_at) VALUES "
            "('old', 'g', 'plan', 'discovery', 'running', "
            "'2026-01-05T08:30:00+00:00', '2026-01-05T08:30:01+00:00', 1, 1, "
            "'2026-01-05T08:30:01+00:00')"
        )
        event = started(1).model_dump_json()
        conn.execute(
            "INSERT INTO replan.events VALUES ('old', 1, 'task_started', %s, "
            "'2026-01-05T08:30:01+00:00')",
            (event,),
        )


async def test_a_journal_of_the_first_version_is_migrated_and_its_runs_claimed(
    postgres_dsn: str,
) -> None:
    create_first_version(postgres_dsn)
    async with PostgresStore(postgres_dsn) as store:
        assert sql(postgres_dsn, "SELECT version FROM replan.journal_schema") == [(3,)]
        assert [e.seq for e in await store.read("old")] == [1]
        found = await store.get_run("old")
        assert found is not None
        assert found.status is RunStatus.RUNNING
        # Nobody holds the old run: the first supervisor to look takes it.
        assert await store.run_lease("old") is None
        lease = await store.claim_run("old", A)
        assert lease is not None
        assert lease.owner == A.id
        await store.append("old", [started(2)], summary(2, run_id="old"), owner=A)
    # Opened again, it is the current version already: nothing to do.
    async with PostgresStore(postgres_dsn) as store:
        assert [e.seq for e in await store.read("old")] == [1, 2]
