"""Side-effect tool calls run once: a retry or a resumed attempt that makes
the same call again gets the recorded result, not a second effect."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import anyio
import pytest
from scripts import chain, scripted, spec
from stores import STORE_KINDS, open_store

from replan import (
    GateResolution,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    RunHandle,
    RunStatus,
    Supervisor,
    TaskOutcome,
    TaskStatus,
    Tool,
    tool,
)
from replan.messages import Event, GateOpened, TaskInterrupted, ToolCall, ToolResult
from replan.store import SQLiteStore, Store, ToolEffectLedger, ToolEffectRecord

Steps = Callable[[int, int], list[dict[str, str]] | None]
"""``steps(attempt, step)``: the emails the model sends at that step, or None
to answer (success from the last attempt, a transient failure before)."""


class Outbox:
    """A side-effect tool that counts what it really did."""

    def __init__(self, *, fail_first: int = 0, reply: Any = None) -> None:
        self.sent: list[tuple[str, str]] = []
        """(recipient, idempotency key) of each email sent."""
        self.fail_first = fail_first
        self.ran = anyio.Event()
        self.reply = reply
        """What the tool returns (by default ``sent to RECIPIENT``)."""

    def tool(self) -> Tool:
        @tool(side_effect=True)
        def send_email(to: str, idempotency_key: str) -> str:
            """Email someone."""
            if self.fail_first:
                self.fail_first -= 1
                raise ConnectionError("the mail server hung up")
            self.sent.append((to, idempotency_key))
            self.ran.set()
            return f"sent to {to}" if self.reply is None else self.reply

        return send_email


class Executor:
    """An executor model that sends emails step by step, per attempt."""

    def __init__(self, emails: dict[tuple[int, int], list[str]], attempts: int) -> None:
        self.emails = emails
        self.attempts = attempts
        self.seen: dict[int, list[ToolResult]] = {}
        """The tool results each attempt's model saw, in order."""

    def __call__(self, request: ModelRequest) -> Any:
        attempt = request.context["attempt"]
        step = len(request.transcript) + 1
        self.seen[attempt] = [r for x in request.transcript for r in x.results]
        recipients = self.emails.get((attempt, step))
        if recipients is not None:
            calls = [
                ToolCall(id=f"c{i}", name="send_email", arguments=f'{{"to": "{to}"}}')
                for i, to in enumerate(recipients)
            ]
            return ModelResponse(tool_calls=calls)
        if attempt < self.attempts:
            return TaskOutcome(success=False, transient=True, reason="flaky")
        return TaskOutcome(success=True, summary="emailed")


async def approve_every_gate(sup: Supervisor, handle: RunHandle) -> list[str]:
    """Approve each gate the run opens; the ids of the gates, in order."""
    opened: list[str] = []
    async for event in handle.events():
        if isinstance(event, GateOpened):
            opened.append(event.request.gate_id)
            await sup.gates.resolve(
                event.request.gate_id, GateResolution(decision="approve", by="ana")
            )
    return opened


async def run_approving(
    executor: Executor, outbox: Outbox, store: Store
) -> tuple[RunStatus, list[str], list[Event]]:
    model = scripted(execute=executor)
    with anyio.fail_after(10):
        async with Supervisor(model, store, tools=[outbox.tool()]) as sup:
            handle = await sup.submit(spec(chain(1), max_task_attempts=3))
            gates = await approve_every_gate(sup, handle)
            result = await handle.result()
            events = await store.read(handle.run_id)
    return result.status, gates, events


@pytest.fixture(params=STORE_KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    journal: Store = open_store(request.param, request, tmp_path)
    yield journal
    await journal.aclose()


def keys(outbox: Outbox) -> list[str]:
    """The sent emails' keys without the run id."""
    return [key.split(":", 1)[1] for _, key in outbox.sent]


async def test_a_retried_task_gets_the_result_of_the_email_it_already_sent(
    store: Store,
) -> None:
    outbox = Outbox()
    executor = Executor({(1, 1): ["ana"], (2, 1): ["ana"]}, attempts=2)
    status, gates, _ = await run_approving(executor, outbox, store)
    assert status is RunStatus.COMPLETED
    assert keys(outbox) == ["t1:s1c0"]
    assert len(gates) == 1  # the retry asked no one: the email had been sent
    [again] = executor.seen[2]
    assert (again.content, again.error) == ("sent to ana", False)


@pytest.mark.parametrize(
    ("reply", "shown"),
    [("sent \udfff", "sent ?"), ({(1, 2): "x"}, "{(1, 2): 'x'}")],
    ids=["surrogate", "tuple-keys"],
)
async def test_an_email_sent_whose_reply_no_journal_can_hold_is_not_sent_again(
    store: Store, reply: Any, shown: str
) -> None:
    # The reply is made text every journal keeps: the call is recorded as
    # done, and the retry reads it instead of sending again.
    outbox = Outbox(reply=reply)
    executor = Executor({(1, 1): ["ana"], (2, 1): ["ana"]}, attempts=2)
    status, gates, _ = await run_approving(executor, outbox, store)
    assert status is RunStatus.COMPLETED
    assert keys(outbox) == ["t1:s1c0"]
    assert len(gates) == 1
    [first] = executor.seen[1]
    [again] = executor.seen[2]
    assert (first.content, first.error) == (shown, False)
    assert (again.content, again.error) == (shown, False)


async def test_a_different_call_in_the_same_place_is_a_new_effect_with_its_own_key(
    store: Store,
) -> None:
    outbox = Outbox()
    executor = Executor({(1, 1): ["ana"], (2, 1): ["bo"]}, attempts=2)
    status, gates, _ = await run_approving(executor, outbox, store)
    assert status is RunStatus.COMPLETED
    assert outbox.sent[0][0] == "ana"
    assert outbox.sent[1][0] == "bo"
    # The key ana's email used is not handed to bo's: the mail system would
    # take it for a repeat and drop it.
    assert keys(outbox) == ["t1:s1c0", "t1:s1c0-2"]
    assert len(gates) == 2


async def test_a_call_made_twice_runs_twice_and_a_retry_matches_each_once(
    store: Store,
) -> None:
    outbox = Outbox()
    emails = {
        (1, 1): ["ana"],
        (1, 2): ["ana"],
        (2, 1): ["ana", "ana"],
        (2, 2): ["ana"],
        (3, 1): ["ana", "ana", "ana"],
    }
    status, gates, _ = await run_approving(Executor(emails, attempts=3), outbox, store)
    assert status is RunStatus.COMPLETED
    # Two in the first attempt; the second matched those two and sent a
    # third; the third attempt matched all three.
    assert keys(outbox) == ["t1:s1c0", "t1:s2c0", "t1:s2c0-2"]
    assert len(gates) == 3


async def test_a_call_that_raised_keeps_its_key_for_the_same_call_only(
    store: Store,
) -> None:
    # ana's email raised: it may have gone out. The retry sends bo first, in
    # ana's place (a new key: the mail system must not drop bo's as a repeat
    # of ana's), then ana again, one step later, under ana's key.
    outbox = Outbox(fail_first=1)
    emails = {(1, 1): ["ana"], (2, 1): ["bo"], (2, 2): ["ana"]}
    executor = Executor(emails, attempts=2)
    status, gates, _ = await run_approving(executor, outbox, store)
    assert status is RunStatus.COMPLETED
    [failed] = executor.seen[1]
    assert failed.error
    assert "ConnectionError" in failed.content
    assert outbox.sent[0][0] == "bo"
    assert outbox.sent[1][0] == "ana"
    assert keys(outbox) == ["t1:s1c0-2", "t1:s1c0"]
    assert len(gates) == 3


async def test_a_call_that_raised_and_is_made_again_in_the_attempt_keeps_its_key(
    store: Store,
) -> None:
    outbox = Outbox(fail_first=1)
    executor = Executor({(1, 1): ["ana"], (1, 2): ["ana"]}, attempts=1)
    status, gates, _ = await run_approving(executor, outbox, store)
    assert status is RunStatus.COMPLETED
    [failed, sent] = executor.seen[1]
    assert failed.error
    assert (sent.content, sent.error) == ("sent to ana", False)
    assert keys(outbox) == ["t1:s1c0"]  # the mail system can tell it is a repeat
    assert len(gates) == 2


async def test_a_set_argument_matches_in_any_order(store: Store) -> None:
    ran: list[list[str]] = []

    @tool(side_effect=True)
    def notify(channels: set[str]) -> str:
        """Notify on some channels."""
        ran.append(sorted(channels))
        return "notified"

    assert isinstance(store, ToolEffectLedger)
    ledger = store

    async def execute(request: ModelRequest) -> Any:
        attempt = request.context["attempt"]
        if not request.transcript:
            if attempt == 2:
                # As another process could have stored it: another order.
                [record] = await ledger.read_tool_effects(request.run_id or "", "t1")
                assert isinstance(record.arguments, dict)
                assert isinstance(record.arguments["channels"], list)
                shuffled = {"channels": record.arguments["channels"][::-1]}
                await ledger.record_tool_effect(
                    request.run_id or "",
                    record.model_copy(update={"arguments": shuffled}),
                )
            arguments = '{"channels": ["sms", "push", "mail"]}'
            return ModelResponse(
                tool_calls=[ToolCall(id="c1", name="notify", arguments=arguments)]
            )
        if attempt == 1:
            return TaskOutcome(success=False, transient=True, reason="flaky")
        return TaskOutcome(success=True, summary="notified")

    with anyio.fail_after(10):
        async with Supervisor(scripted(execute=execute), store, tools=[notify]) as sup:
            handle = await sup.submit(spec(chain(1), max_task_attempts=2))
            gates = await approve_every_gate(sup, handle)
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED
    assert ran == [["mail", "push", "sms"]]
    assert len(gates) == 1


async def test_an_attempt_past_its_timeout_and_the_next_one_share_no_key(
    store: Store,
) -> None:
    # Attempt 1's email to ana is slow (a sync tool in a worker thread, not
    # cancellable): the task passes task_timeout_s and attempt 2 runs while
    # ana's is still being sent. Attempt 2 emails bo: a key of its own, and
    # ana's late result does not replace bo's record. Attempt 3 makes bo's
    # call again and gets its result. The timeout leaves a loaded machine a
    # second to approve each gate before its attempt times out.
    release = threading.Event()
    sent: list[tuple[str, str]] = []

    @tool(side_effect=True)
    def send_email(to: str, idempotency_key: str) -> str:
        """Email someone."""
        sent.append((to, idempotency_key.split(":", 1)[1]))
        if to == "ana":
            release.wait(5)
        else:
            release.set()
        return f"sent to {to}"

    assert isinstance(store, ToolEffectLedger)
    ledger = store
    record = ledger.record_tool_effect
    ana_recorded = anyio.Event()

    async def record_and_tell(
        run_id: str, effect: ToolEffectRecord, **owner: Any
    ) -> None:
        await record(run_id, effect, **owner)
        if effect.content == "sent to ana":
            ana_recorded.set()

    ledger.record_tool_effect = record_and_tell  # type: ignore[method-assign,assignment]

    async def execute(request: ModelRequest) -> Any:
        attempt = request.context["attempt"]
        if not request.transcript:
            to = "ana" if attempt == 1 else "bo"
            call = ToolCall(id="c1", name="send_email", arguments=f'{{"to": "{to}"}}')
            return ModelResponse(tool_calls=[call])
        if attempt == 2:
            await ana_recorded.wait()
            return TaskOutcome(success=False, transient=True, reason="flaky")
        return TaskOutcome(success=True, summary="emailed")

    with anyio.fail_after(10):
        async with Supervisor(
            scripted(execute=execute), store, tools=[send_email]
        ) as sup:
            handle = await sup.submit(
                spec(chain(1), max_task_attempts=3, task_timeout_s=1.0)
            )
            gates = await approve_every_gate(sup, handle)
            result = await handle.result()
            records = await ledger.read_tool_effects(handle.run_id, "t1")
    assert result.status is RunStatus.COMPLETED
    assert sent == [("ana", "t1:s1c0"), ("bo", "t1:s1c0-2")]
    assert len(gates) == 2
    assert sorted((r.key.split(":", 1)[1], r.content) for r in records) == [
        ("t1:s1c0", "sent to ana"),
        ("t1:s1c0-2", "sent to bo"),
    ]


@asynccontextmanager
async def journal(kind: str, path: Path, memory: MemoryStore) -> AsyncIterator[Store]:
    """The same journal each time it is opened: a file, or one memory store."""
    if kind == "memory":
        yield memory
        return
    async with SQLiteStore(path) as store:
        yield store


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_an_email_sent_before_a_crash_is_not_sent_again_on_resume(
    kind: str, tmp_path: Path
) -> None:
    outbox = Outbox()
    memory = MemoryStore()
    stuck = anyio.Event()

    async def first_attempt(request: ModelRequest) -> Any:
        if not request.transcript:
            call = ToolCall(id="c1", name="send_email", arguments='{"to": "ana"}')
            return ModelResponse(tool_calls=[call])
        stuck.set()  # the email went; the process dies before the task ends
        await anyio.sleep_forever()

    with anyio.fail_after(10):
        async with (
            journal(kind, tmp_path / "j.db", memory) as store,
            Supervisor(
                scripted(execute=first_attempt), store, tools=[outbox.tool()]
            ) as sup,
        ):
            handle = await sup.submit(spec(chain(1)))
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    await sup.gates.resolve(
                        event.request.gate_id, GateResolution(decision="approve")
                    )
                    break
            await stuck.wait()
        assert keys(outbox) == ["t1:s1c0"]

        executor = Executor({(2, 1): ["ana"]}, attempts=2)
        async with (
            journal(kind, tmp_path / "j.db", memory) as store,
            Supervisor(
                scripted(execute=executor), store, tools=[outbox.tool()], resume=True
            ) as sup,
        ):
            result = await sup.get(handle.run_id).result()
            assert sup.gates.pending() == []
            events = await store.read(handle.run_id)

    assert result.status is RunStatus.COMPLETED
    assert keys(outbox) == ["t1:s1c0"]  # sent once, before the crash
    [seen] = executor.seen[2]
    assert (seen.content, seen.error) == ("sent to ana", False)
    assert [e.task_id for e in events if isinstance(e, TaskInterrupted)] == ["t1"]
    assert sum(isinstance(e, GateOpened) for e in events) == 1
    await memory.aclose()


@pytest.mark.parametrize("failing", ["started", "finished"])
async def test_a_record_that_cannot_be_written_never_costs_an_unrecorded_effect(
    failing: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Before the tool runs, no record means no run; after it, the result
    # still reaches the model and the started record keeps the key.
    store = MemoryStore()
    record = store.record_tool_effect

    async def flaky_record(run_id: str, effect: ToolEffectRecord) -> None:
        if (effect.content is None) == (failing == "started"):
            raise OSError("disk full")
        await record(run_id, effect)

    store.record_tool_effect = flaky_record  # type: ignore[method-assign,assignment]
    outbox = Outbox()
    executor = Executor({(1, 1): ["ana"]}, attempts=1)
    status, _, _ = await run_approving(executor, outbox, store)
    [seen] = executor.seen[1]
    assert status is RunStatus.COMPLETED
    if failing == "started":
        assert outbox.sent == []
        assert seen.error
        assert "could not be recorded before it ran: disk full" in seen.content
    else:
        assert keys(outbox) == ["t1:s1c0"]
        assert (seen.content, seen.error) == ("sent to ana", False)
        assert "ran but is not recorded: disk full" in caplog.text
    await store.aclose()


async def test_a_store_without_tool_effects_is_named_in_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from scripts import DelegatingStore

    plain = DelegatingStore(MemoryStore())
    with caplog.at_level(logging.WARNING, logger="replan.supervisor"):
        async with Supervisor(scripted(), plain, tools=[Outbox().tool()]):
            pass
        async with Supervisor(scripted(), MemoryStore(), tools=[Outbox().tool()]):
            pass
    [record] = caplog.records
    assert "keeps no tool effects" in record.getMessage()
    assert "DelegatingStore" in record.getMessage()


async def replan_show(run_id: str, db: Path) -> CompletedProcess[bytes]:
    """``replan show RUN_ID --db DB``, as a user runs it."""
    command = [sys.executable, "-m", "replan", "show", run_id, "--db", str(db)]
    return await anyio.run_process(command, check=False)


async def test_replan_show_lists_the_side_effects_a_run_made(tmp_path: Path) -> None:
    outbox = Outbox(fail_first=1)
    executor = Executor({(1, 1): ["ana"], (2, 1): ["bo"]}, attempts=2)
    async with SQLiteStore(tmp_path / "j.db") as store:
        status, _, events = await run_approving(executor, outbox, store)
    assert status is RunStatus.COMPLETED
    run_id = events[0].run_id
    shown = await replan_show(run_id, tmp_path / "j.db")
    assert (shown.returncode, shown.stderr) == (0, b"")
    out = shown.stdout.decode()
    section = out[out.index("side effects\n") :].split("\n\n")[0]
    assert section.splitlines() == [
        "side effects",
        '  t1  send_email {"to": "ana"}',
        f"      key {run_id}:t1:s1c0",
        "      (no result recorded: it may have acted)",
        '  t1  send_email {"to": "bo"}',
        f"      key {run_id}:t1:s1c0-2",
        "      -> sent to bo",
    ]


async def test_replan_show_reads_a_journal_from_before_tool_effects(
    tmp_path: Path,
) -> None:
    import sqlite3
    from contextlib import closing

    async with SQLiteStore(tmp_path / "j.db") as store:
        status, _, events = await run_approving(
            Executor({(1, 1): ["ana"]}, attempts=1), Outbox(), store
        )
    with closing(sqlite3.connect(tmp_path / "j.db")) as conn:
        conn.execute("DROP TABLE tool_effects")
        conn.execute("PRAGMA user_version = 2")
        conn.commit()
    shown = await replan_show(events[0].run_id, tmp_path / "j.db")
    assert (shown.returncode, shown.stderr, status) == (0, b"", RunStatus.COMPLETED)
    out = shown.stdout.decode()
    assert "tasks\n  t1  completed" in out
    assert "side effects" not in out


async def test_the_tools_the_last_allowed_step_asks_for_are_not_run(
    store: Store,
) -> None:
    # max_tool_steps=2: the second model call still asks for an email. No
    # model call is left to read its result, so nobody is asked and nothing
    # is sent; the attempt fails naming the limit.
    outbox = Outbox()
    executor = Executor({(1, 1): ["ana"], (1, 2): ["bob"]}, attempts=1)
    model = scripted(execute=executor)
    with anyio.fail_after(10):
        async with Supervisor(model, store, tools=[outbox.tool()]) as sup:
            run_spec = spec(chain(1), max_task_attempts=1, max_tool_steps=2)
            handle = await sup.submit(run_spec)
            gates = await approve_every_gate(sup, handle)
            result = await handle.result()
    assert [to for to, _ in outbox.sent] == ["ana"]
    assert len(gates) == 1
    [task] = result.tasks
    assert task.status is TaskStatus.FAILED
    assert task.result is not None
    assert "max_tool_steps: 2 model calls" in (task.result.reason or "")
    assert "were not run" in (task.result.reason or "")
