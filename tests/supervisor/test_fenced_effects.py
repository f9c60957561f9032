"""Side-effect tool calls on a shared PostgreSQL journal: recorded only by
the supervisor that holds the run's lease, so one that stalled while
another took the run over does not run the call a second time."""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import psycopg
import pytest
from scripts import chain, scripted, spec

from replan import (
    GateResolution,
    LeaseLost,
    ModelRequest,
    ModelResponse,
    RunStatus,
    Supervisor,
    SupervisorError,
    TaskOutcome,
    Tool,
    tool,
)
from replan.messages import GateOpened, TaskFinished, ToolCall, ToolResult
from replan.store import EffectRecord, PostgresStore, RunOwner, ToolEffectRecord
from replan.supervisor import RunHandle

APPROVE = GateResolution(decision="approve", by="ana")


class Outbox:
    """A side-effect tool that counts the emails it really sent."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def tool(self) -> Tool:
        @tool(side_effect=True)
        def send_email(to: str, idempotency_key: str) -> str:
            """Email someone."""
            self.keys.append(idempotency_key)
            return f"sent to {to}"

        return send_email


class Emailer:
    """An executor model that sends one email, then reports success; it
    keeps the tool results it saw."""

    def __init__(self) -> None:
        self.seen: list[ToolResult] = []

    def __call__(self, request: ModelRequest) -> Any:
        if not request.transcript:
            call = ToolCall(id="c1", name="send_email", arguments='{"to": "ana"}')
            return ModelResponse(tool_calls=[call])
        self.seen += [r for x in request.transcript for r in x.results]
        return TaskOutcome(success=True, summary="emailed")


class StallingStore(PostgresStore):
    """A journal whose first record of a side-effect call (``started``:
    before the tool runs; ``done``: with its result) waits for ``stall``
    first: the process froze there, past its lease."""

    stall: Callable[[], Awaitable[None]] | None = None
    at: str = "started"
    tried: anyio.Event
    """Set once the record that waited was tried."""

    async def record_tool_effect(
        self, run_id: str, record: ToolEffectRecord, *, owner: RunOwner | None = None
    ) -> None:
        stall = self.stall
        if stall is None or (record.content is None) != (self.at == "started"):
            await super().record_tool_effect(run_id, record, owner=owner)
            return
        self.stall = None
        await stall()
        try:
            await super().record_tool_effect(run_id, record, owner=owner)
        finally:
            self.tried.set()


def expire_leases(dsn: str) -> None:
    """Every lease expires now, as its owner's dying a lease ago would."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE replan.runs SET lease_expires = now()")


async def approve_until_done(
    sup: Supervisor, done: anyio.Event, after: anyio.Event
) -> None:
    """Approve every gate ``sup`` opens, from ``after`` until ``done``."""
    await after.wait()
    while not done.is_set():
        for request in sup.gates.pending():
            await sup.gates.resolve(request.gate_id, APPROVE)
        await anyio.sleep(0.02)


async def at_gate(handle: RunHandle) -> str:
    async for event in handle.events():
        if isinstance(event, GateOpened):
            return event.request.gate_id
    raise AssertionError("the run opened no gate")


@pytest.mark.parametrize("at", ["started", "done"])
async def test_a_stalled_driver_records_no_side_effect_call_of_a_run_taken_over(
    at: str, postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    outbox_a, outbox_b = Outbox(), Outbox()
    model_a, model_b = Emailer(), Emailer()
    taken: list[RunHandle] = []
    done = anyio.Event()
    with anyio.fail_after(30):
        async with (
            StallingStore(postgres_dsn) as store_a,
            PostgresStore(postgres_dsn) as store_b,
            Supervisor(
                scripted(execute=model_a), store_a, tools=[outbox_a.tool()]
            ) as a,
            Supervisor(
                scripted(execute=model_b), store_b, tools=[outbox_b.tool()]
            ) as b,
            anyio.create_task_group() as tg,
        ):
            handle = await a.submit(spec(chain(1)))

            async def take_over() -> None:
                # The first froze past its lease; the second took the run.
                expire_leases(postgres_dsn)
                taken.append(await b.resume(handle.run_id))

            store_a.at, store_a.stall = at, take_over
            store_a.tried = anyio.Event()
            # The second's gate, if any, is answered once the first's
            # record was tried: the run is still the second's then.
            tg.start_soon(approve_until_done, b, done, store_a.tried)
            await a.gates.resolve(await at_gate(handle), APPROVE)
            with pytest.raises(SupervisorError, match="took the run over"):
                await handle.result()
            result = await taken[0].result()
            done.set()
            events = await store_b.read(handle.run_id)
            records = await store_b.read_tool_effects(handle.run_id)

    key = f"{handle.run_id}:t1:s1c0"
    assert result.status is RunStatus.COMPLETED
    if at == "started":
        # Not recorded as started, so not run: the second runs it once.
        assert outbox_a.keys == []
        [seen] = model_a.seen
        assert seen.error
        assert "could not be recorded before it ran" in seen.content
        # The second's while it drives the run; nobody's once it ended it.
        holders = (f"{b.owner.holder}'s", "nobody's")
        assert any(f"its lease is {h} now" in seen.content for h in holders)
        assert outbox_b.keys == [key]
    else:
        # It ran before the first froze; its result is not recorded there,
        # so the second runs it again under its key, as after a crash.
        assert outbox_a.keys == [key]
        assert "ran but is not recorded" in caplog.text
        assert outbox_b.keys == [key]
    assert [(r.key, r.content) for r in records] == [(key, "sent to ana")]
    # The first's attempt never reached the journal.
    assert [e.task_id for e in events if isinstance(e, TaskFinished)] == ["t1"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_stalled_driver_records_no_finished_attempt_of_a_run_taken_over(
    postgres_dsn: str,
) -> None:
    outcome = TaskOutcome(success=True, summary="done")
    record = EffectRecord(task_id="t1", attempt=1, outcome=outcome)
    tool_record = ToolEffectRecord(key="k", task_id="t1", tool="t", arguments={})
    a = RunOwner(id="a", holder="host:1")
    b = RunOwner(id="b", holder="host:2")
    async with (
        PostgresStore(postgres_dsn) as store,
        Supervisor(scripted(), store) as sup,
    ):
        handle = await sup.submit(spec(chain(1)))
        await handle.result()
    async with PostgresStore(postgres_dsn) as store:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE replan.runs SET status = 'running', owner = 'b', "
                "holder = 'host:2', lease_expires = now() + interval '1 hour'"
            )
        run_id = handle.run_id
        for write in (
            lambda owner: store.record_effect(run_id, record, owner=owner),
            lambda owner: store.record_tool_effect(run_id, tool_record, owner=owner),
        ):
            with pytest.raises(LeaseLost, match="its lease is host:2's now") as lost:
                await write(a)
            assert (lost.value.run_id, lost.value.holder) == (run_id, "host:2")
            await write(b)
        assert record in await store.read_effects(run_id)
        assert await store.read_tool_effects(run_id) == [tool_record]


async def test_what_a_call_under_way_as_its_run_was_cancelled_returned_is_kept(
    postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The run's end lets go of its lease; the call, already running, is
    # waited for, and its result recorded: the run is nobody's to drive.
    release, started = threading.Event(), threading.Event()

    @tool(side_effect=True)
    def send_email(to: str, idempotency_key: str) -> str:
        """Email someone."""
        started.set()
        release.wait(5)
        return f"sent to {to}"

    with anyio.fail_after(30):
        async with (
            PostgresStore(postgres_dsn) as store,
            Supervisor(scripted(execute=Emailer()), store, tools=[send_email]) as sup,
        ):
            handle = await sup.submit(spec(chain(1)))
            await sup.gates.resolve(await at_gate(handle), APPROVE)
            await anyio.to_thread.run_sync(started.wait, 5)
            await handle.cancel()
            release.set()
            for _ in range(400):
                [record] = await store.read_tool_effects(handle.run_id)
                if record.content is not None:
                    break
                await anyio.sleep(0.02)
    assert handle.status is RunStatus.CANCELLED
    assert record.content == "sent to ana"
    assert "not recorded" not in caplog.text
