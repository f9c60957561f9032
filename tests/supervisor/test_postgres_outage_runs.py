"""Runs on a PostgreSQL journal whose server stays out of reach for longer
than the store waits for it: what the operator reads in the log."""

from __future__ import annotations

import contextlib
import logging

import anyio
import postgres_server as postgres
import psycopg
import pytest
from postgres_server import PostgresServer
from scripts import chain, scripted, spec, with_finding

from replan import (
    ModelRequest,
    RunStatus,
    Supervisor,
    SupervisorError,
    UnknownRunError,
)
from replan.store import PostgresStore


async def test_an_outage_longer_than_reconnect_s_logs_one_line_per_run_no_traceback(
    own_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "replan")

    async def execute(request: ModelRequest) -> object:
        await anyio.sleep(0.2)
        return with_finding(request)

    dsn = own_server.dsn(own_server.new_database())
    runs = 3
    with anyio.fail_after(30):
        async with (
            PostgresStore(dsn, reconnect_s=0.5, lease_s=3) as store,
            Supervisor(scripted(execute=execute), store) as sup,
        ):
            ids = [
                (await sup.submit(spec(chain(50), milestone_every=100))).run_id
                for _ in range(runs)
            ]
            await anyio.to_thread.run_sync(postgres.halt, own_server)
            try:
                for _ in range(150):
                    said = [r.getMessage() for r in caplog.records]
                    if sum("is let go of" in m for m in said) >= runs:
                        break
                    await anyio.sleep(0.1)
                # Renewals go on failing meanwhile (with nothing to renew).
                await anyio.sleep(1.5)
                down = list(caplog.records)
            finally:
                await anyio.to_thread.run_sync(postgres.start_again, own_server)

    loud = [r for r in down if r.levelno >= logging.WARNING]
    assert not [r for r in loud if r.exc_info], [r.getMessage() for r in loud]
    assert not [r for r in loud if r.levelno >= logging.ERROR]
    for run_id in ids:
        said = [r.getMessage() for r in loud if run_id in r.getMessage()]
        assert len(said) == 1, said
        assert "cannot be reached" in said[0]
        assert store.journal in said[0]
    assert not [r for r in down if "renewed again" in r.getMessage()]


async def test_runs_let_go_of_in_an_outage_are_no_longer_listed_as_this_supervisors(
    own_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    # They were listed by handles() (and so counted by a daemon's /metrics
    # as running, and against its max_active_runs) though nobody drove
    # them, and another supervisor could take them over once their leases
    # lapsed.
    caplog.set_level(logging.INFO, "replan")

    async def execute(request: ModelRequest) -> object:
        await anyio.sleep(0.2)
        return with_finding(request)

    dsn = own_server.dsn(own_server.new_database())
    with anyio.fail_after(45):
        async with (
            PostgresStore(dsn, reconnect_s=0.5, lease_s=3) as store,
            Supervisor(scripted(execute=execute), store) as sup,
        ):
            handle = await sup.submit(spec(chain(4), milestone_every=100))
            await anyio.to_thread.run_sync(postgres.halt, own_server)
            try:
                for _ in range(150):
                    if any("is let go of" in r.getMessage() for r in caplog.records):
                        break
                    await anyio.sleep(0.1)
                listed = sup.handles()
                with pytest.raises(UnknownRunError):
                    sup.get(handle.run_id)
                with pytest.raises(SupervisorError, match="cannot be reached"):
                    await handle.result()
            finally:
                await anyio.to_thread.run_sync(postgres.start_again, own_server)
            assert listed == []
            # Taken up again, here: listed again, with a handle of its own
            # (once a try of the store's reaches the server again).
            for _ in range(100):
                with contextlib.suppress(psycopg.OperationalError):
                    if await sup.resume_all():
                        break
                await anyio.sleep(0.1)
            (again,) = sup.handles()
            assert again.run_id == handle.run_id
            assert (await again.result()).status is RunStatus.COMPLETED
