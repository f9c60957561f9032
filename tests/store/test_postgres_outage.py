"""The PostgreSQL journal while its server restarts, drops the store's
sessions or cannot be reached: calls wait for it, within a bound, and
nothing is written twice."""

from __future__ import annotations

import logging
import threading
import time

import anyio
import postgres_server as postgres
import psycopg
import pytest
from postgres_server import PostgresServer
from write_samples import started, summary

from replan import ConfigurationError
from replan.store import PostgresStore, RunOwner
from replan.store import _postgres_pool as pool_module


def _later(seconds: float, action: object) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        action()  # type: ignore[operator]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


async def test_an_append_while_the_server_restarts_waits_for_it_and_is_kept_once(
    own_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = own_server.dsn(own_server.new_database())
    caplog.set_level(logging.WARNING, "replan.store")
    async with PostgresStore(dsn) as store:
        await store.append("run-1", [started(1)], summary(1))
        postgres.halt(own_server)
        back = _later(1.5, lambda: postgres.start_again(own_server))
        try:
            with anyio.fail_after(20):
                await store.append("run-1", [started(2)], summary(2))
                assert store.outage is None
                assert [e.seq for e in await store.read("run-1")] == [1, 2]
        finally:
            back.join()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot be reached" in m for m in messages) == 1, messages
    assert sum("reachable again" in m for m in messages) == 1, messages
    lost = f"the journal at {store.journal} cannot be reached; calls wait for it "
    assert any(m.startswith(f"{lost}for up to 30s, then fail: ") for m in messages)
    assert f"the journal at {store.journal} is reachable again" in messages


async def test_a_session_ended_under_a_call_is_replaced_and_the_call_goes_on(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn) as store:
        await store.append("run-1", [started(1)], summary(1))
        with psycopg.connect(postgres_dsn) as admin:
            # The run's row locked elsewhere: the append waits in its
            # session, which an administrator (a proxy, a failover) ends.
            admin.execute("SELECT 1 FROM replan.runs FOR UPDATE")

            async def end_the_waiting_session() -> None:
                for _ in range(500):
                    ended = admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                    ).fetchall()
                    if ended:
                        break
                    await anyio.sleep(0.02)
                admin.rollback()

            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(end_the_waiting_session)
                    await store.append("run-1", [started(2)], summary(2))
        assert [e.seq for e in await store.read("run-1")] == [1, 2]


async def test_an_append_committed_as_its_connection_dropped_is_not_refused(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The commit reached the server, its answer did not: the append tried
    # again finds its own events instead of a conflict.
    work = pool_module.Pool._work
    dropped = []

    def drop_after_the_first(self: pool_module.Pool, job: object) -> object:
        result = work(self, job)  # type: ignore[arg-type]
        if not dropped:
            dropped.append(True)
            raise pool_module._Unreachable(psycopg.OperationalError("gone"))
        return result

    async with PostgresStore(postgres_dsn) as store:
        await store.append("run-1", [started(1)], summary(1))
        monkeypatch.setattr(pool_module.Pool, "_work", drop_after_the_first)
        await store.append("run-1", [started(2), started(3)], summary(3))
        assert dropped
        assert [e.seq for e in await store.read("run-1")] == [1, 2, 3]
        # A real conflict is still one.
        with pytest.raises(Exception, match="expected seq 4"):
            await store.append("run-1", [started(2)], summary(2))


def counted_tries(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When the store's pool tries to take a connection, from now on."""
    tries: list[float] = []
    take = pool_module.Pool._take

    def counted(self: pool_module.Pool) -> object:
        tries.append(time.monotonic())
        return take(self)

    monkeypatch.setattr(pool_module.Pool, "_take", counted)
    return tries


async def test_a_server_down_longer_than_reconnect_s_fails_the_call_without_spinning(
    own_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = own_server.dsn(own_server.new_database())
    tries = counted_tries(monkeypatch)
    async with PostgresStore(dsn, reconnect_s=1.5) as store:
        postgres.halt(own_server)
        try:
            started_at = time.monotonic()
            with pytest.raises(psycopg.OperationalError):
                await store.read("run-1")
            took = time.monotonic() - started_at
            assert 1.4 <= took < 5, took
            # 0.1 s, then twice as long each time: a handful of tries.
            assert 3 <= len(tries) <= 6, len(tries)
            assert store.outage is not None
            assert "server" in store.outage or "socket" in store.outage
            # Past the outage's reconnect_s, calls fail at once (a
            # supervisor stopping does not wait again for each write).
            started_at = time.monotonic()
            with pytest.raises(psycopg.OperationalError) as first:
                await store.append("run-1", [started(1)], summary(1))
            with pytest.raises(psycopg.OperationalError) as second:
                await store.append("run-1", [started(1)], summary(1))
            assert time.monotonic() - started_at < 1
            # Each call its own error: one instance raised in every waiting
            # task would gather all their tracebacks (and frames).
            assert second.value is not first.value
        finally:
            postgres.start_again(own_server)
        # Past reconnect_s a call tries only when a try is due (the delay
        # is at most LONGEST_DELAY_S); one made before that fails at once.
        await anyio.sleep(pool_module.LONGEST_DELAY_S)
        assert await store.read("run-1") == []
        assert store.outage is None


async def test_calls_waiting_for_the_server_share_one_schedule_of_tries(
    own_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = own_server.dsn(own_server.new_database())
    tries = counted_tries(monkeypatch)
    async with PostgresStore(dsn, reconnect_s=1.5, pool_size=1) as store:
        postgres.halt(own_server)
        try:
            failed = []

            async def read() -> None:
                with pytest.raises(psycopg.OperationalError):
                    await store.read("run-1")
                failed.append(True)

            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    for _ in range(30):
                        tg.start_soon(read)
            assert len(failed) == 30
            # A crowd of calls tries as one call does (0.1 s, then twice as
            # long each time), not once each per delay.
            assert len(tries) <= 8, len(tries)
        finally:
            postgres.start_again(own_server)


async def test_a_store_whose_reconnect_s_is_0_fails_a_call_after_one_try(
    own_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = own_server.dsn(own_server.new_database())
    tries = counted_tries(monkeypatch)
    async with PostgresStore(dsn, reconnect_s=0) as store:
        postgres.halt(own_server)
        try:
            with anyio.fail_after(10), pytest.raises(psycopg.OperationalError):
                await store.read("run-1")
            assert len(tries) == 1
            assert store.outage is not None
        finally:
            postgres.start_again(own_server)


@pytest.mark.parametrize("reconnect_s", [-1, 3601, float("nan"), True, "5"])
def test_reconnect_s_out_of_range_is_a_configuration_error(
    postgres_dsn: str, reconnect_s: object
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        PostgresStore(postgres_dsn, reconnect_s=reconnect_s)  # type: ignore[arg-type]
    assert caught.value.field == "reconnect_s"


A = RunOwner(id="owner-a", holder="host-a:1")
B = RunOwner(id="owner-b", holder="host-b:2")


async def test_leases_that_expired_while_the_server_was_down_are_left_to_their_owners(
    own_server: PostgresServer,
) -> None:
    # The server is down longer than a lease: every supervisor's leases
    # expire, none could renew. Once it is back, the one whose scan comes
    # first does not take the others' runs: they renew them; a run whose
    # owner died meanwhile is taken over a lease later.
    dsn = own_server.dsn(own_server.new_database())
    async with (
        PostgresStore(dsn, lease_s=1) as store_a,
        PostgresStore(dsn, lease_s=1) as store_b,
    ):
        await store_a.append("run-1", [started(1)], summary(1), owner=A)
        postgres.halt(own_server)
        back = _later(2.5, lambda: postgres.start_again(own_server))
        try:
            with anyio.fail_after(20):
                # Both look for runs to take up while it is down.
                async with anyio.create_task_group() as tg:
                    tg.start_soon(store_a.claimable_runs, A)
                    assert await store_b.claimable_runs(B) == []
        finally:
            back.join()
        assert await store_b.claimable_runs(B) == []
        lease = await store_b.claim_run("run-1", B)
        assert lease is not None
        assert lease.holder == "host-a:1"
        assert await store_a.renew_leases(A, ["run-1"]) == {"run-1"}
        await store_a.append("run-1", [started(2)], summary(2), owner=A)
        # A dies now: B takes the run over once its lease has passed.
        await anyio.sleep(1.2)
        assert await store_b.claimable_runs(B) == ["run-1"]
        lease = await store_b.claim_run("run-1", B)
        assert lease is not None
        assert lease.owner == B.id


C = RunOwner(id="owner-c", holder="host-c:3")


async def claimable_soon(store: PostgresStore, owner: RunOwner) -> None:
    """Wait (up to 5 s) until ``owner`` may claim a run."""
    for _ in range(100):
        if await store.claimable_runs(owner):
            return
        await anyio.sleep(0.05)
    pytest.fail("no run became claimable within 5 s")


async def test_a_store_opened_just_after_an_outage_leaves_lapsed_leases_to_their_owners(
    own_server: PostgresServer,
) -> None:
    # The server is down longer than a lease; a store opened just after it
    # came back (a daemon started then) never saw the outage, yet the
    # leases that lapsed meanwhile are its owners' to renew: it takes over
    # none of them for a lease, then those whose owner died.
    dsn = own_server.dsn(own_server.new_database())
    async with PostgresStore(dsn, lease_s=1) as store_a:
        await store_a.append("run-1", [started(1)], summary(1), owner=A)
        postgres.halt(own_server)
        await anyio.sleep(1.5)
        postgres.start_again(own_server)
        async with PostgresStore(dsn, lease_s=1) as store_c:
            assert await store_c.claimable_runs(C) == []
            lease = await store_c.claim_run("run-1", C)
            assert lease is not None
            assert lease.holder == "host-a:1"
            with anyio.fail_after(10):
                assert await store_a.renew_leases(A, ["run-1"]) == {"run-1"}
            await store_a.append("run-1", [started(2)], summary(2), owner=A)
            # A dies now: C takes the run over once its lease has passed.
            await anyio.sleep(1.2)
            assert await store_c.claimable_runs(C) == ["run-1"]
            lease = await store_c.claim_run("run-1", C)
            assert lease is not None
            assert lease.owner == C.id


async def test_a_store_opened_after_a_lease_lapsed_takes_it_over_a_lease_later(
    postgres_dsn: str,
) -> None:
    # Whether the server or the way to it was down when the lease lapsed
    # (a network cut leaves no trace on the server), a store that was not
    # there cannot tell: it leaves the lease to its owner for a lease.
    async with PostgresStore(postgres_dsn, lease_s=1) as store_a:
        await store_a.append("run-1", [started(1)], summary(1), owner=A)
    await anyio.sleep(1.2)
    async with PostgresStore(postgres_dsn, lease_s=1) as store_c:
        opened = time.monotonic()
        assert await store_c.claimable_runs(C) == []
        lease = await store_c.claim_run("run-1", C)
        assert lease is not None
        assert lease.holder == "host-a:1"
        await claimable_soon(store_c, C)
        assert 0.8 <= time.monotonic() - opened < 2
        lease = await store_c.claim_run("run-1", C)
        assert lease is not None
        assert lease.owner == C.id


async def test_a_lease_that_lapses_while_a_store_reaches_the_server_is_taken_at_once(
    postgres_dsn: str,
) -> None:
    # The normal takeover of a dead supervisor's runs is not delayed: the
    # store was there, and the server reachable, while the lease ran out.
    async with PostgresStore(postgres_dsn, lease_s=1) as store_c:
        async with PostgresStore(postgres_dsn, lease_s=1) as store_a:
            await store_a.append("run-1", [started(1)], summary(1), owner=A)
            lapsed_at = time.monotonic() + 1
        await claimable_soon(store_c, C)
        assert time.monotonic() - lapsed_at < 0.5


async def test_calls_waiting_for_the_server_fail_soon_once_told_to_stop_waiting(
    own_server: PostgresServer,
) -> None:
    dsn = own_server.dsn(own_server.new_database())
    async with PostgresStore(dsn, reconnect_s=30) as store:
        postgres.halt(own_server)
        try:
            failed_at = []

            async def read() -> None:
                with pytest.raises(psycopg.OperationalError):
                    await store.read("run-1")
                failed_at.append(time.monotonic())

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(read)
                    await anyio.sleep(0.5)
                    told = time.monotonic()
                    store.stop_waiting()
            assert failed_at[0] - told < 2.5
            # Later calls fail after one try, until one reaches the server.
            started_at = time.monotonic()
            with pytest.raises(psycopg.OperationalError):
                await store.read("run-1")
            assert time.monotonic() - started_at < 2.5
        finally:
            postgres.start_again(own_server)
        # The next try, when one is due, reaches it, and calls wait again.
        await anyio.sleep(pool_module.LONGEST_DELAY_S)
        assert await store.read("run-1") == []
        assert store.outage is None
