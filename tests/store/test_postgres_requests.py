"""The PostgreSQL journal's requests: gate answers and cancels kept for the
supervisor that drives a run, each settled once; and a journal of the
second schema version, migrated on open."""

from __future__ import annotations

from pathlib import Path

import anyio
import psycopg
import pytest
from test_postgres_leases import A, B, create_first_version, expire, sql
from test_retention import finished_demo_run
from write_samples import started, summary

from replan import ConfigurationError
from replan.messages import GateResolution
from replan.store import MemoryStore, PostgresStore, RunRequests, SQLiteStore
from replan.store._postgres_schema import _MIGRATIONS
from replan.supervisor import replay, snapshot

APPROVE = GateResolution(decision="approve", by="ana")
REJECT = GateResolution(decision="reject", by="bo")


async def test_only_the_postgres_store_keeps_requests(
    postgres_dsn: str, tmp_path: Path
) -> None:
    async with PostgresStore(postgres_dsn) as store:
        assert isinstance(store, RunRequests)
    assert not isinstance(MemoryStore(), RunRequests)
    async with SQLiteStore(tmp_path / "j.db") as other:
        assert not isinstance(other, RunRequests)


async def test_a_gate_keeps_its_first_answer_and_a_run_one_waiting_cancel(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn) as store:
        await store.append("run-1", [started(1)], summary(1), owner=A)
        first, added = await store.add_request(
            "run-1", "host-b:2", gate_id="run-1-g1", resolution=APPROVE
        )
        assert added
        assert (first.run_id, first.gate_id, first.sender) == (
            "run-1",
            "run-1-g1",
            "host-b:2",
        )
        assert first.resolution == APPROVE
        assert first.outcome is None
        second, added = await store.add_request(
            "run-1", "host-c:3", gate_id="run-1-g1", resolution=REJECT
        )
        assert not added
        assert second == first  # the first answer stands
        cancel, added = await store.add_request("run-1", "host-b:2")
        assert added
        again, added = await store.add_request("run-1", "host-c:3")
        assert (again, added) == (cancel, False)
        assert cancel.resolution is None
        # Settled once: the first settlement stands.
        assert await store.settle_request(cancel.id, "applied")
        assert not await store.settle_request(cancel.id, "closed", "no")
        settled = await store.get_request(cancel.id)
        assert settled is not None
        assert (settled.outcome, settled.detail) == ("applied", None)
        # Settled, a cancel makes room for another.
        _, added = await store.add_request("run-1", "host-b:2")
        assert added
        assert await store.get_request(12345) is None


async def test_the_waiting_requests_are_those_of_the_owners_runs_and_ended_ones(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn) as store:
        await store.append("run-1", [started(1)], summary(1), owner=A)
        await store.append("run-2", [started(1)], summary(1, run_id="run-2"), owner=B)
        one, _ = await store.add_request("run-1", "x:1")
        two, _ = await store.add_request("run-2", "x:1")
        assert [r.id for r in await store.waiting_requests(A)] == [one.id]
        assert [r.id for r in await store.waiting_requests(B)] == [two.id]
        # Once A's lease expired, its run's requests are nobody's to apply
        # until another owner claims the run.
        expire(postgres_dsn, "run-1")
        assert await store.waiting_requests(A) == []
        await store.claim_run("run-1", B)
        assert [r.id for r in await store.waiting_requests(B)] == [one.id, two.id]
        await store.settle_request(one.id, "applied")
        assert [r.id for r in await store.waiting_requests(B)] == [two.id]


async def test_deleting_a_run_drops_its_requests(postgres_dsn: str) -> None:
    async with PostgresStore(postgres_dsn) as store:
        await store.append("run-1", [started(1)], summary(1), owner=A)
        request, _ = await store.add_request("run-1", "x:1")
        await store.delete_run("run-1")
        assert await store.get_request(request.id) is None


async def test_compacting_a_run_drops_its_requests(postgres_dsn: str) -> None:
    async with PostgresStore(postgres_dsn) as store:
        run_id = await finished_demo_run(store)
        events = await store.read(run_id)
        settled, _ = await store.add_request(
            run_id, "x:1", gate_id="g", resolution=APPROVE
        )
        assert await store.settle_request(settled.id, "applied")
        other = "run-2"
        await store.append(other, [started(1)], summary(1, run_id=other), owner=A)
        kept, _ = await store.add_request(other, "x:1")
        await store.compact_run(run_id, snapshot(replay(events), len(events)))
        assert await store.get_request(settled.id) is None
        assert await store.get_request(kept.id) == kept


def create_second_version(dsn: str) -> None:
    """A journal as the second schema version wrote it, with one run."""
    create_first_version(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in _MIGRATIONS[1]:
            conn.execute(
                psycopg.sql.SQL(statement).format(
                    schema=psycopg.sql.Identifier("replan")
                )
            )  # type: ignore[arg-type]
        conn.execute("UPDATE replan.journal_schema SET version = 2")
        conn.execute(
            "UPDATE replan.runs SET owner = 'gone', holder = 'old-host:9', "
            "lease_expires = now() - interval '1 second' WHERE run_id = 'old'"
        )


def test_a_migration_that_fails_leaves_the_journal_as_it_was(postgres_dsn: str) -> None:
    create_first_version(postgres_dsn)
    # The last step cannot be taken (a table of its name is there already):
    # the first step's columns are not kept either.
    sql(postgres_dsn, "CREATE TABLE replan.requests (what text)")
    with pytest.raises(ConfigurationError, match="requests") as caught:
        PostgresStore(postgres_dsn)
    assert caught.value.field == "dsn"
    assert sql(postgres_dsn, "SELECT version FROM replan.journal_schema") == [(1,)]
    columns = sql(
        postgres_dsn,
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = 'replan' AND table_name = 'runs' "
        "AND column_name IN ('owner', 'holder', 'lease_expires')",
    )
    assert columns == []


async def test_a_journal_of_the_second_version_is_migrated_keeping_runs_and_leases(
    postgres_dsn: str,
) -> None:
    create_second_version(postgres_dsn)
    async with PostgresStore(postgres_dsn, lease_s=1) as store:
        assert sql(postgres_dsn, "SELECT version FROM replan.journal_schema") == [(3,)]
        assert [e.seq for e in await store.read("old")] == [1]
        # The owner's lease lapsed before the store opened: left to it for
        # a lease (it may live, cut off from the server)...
        lease = await store.claim_run("old", A)
        assert lease is not None
        assert lease.holder == "old-host:9"
        await anyio.sleep(1.1)
        # ...then, its owner dead, the run is claimed, and takes requests.
        lease = await store.claim_run("old", A)
        assert lease is not None
        assert lease.owner == A.id
        request, added = await store.add_request(
            "old", "x:1", gate_id="old-g1", resolution=APPROVE
        )
        assert added
        assert [r.id for r in await store.waiting_requests(A)] == [request.id]
    # Opened again, it is the current version already: nothing to do.
    async with PostgresStore(postgres_dsn) as store:
        assert await store.get_request(request.id) == request
