"""A person's answer to a side-effect tool call stands once journaled: the
attempt a crash cut short, run again, acts on it without asking again."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from scripts import chain, scripted, spec
from stores import STORE_KINDS

from replan import (
    GateResolution,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    RunResult,
    RunStatus,
    Supervisor,
    TaskOutcome,
    Tool,
    tool,
)
from replan.messages import Event, GateOpened, TaskInterrupted, ToolCall, ToolResult
from replan.store import PostgresStore, SQLiteStore, Store, ToolEffectRecord

pytestmark = pytest.mark.anyio

PROCESS = Path(__file__).with_name("approval_process.py")
EMAIL = ToolCall(id="c1", name="send_email", arguments='{"to": "ana"}')


class Resumed:
    """The run resumed from the journal the killed process left."""

    def __init__(self, outbox: Path) -> None:
        self.outbox = outbox
        self.seen: list[ToolResult] = []
        """The tool results the resumed attempt's model read."""
        self.asked: list[str] = []
        """The gates opened after the resume (each approved by bo)."""

    async def run(self, journal: Path, run_id: str) -> tuple[RunResult, list[Event]]:
        outbox = self.outbox

        @tool(side_effect=True)
        async def send_email(to: str, idempotency_key: str) -> str:
            """Email someone."""
            with outbox.open("a") as sent:
                sent.write(f"{to} {idempotency_key}\n")
            return f"sent to {to}"

        def execute(request: ModelRequest) -> Any:
            if not request.transcript:
                return ModelResponse(tool_calls=[EMAIL])
            self.seen = [r for x in request.transcript for r in x.results]
            return TaskOutcome(success=True, summary="emailed")

        model = scripted(execute=execute)
        with anyio.fail_after(20):
            async with (
                SQLiteStore(journal) as store,
                Supervisor(model, store, tools=[send_email], resume=True) as sup,
            ):
                handle = sup.get(run_id)

                async def approve_new_gates() -> None:
                    async for event in handle.events():
                        if isinstance(event, GateOpened):
                            gate_id = event.request.gate_id
                            if sup.gates.get(gate_id) is not None:
                                self.asked.append(gate_id)
                                answer = GateResolution(decision="approve", by="bo")
                                await sup.gates.resolve(gate_id, answer)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(approve_new_gates)
                    result = await handle.result()
                    tg.cancel_scope.cancel()
                events = await store.read(run_id)
        return result, events


async def killed_at(moment: str, tmp_path: Path) -> str:
    """Run approval_process.py until it holds at ``moment``, then kill -9 it;
    the id of its run."""
    command = [
        sys.executable,
        str(PROCESS),
        str(tmp_path / "journal.db"),
        str(tmp_path / "outbox"),
        moment,
    ]
    printed = b""
    with (tmp_path / "stderr").open("wb") as stderr:
        async with await anyio.open_process(command, stderr=stderr) as process:
            assert process.stdout is not None
            with anyio.fail_after(30):
                async for chunk in process.stdout:
                    printed += chunk
                    if printed.endswith(b"\n"):
                        break
            process.kill()  # SIGKILL: nothing is cleaned up
            await process.wait()
    assert printed.endswith(b"\n"), (tmp_path / "stderr").read_text()
    return printed.decode().strip()


def sent(outbox: Path) -> list[str]:
    return outbox.read_text().splitlines() if outbox.exists() else []


def gates_opened(events: list[Event]) -> int:
    return sum(isinstance(e, GateOpened) for e in events)


async def test_an_approval_journaled_before_the_call_started_stands_after_a_kill(
    tmp_path: Path,
) -> None:
    run_id = await killed_at("approved", tmp_path)
    assert sent(tmp_path / "outbox") == []  # approved, not yet sent

    resumed = Resumed(tmp_path / "outbox")
    result, events = await resumed.run(tmp_path / "journal.db", run_id)

    assert result.status is RunStatus.COMPLETED
    assert resumed.asked == []  # not asked again
    assert gates_opened(events) == 1
    assert [e.task_id for e in events if isinstance(e, TaskInterrupted)] == ["t1"]
    # sent exactly once, under the key of the call that was approved
    assert sent(tmp_path / "outbox") == [f"ana {run_id}:t1:s1c0"]
    [seen] = resumed.seen
    assert (seen.content, seen.error) == ("sent to ana", False)
    async with SQLiteStore(tmp_path / "journal.db") as store:
        records = await store.read_tool_effects(run_id)
    assert records == [
        ToolEffectRecord(
            key=f"{run_id}:t1:s1c0",
            task_id="t1",
            tool="send_email",
            arguments={"to": "ana"},
            content="sent to ana",
        )
    ]


async def test_a_rejection_journaled_before_the_model_read_it_stands_after_a_kill(
    tmp_path: Path,
) -> None:
    run_id = await killed_at("rejected", tmp_path)

    resumed = Resumed(tmp_path / "outbox")
    result, events = await resumed.run(tmp_path / "journal.db", run_id)

    assert result.status is RunStatus.COMPLETED
    assert resumed.asked == []
    assert gates_opened(events) == 1
    assert sent(tmp_path / "outbox") == []
    [seen] = resumed.seen
    assert seen.error
    assert seen.content == "the call was not approved by ana"


async def test_an_email_sent_and_recorded_before_a_kill_is_neither_asked_nor_sent_again(
    tmp_path: Path,
) -> None:
    run_id = await killed_at("sent", tmp_path)
    assert sent(tmp_path / "outbox") == [f"ana {run_id}:t1:s1c0"]

    resumed = Resumed(tmp_path / "outbox")
    result, events = await resumed.run(tmp_path / "journal.db", run_id)

    assert result.status is RunStatus.COMPLETED
    assert resumed.asked == []
    assert gates_opened(events) == 1
    assert sent(tmp_path / "outbox") == [f"ana {run_id}:t1:s1c0"]
    [seen] = resumed.seen
    assert (seen.content, seen.error) == ("sent to ana", False)


async def test_an_email_cut_short_while_sending_goes_to_a_person_again_not_the_approval(
    tmp_path: Path,
) -> None:
    # It may have gone: the approval it was given does not send it again on
    # its own. A person decides, and it goes under the same key.
    run_id = await killed_at("started", tmp_path)
    key = f"{run_id}:t1:s1c0"
    assert sent(tmp_path / "outbox") == [f"ana {key}"]

    resumed = Resumed(tmp_path / "outbox")
    result, events = await resumed.run(tmp_path / "journal.db", run_id)

    assert result.status is RunStatus.COMPLETED
    assert len(resumed.asked) == 1
    assert gates_opened(events) == 2
    assert sent(tmp_path / "outbox") == [f"ana {key}", f"ana {key}"]


# Finer rules, with the stop made in-process ---------------------------------


class Holding:
    """A journal whose ledger holds the ``hold_at``-th call that goes ahead
    before it is recorded as started (so it never starts): a stop can come
    there."""

    hold_at: int | None = None
    held: anyio.Event

    async def record_tool_effect(
        self, run_id: str, record: ToolEffectRecord, **owner: Any
    ) -> None:
        if record.content is None and self.hold_at is not None:
            self.hold_at -= 1
            if not self.hold_at:
                self.held.set()
                await anyio.sleep_forever()
        await super().record_tool_effect(run_id, record, **owner)  # type: ignore[misc]


class HoldingMemory(Holding, MemoryStore):
    pass


class HoldingSQLite(Holding, SQLiteStore):
    pass


class HoldingPostgres(Holding, PostgresStore):
    pass


@pytest.fixture(params=STORE_KINDS)
async def holding(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Holding]:
    store: Holding
    if request.param == "memory":
        store = HoldingMemory()
    elif request.param == "sqlite":
        store = HoldingSQLite(tmp_path / "j.db")
    else:
        store = HoldingPostgres(request.getfixturevalue("postgres_dsn"))
    store.held = anyio.Event()
    yield store
    await store.aclose()  # type: ignore[attr-defined]


class Mailer:
    """An executor model that sends the emails of each step, then answers;
    and the tool, which counts what it sent."""

    def __init__(self, steps: list[list[str]]) -> None:
        self.steps = steps
        self.sent: list[str] = []
        self.seen: list[ToolResult] = []

    def model(self) -> Any:
        def execute(request: ModelRequest) -> Any:
            step = len(request.transcript)
            self.seen = [r for x in request.transcript for r in x.results]
            if step < len(self.steps):
                return ModelResponse(
                    tool_calls=[
                        ToolCall(
                            id=f"c{i}", name="send_email", arguments=f'{{"to": "{to}"}}'
                        )
                        for i, to in enumerate(self.steps[step])
                    ]
                )
            return TaskOutcome(success=True, summary="emailed")

        return scripted(execute=execute)

    def tool(self) -> Tool:
        @tool(side_effect=True)
        def send_email(to: str, idempotency_key: str) -> str:
            """Email someone."""
            self.sent.append(f"{to} {idempotency_key.split(':', 1)[1]}")
            return f"sent to {to}"

        return send_email


async def stopped_and_resumed(
    holding: Holding, steps: list[list[str]], answers: dict[str, str], hold_at: int
) -> tuple[Mailer, Mailer, list[str], list[Event]]:
    """Run, answering each email's gate as ``answers`` says, until the
    ``hold_at``-th approved email is about to start; stop there and resume:
    both mailers, the emails asked about after the resume and the journal."""
    holding.hold_at = hold_at
    store: Store = holding  # type: ignore[assignment]
    first = Mailer(steps)
    with anyio.fail_after(10):
        async with Supervisor(first.model(), store, tools=[first.tool()]) as sup:
            handle = await sup.submit(spec(chain(1)))

            async def answer_gates() -> None:
                async for event in handle.events():
                    if isinstance(event, GateOpened):
                        call = event.request.tool_call
                        assert call is not None
                        decision = answers[json.loads(call.arguments)["to"]]
                        answer = GateResolution(decision=decision, by="ana")  # type: ignore[arg-type]
                        await sup.gates.resolve(event.request.gate_id, answer)

            async with anyio.create_task_group() as tg:
                tg.start_soon(answer_gates)
                await holding.held.wait()
                tg.cancel_scope.cancel()
        holding.hold_at = None
        again = Mailer(steps)
        asked: list[str] = []
        async with Supervisor(
            again.model(), store, tools=[again.tool()], resume=True
        ) as sup:
            resumed = sup.get(handle.run_id)

            async def approve_new_gates() -> None:
                async for event in resumed.events():
                    if isinstance(event, GateOpened) and sup.gates.get(
                        event.request.gate_id
                    ):
                        asked.append(event.request.tool_call.arguments)  # type: ignore[union-attr]
                        answer = GateResolution(decision="approve", by="bo")
                        await sup.gates.resolve(event.request.gate_id, answer)

            async with anyio.create_task_group() as tg:
                tg.start_soon(approve_new_gates)
                result = await resumed.result()
                tg.cancel_scope.cancel()
        assert result.status is RunStatus.COMPLETED
        events = await store.read(handle.run_id)
    return first, again, asked, events


async def test_every_answer_journaled_before_the_stop_stands_in_order(
    holding: Holding,
) -> None:
    # ana was refused, then bo approved: run again, the attempt is refused
    # ana's email and sends bo's, asking no one.
    first, again, asked, events = await stopped_and_resumed(
        holding, [["ana"], ["bo"]], {"ana": "reject", "bo": "approve"}, hold_at=1
    )
    assert first.sent == []
    assert again.sent == ["bo t1:s2c0"]
    assert asked == []
    assert gates_opened(events) == 2
    refused, sent_bo = again.seen
    assert refused.error
    assert refused.content == "the call was not approved by ana"
    assert (sent_bo.content, sent_bo.error) == ("sent to bo", False)


async def test_an_approval_for_a_call_the_ledger_holds_goes_to_a_person_again(
    holding: Holding,
) -> None:
    # ana's first email went; the second, approved, had not started. Which of
    # the two approvals it was cannot be told from the ledger: a person is
    # asked again, so that nothing is sent on an approval that was used.
    first, again, asked, events = await stopped_and_resumed(
        holding, [["ana"], ["ana"]], {"ana": "approve"}, hold_at=2
    )
    assert first.sent == ["ana t1:s1c0"]
    assert again.sent == ["ana t1:s2c0"]
    assert asked == ['{"to": "ana"}']
    assert gates_opened(events) == 3
