"""Supervisors sharing a PostgreSQL journal: each drives the runs it holds
the leases of, takes over those of one that died, and lets go of one that
another took over while it stalled."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import psycopg
import pytest
from scripts import chain, clean, executed_ids, scripted, spec, task_of

from replan import (
    GateError,
    ModelRequest,
    ModelResponse,
    RunDrivenElsewhere,
    RunHandle,
    RunStatus,
    Supervisor,
    SupervisorError,
    TaskDraft,
    TaskStatus,
    UnknownRunError,
    tool,
)
from replan.messages import GateOpened, TaskFinished, TaskInterrupted, ToolCall
from replan.store import PostgresStore, RunLease, RunOwner

DRIVER = Path(__file__).with_name("postgres_driver.py")


def blocking_at(key: str, reached: anyio.Event, go: anyio.Event | None = None):  # type: ignore[no-untyped-def]
    """An executor answer that waits at task ``key`` (until ``go``, if any)."""

    async def execute(request: ModelRequest) -> object:
        if task_of(request).key == key:
            reached.set()
            if go is None:
                await anyio.sleep_forever()
            await go.wait()
        return clean(request)

    return execute


def start_driver(dsn: str, *, lease_s: float) -> subprocess.Popen[str]:
    """A supervisor in a process of its own (see ``postgres_driver.py``)."""
    return subprocess.Popen(
        [sys.executable, str(DRIVER), dsn, str(lease_s)],
        stdout=subprocess.PIPE,
        text=True,
    )


def expire_leases(dsn: str) -> None:
    """Every lease expires now, as its owner's dying a lease ago would."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE replan.runs SET lease_expires = now()")


async def test_supervisors_sharing_a_journal_resume_only_the_runs_they_claim(
    postgres_dsn: str,
) -> None:
    reached = anyio.Event()
    first = scripted(execute=blocking_at("s3", reached))
    second = scripted()
    with anyio.fail_after(30):
        async with (
            PostgresStore(postgres_dsn) as store_a,
            PostgresStore(postgres_dsn) as store_b,
        ):
            async with Supervisor(first, store_a) as a:
                handle = await a.submit(spec(chain(4), milestone_every=100))
                await reached.wait()
                # Another supervisor resumes on the same journal alongside:
                # the run is the first one's, and left to it.
                async with Supervisor(second, store_b, resume=True) as b:
                    assert b.handles() == []
                    assert await b.resume_all() == []
                    with pytest.raises(RunDrivenElsewhere, match=r":\d+\)") as caught:
                        await b.resume(handle.run_id)
                    assert caught.value.run_id == handle.run_id
                    assert caught.value.holder == a.owner.holder
                    assert isinstance(caught.value, GateError)
                    # Its own runs are its own.
                    mine = await b.submit(spec(chain(2), milestone_every=100))
                    assert (await mine.result()).status is RunStatus.COMPLETED
            # Stopped, the first lets go of its leases: taken over at once.
            async with Supervisor(second, store_b, resume=True) as b:
                result = await b.get(handle.run_id).result()
    assert result.status is RunStatus.COMPLETED
    assert executed_ids(first) == ["t1", "t2", "t3"]
    assert executed_ids(second) == ["t1", "t2", "t3", "t4"]  # its run, then t3, t4


async def test_a_stale_owners_append_is_refused_and_it_lets_go_of_the_run(
    postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    reached, go = anyio.Event(), anyio.Event()
    reached_b, go_b = anyio.Event(), anyio.Event()
    first = scripted(execute=blocking_at("s3", reached, go))
    second = scripted(execute=blocking_at("s4", reached_b, go_b))
    with anyio.fail_after(30):
        async with (
            PostgresStore(postgres_dsn) as store_a,
            PostgresStore(postgres_dsn) as store_b,
            Supervisor(first, store_a) as a,
            Supervisor(second, store_b) as b,
        ):
            handle = await a.submit(spec(chain(4), milestone_every=100))
            await reached.wait()
            # The first stalls past its lease's expiry; the second takes over.
            expire_leases(postgres_dsn)
            taken = await b.resume(handle.run_id)
            await reached_b.wait()
            # The first comes back: its append is refused, and it lets go.
            go.set()
            with pytest.raises(SupervisorError, match="took the run over"):
                await handle.result()
            assert not a.drives(handle.run_id)
            # No longer the first's: left out of its runs.
            assert a.handles() == []
            with pytest.raises(UnknownRunError):
                a.get(handle.run_id)
            # Cancelling it is for the supervisor that drives it now.
            with pytest.raises(RunDrivenElsewhere, match="another supervisor"):
                await handle.cancel()
            go_b.set()
            result = await taken.result()
            events = await store_a.read(handle.run_id)
    assert result.status is RunStatus.COMPLETED
    assert executed_ids(second) == ["t3", "t4"]
    finished = [e.task_id for e in events if isinstance(e, TaskFinished)]
    assert finished == ["t1", "t2", "t3", "t4"]  # the first's t3 never journaled
    assert "this supervisor no longer drives it" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_run_whose_process_was_killed_is_taken_over_once_its_lease_expires(
    postgres_dsn: str,
) -> None:
    async with PostgresStore(postgres_dsn, lease_s=1) as store:  # the tables
        process = start_driver(postgres_dsn, lease_s=1)
        try:
            assert process.stdout is not None
            with anyio.fail_after(30):
                run_id = (
                    await anyio.to_thread.run_sync(
                        process.stdout.readline, abandon_on_cancel=True
                    )
                ).strip()
        finally:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            assert process.stdout is not None
            process.stdout.close()
        model = scripted()
        with anyio.fail_after(30):
            async with Supervisor(model, store, resume=True) as sup:
                # Its lease held a moment longer: left alone until it expires.
                for _ in range(100):
                    handles = await sup.resume_all()
                    if handles:
                        break
                    await anyio.sleep(0.2)
                result = await handles[0].result()
                events = await store.read(run_id)
    assert handles[0].run_id == run_id
    assert result.status is RunStatus.COMPLETED
    assert executed_ids(model) == ["t3", "t4"]
    assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 4
    assert [e.task_id for e in events if isinstance(e, TaskInterrupted)] == ["t3"]


async def test_a_waiting_run_another_took_over_is_let_go_of_at_the_next_renewal(
    postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    reached = anyio.Event()
    first = scripted(execute=blocking_at("s3", reached))
    with anyio.fail_after(30):
        async with (
            PostgresStore(postgres_dsn, lease_s=1) as store_a,
            PostgresStore(postgres_dsn) as store_b,
            Supervisor(first, store_a) as a,
            Supervisor(scripted(), store_b) as b,
        ):
            handle = await a.submit(spec(chain(4), milestone_every=100))
            await reached.wait()
            expire_leases(postgres_dsn)
            taken = await b.resume(handle.run_id)
            # The first appends nothing meanwhile: its renewal finds the
            # run is the second's.
            with pytest.raises(SupervisorError, match="took the run over"):
                await handle.result()
            result = await taken.result()
    assert result.status is RunStatus.COMPLETED
    # The renewal's warning, as a refused append's (the second may have
    # ended the run, and let go of it, by the time the first looks).
    said = f"run {handle.run_id}: its lease is ({b.owner.holder}|nobody)'s now; "
    assert re.search(f"{said}this supervisor no longer drives it", caplog.text)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_gate_of_a_run_another_supervisor_drives_is_answered_there(
    postgres_dsn: str,
) -> None:
    tasks = [TaskDraft(key="s1", description="send it", requires_approval=True)]
    with anyio.fail_after(30):
        async with (
            PostgresStore(postgres_dsn) as store_a,
            PostgresStore(postgres_dsn) as store_b,
            Supervisor(scripted(), store_a) as a,
            Supervisor(scripted(), store_b) as b,
        ):
            handle = await a.submit(spec(tasks))
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    break
            (gate,) = a.gates.pending()
            answer = {"decision": "approve", "by": "ana"}
            with pytest.raises(GateError, match="no open gate"):
                await b.gates.resolve("no-such-run-g1", answer)
            sent = await b.gates.resolve(gate.gate_id, answer)
            assert sent is not None
            assert sent.driven_by == a.owner.holder
            assert (await handle.result()).status is RunStatus.COMPLETED


async def test_supervisors_resuming_at_once_share_the_unfinished_runs_each_once(
    postgres_dsn: str,
) -> None:
    reached = anyio.Event()
    stopping = scripted(execute=blocking_at("s2", reached))
    with anyio.fail_after(60):
        async with PostgresStore(postgres_dsn) as store:
            async with Supervisor(stopping, store) as sup:
                handles = [
                    await sup.submit(spec(chain(3), milestone_every=100))
                    for _ in range(6)
                ]
                await reached.wait()
            run_ids = {h.run_id for h in handles}
        models = [scripted(latency_s=0.01), scripted(latency_s=0.01)]
        resumed: list[set[str]] = [set(), set()]
        results = {}

        async def resume(index: int) -> None:
            async with (
                PostgresStore(postgres_dsn) as store,
                Supervisor(models[index], store, resume=True) as sup,
            ):
                for handle in sup.handles():
                    resumed[index].add(handle.run_id)
                    results[handle.run_id] = await handle.result()

        async with anyio.create_task_group() as tg:
            tg.start_soon(resume, 0)
            tg.start_soon(resume, 1)
    # Each run was driven on by one supervisor, the one that holds its
    # handle (a run the other finished first is not among its handles),
    # and no task ran twice.
    driven = [{c.run_id for c in m.calls_for("executor", "execute")} for m in models]
    assert driven[0].isdisjoint(driven[1])
    assert driven == resumed
    assert resumed[0] | resumed[1] == run_ids
    assert {r.status for r in results.values()} == {RunStatus.COMPLETED}
    executions = [
        (c.run_id, task_of(c).id)
        for model in models
        for c in model.calls_for("executor", "execute")
    ]
    assert len(executions) == len(set(executions))  # none twice


class HeldClaims(PostgresStore):
    """A journal whose claims wait until ``go`` (a supervisor that lists
    the runs to take up, then stalls before it claims them)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.claiming = anyio.Event()
        self.go = anyio.Event()

    async def claim_run(self, run_id: str, owner: RunOwner) -> RunLease | None:
        self.claiming.set()
        await self.go.wait()
        return await super().claim_run(run_id, owner)


async def test_a_run_another_supervisor_ends_while_this_one_resumes_is_not_its_own(
    postgres_dsn: str,
) -> None:
    reached = anyio.Event()
    with anyio.fail_after(30):
        async with PostgresStore(postgres_dsn) as store:
            async with Supervisor(
                scripted(execute=blocking_at("s2", reached)), store
            ) as sup:
                handle = await sup.submit(spec(chain(3), milestone_every=100))
                await reached.wait()
            async with (
                HeldClaims(postgres_dsn) as held,
                Supervisor(scripted(), held) as late,
                anyio.create_task_group() as tg,
            ):
                found: list[RunHandle] = []

                async def resume_all() -> None:
                    found.extend(await late.resume_all())

                tg.start_soon(resume_all)
                await held.claiming.wait()  # listed, not yet claimed
                async with Supervisor(scripted(), store, resume=True) as first:
                    result = await first.get(handle.run_id).result()
                held.go.set()
            assert result.status is RunStatus.COMPLETED
            assert found == []
            assert late.handles() == []


async def test_a_supervisor_keeps_the_leases_of_its_runs_past_their_duration(
    postgres_dsn: str,
) -> None:
    reached = anyio.Event()
    first = scripted(execute=blocking_at("s2", reached))
    with anyio.fail_after(30):
        async with (
            PostgresStore(postgres_dsn, lease_s=1) as store_a,
            PostgresStore(postgres_dsn) as store_b,
            Supervisor(first, store_a) as a,
            Supervisor(scripted(), store_b) as b,
        ):
            handle = await a.submit(spec(chain(3), milestone_every=100))
            await reached.wait()
            await anyio.sleep(2.5)  # renewed every third of a second
            with pytest.raises(RunDrivenElsewhere):
                await b.resume(handle.run_id)
            assert await b.resume_all() == []
            assert a.drives(handle.run_id)


async def test_a_run_lost_at_an_append_closes_its_gates_here(
    postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The first holds a finished attempt it could not journal as it lets go:
    # not its ledger's any more, and its gate of the run is no longer open
    # here (answered at the supervisor that took the run over).
    reached, go = anyio.Event(), anyio.Event()
    first = scripted(execute=blocking_at("s1", reached, go))
    tasks = [
        TaskDraft(key="s1", description="one"),
        TaskDraft(key="s2", description="two", requires_approval=True),
    ]
    with anyio.fail_after(30):
        async with (
            PostgresStore(postgres_dsn) as store_a,
            PostgresStore(postgres_dsn) as store_b,
            Supervisor(first, store_a) as a,
            Supervisor(scripted(), store_b) as b,
        ):
            handle = await a.submit(spec(tasks, milestone_every=100))
            await reached.wait()
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    break
            expire_leases(postgres_dsn)
            taken = await b.resume(handle.run_id)
            go.set()
            with pytest.raises(SupervisorError, match="took the run over"):
                await handle.result()
            assert a.gates.pending() == []
            (gate,) = b.gates.pending()
            await b.gates.resolve(gate.gate_id, {"decision": "approve", "by": "ana"})
            result = await taken.result()
    assert result.status is RunStatus.COMPLETED
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_run_let_go_of_with_a_model_answer_in_flight_logs_no_error(
    postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The attempt's model answered (a tool call: its tokens spent) and the
    # tool still runs as the renewal finds the run another's: the usage is
    # the other supervisor's to journal, not an error here.
    reached, go = anyio.Event(), anyio.Event()

    @tool
    async def look_up(query: str) -> str:
        """Look something up."""
        reached.set()
        await go.wait()
        return "found"

    def execute(request: ModelRequest) -> object:
        if not request.transcript:
            call = ToolCall(id="c1", name="look_up", arguments='{"query": "x"}')
            return ModelResponse(tool_calls=[call])
        return clean(request)

    with anyio.fail_after(30):
        async with (
            PostgresStore(postgres_dsn, lease_s=1) as store_a,
            PostgresStore(postgres_dsn) as store_b,
            Supervisor(scripted(execute=execute), store_a, tools=[look_up]) as a,
            Supervisor(scripted(), store_b) as b,
        ):
            handle = await a.submit(spec(chain(1)))
            await reached.wait()
            expire_leases(postgres_dsn)
            taken = await b.resume(handle.run_id)
            with pytest.raises(SupervisorError, match="took the run over"):
                await handle.result()
            go.set()
            result = await taken.result()
    assert result.status is RunStatus.COMPLETED
    assert "now; this supervisor no longer drives it" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_run_whose_row_says_unfinished_though_its_journal_ended_is_set_right(
    postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A runs table restored apart from the events, or edited by hand: the
    # row says running, the events say completed. A resume takes the run
    # up as the finished run it is, sets its row right and lets go of its
    # lease, instead of claiming it again at every look.
    with anyio.fail_after(30):
        async with PostgresStore(postgres_dsn) as store:
            async with Supervisor(scripted(), store) as sup:
                handle = await sup.submit(spec(chain(2)))
                assert (await handle.result()).status is RunStatus.COMPLETED
            with psycopg.connect(postgres_dsn, autocommit=True) as conn:
                conn.execute(
                    "UPDATE replan.runs SET status = 'running', owner = 'dead', "
                    "holder = 'host:1', lease_expires = now()"
                )
            async with Supervisor(scripted(), store) as sup:
                [taken] = await sup.resume_all()
                assert taken.status is RunStatus.COMPLETED
                assert await sup.resume_all() == []
                summary = await store.get_run(handle.run_id)
                assert summary is not None
                assert summary.status is RunStatus.COMPLETED
                assert await store.claimable_runs(sup.owner) == []
                assert await store.run_lease(handle.run_id) is None
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [
        f"run {handle.run_id}: the journal's runs table says it is unfinished, "
        "its events that it ended (completed): its row is set right from its events"
    ]
