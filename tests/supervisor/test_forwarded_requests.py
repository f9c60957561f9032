"""Gate answers and cancels that reach a supervisor which does not drive the
run, on a shared PostgreSQL journal: checked there as the driver would,
kept in the journal, and applied once by the supervisor that drives it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg
import pytest
from explore_scripts import ExploreScript, Idea, explore_spec
from scripts import emails_first, scripted, send_email, spec

from replan import (
    GateAlreadyResolved,
    GateError,
    ModelRequest,
    ResolutionRefused,
    RunStatus,
    ScriptedModel,
    Supervisor,
    TaskDraft,
    TaskOutcome,
    UnknownRunError,
    tool,
)
from replan.messages import (
    GateOpened,
    GateResolution,
    GateResolved,
    HypothesesAdded,
    TaskStarted,
)
from replan.store import PostgresStore, RequestOutcome
from replan.supervisor import Forwarded, RunHandle, fold_journal
from replan.supervisor._forwarding import Forwarding
from replan.supervisor._state import snapshot

SEND = [TaskDraft(key="s1", description="send it", requires_approval=True)]


async def _at_gate(handle: RunHandle) -> str:
    async for event in handle.events():
        if isinstance(event, GateOpened):
            return event.request.gate_id
    raise AssertionError("the run opened no gate")


def _resolved(events: list[object]) -> list[GateResolution]:
    return [e.resolution for e in events if isinstance(e, GateResolved)]


@asynccontextmanager
async def _two(
    dsn: str,
) -> AsyncIterator[tuple[PostgresStore, Supervisor, PostgresStore, Supervisor]]:
    """Two supervisors, each on a journal of its own on one database."""
    async with (
        PostgresStore(dsn) as store_a,
        PostgresStore(dsn) as store_b,
        Supervisor(scripted(), store_a) as a,
        Supervisor(scripted(), store_b) as b,
    ):
        yield store_a, a, store_b, b


async def test_an_answer_at_a_supervisor_that_does_not_drive_the_run_is_applied_once(
    postgres_dsn: str,
) -> None:
    with anyio.fail_after(30):
        async with _two(postgres_dsn) as (store_a, a, _store_b, b):
            handle = await a.submit(spec(SEND))
            gate_id = await _at_gate(handle)
            sent = await b.gates.resolve(gate_id, {"decision": "approve", "by": "ana"})
            assert isinstance(sent, Forwarded)
            assert sent.applied
            assert sent.driven_by == a.owner.holder
            assert (sent.run_id, sent.gate_id) == (handle.run_id, gate_id)
            # A second answer, at either supervisor, is told the first stands.
            again = {"decision": "reject", "by": "bo"}
            with pytest.raises(GateAlreadyResolved, match=r"approve by ana"):
                await b.gates.resolve(gate_id, again)
            with pytest.raises(GateAlreadyResolved, match=r"approve by ana"):
                await a.gates.resolve(gate_id, again)
            result = await handle.result()
            events = await store_a.read(handle.run_id)
    assert result.status is RunStatus.COMPLETED
    assert [(r.decision, r.by) for r in _resolved(events)] == [("approve", "ana")]


async def test_a_bad_answer_sent_from_elsewhere_is_refused_at_once_naming_the_field(
    postgres_dsn: str,
) -> None:
    with anyio.fail_after(30):
        async with _two(postgres_dsn) as (_store_a, a, _store_b, b):
            handle = await a.submit(spec(SEND))
            gate_id = await _at_gate(handle)
            with pytest.raises(ResolutionRefused, match="by") as blank:
                await b.gates.resolve(gate_id, {"decision": "approve", "by": " "})
            edit = {
                "decision": "edit",
                "by": "ana",
                "tasks": [{"key": "x", "description": "do x"}],
            }
            with pytest.raises(ResolutionRefused) as there:
                await b.gates.resolve(gate_id, edit)
            with pytest.raises(ResolutionRefused) as here:
                await a.gates.resolve(gate_id, edit)
            unread = {"decision": "edit", "by": "ana"}  # an edit with no tasks
            with pytest.raises(ResolutionRefused) as unread_there:
                await b.gates.resolve(gate_id, unread)
            with pytest.raises(ResolutionRefused) as unread_here:
                await a.gates.resolve(gate_id, unread)
            with pytest.raises(GateError, match="no open gate"):
                await b.gates.resolve(
                    f"{handle.run_id}-g9", {"decision": "approve", "by": "ana"}
                )
            with pytest.raises(GateError, match="no open gate"):
                await b.gates.resolve(
                    "no-such-run-g1", {"decision": "approve", "by": "ana"}
                )
            # None of them reached the run: the gate is still open.
            assert [g.gate_id for g in a.gates.pending()] == [gate_id]
            assert _count(postgres_dsn, "requests") == 0
            await a.gates.resolve(gate_id, {"decision": "reject", "by": "ana"})
            await handle.result()
    assert blank.value.field == "by"
    # Refused as the driver refuses it.
    assert (there.value.field, str(there.value)) == (here.value.field, str(here.value))
    assert there.value.field == "decision"
    assert (unread_there.value.field, str(unread_there.value)) == (
        unread_here.value.field,
        str(unread_here.value),
    )


async def test_a_cancel_at_a_supervisor_that_does_not_drive_the_run_ends_it(
    postgres_dsn: str,
) -> None:
    with anyio.fail_after(30):
        async with _two(postgres_dsn) as (_store_a, a, _store_b, b):
            handle = await a.submit(spec(SEND))
            await _at_gate(handle)
            sent = await b.cancel(handle.run_id)
            assert sent is not None
            assert sent.applied
            assert sent.gate_id is None
            result = await handle.result()
            # Ended: a cancel anywhere is nothing to do.
            assert await b.cancel(handle.run_id) is None
            assert await a.cancel(handle.run_id) is None
    assert result.status is RunStatus.CANCELLED
    assert _rows(postgres_dsn, "SELECT outcome FROM replan.requests") == [("applied",)]


async def test_an_answer_for_a_run_nobody_drives_waits_for_the_one_that_takes_it_over(
    postgres_dsn: str,
) -> None:
    with anyio.fail_after(30):
        async with PostgresStore(postgres_dsn) as store_a:
            async with Supervisor(scripted(), store_a) as a:
                handle = await a.submit(spec(SEND))
                gate_id = await _at_gate(handle)
            # The first stopped: nobody drives the run.
            async with (
                PostgresStore(postgres_dsn) as store_b,
                Supervisor(scripted(), store_b) as b,
            ):
                answer = {"decision": "approve", "by": "ana"}
                sent = await b.gates.resolve(gate_id, answer)
                assert sent is not None
                assert not sent.applied
                assert sent.driven_by is None
                # A second answer meanwhile is told the first stands.
                with pytest.raises(GateAlreadyResolved, match="approve by ana"):
                    await b.gates.resolve(gate_id, {"decision": "reject", "by": "bo"})
                taken = await b.resume(handle.run_id)
                result = await taken.result()
                events = await store_b.read(handle.run_id)
    assert result.status is RunStatus.COMPLETED
    assert [(r.decision, r.by) for r in _resolved(events)] == [("approve", "ana")]
    assert _rows(postgres_dsn, "SELECT outcome FROM replan.requests") == [("applied",)]


async def test_an_answer_sent_while_nobody_drove_the_run_stands_at_its_takeover(
    postgres_dsn: str,
) -> None:
    with anyio.fail_after(30):
        async with PostgresStore(postgres_dsn) as store_a:
            async with Supervisor(scripted(), store_a) as a:
                handle = await a.submit(spec(SEND))
                gate_id = await _at_gate(handle)
            async with (
                PostgresStore(postgres_dsn) as store_b,
                Supervisor(scripted(), store_b) as b,
            ):
                sent = await b.gates.resolve(
                    gate_id, {"decision": "approve", "by": "ana"}
                )
                assert sent is not None
                assert not sent.applied
                taken = await b.resume(handle.run_id)
                # Answered here as soon as the run is taken over, before the
                # look for requests: the answer sent first stands.
                with pytest.raises(GateAlreadyResolved, match=r"\(approve by ana\)$"):
                    await b.gates.resolve(gate_id, {"decision": "reject", "by": "bo"})
                result = await taken.result()
                await _settled_applied(postgres_dsn)
                events = await store_b.read(handle.run_id)
    assert result.status is RunStatus.COMPLETED
    assert [(r.decision, r.by) for r in _resolved(events)] == [("approve", "ana")]


async def test_a_request_applied_by_the_supervisor_that_took_the_run_over_names_it(
    postgres_dsn: str,
) -> None:
    # Nobody drives the runs as the answer and the cancel are sent; a third
    # supervisor takes them over while their senders wait, and applies them.
    with anyio.fail_after(30):
        async with PostgresStore(postgres_dsn) as store_a:
            async with Supervisor(scripted(), store_a) as a:
                answered = await a.submit(spec(SEND))
                gate_id = await _at_gate(answered)
                cancelled = await a.submit(spec(SEND))
                await _at_gate(cancelled)
            async with (
                PostgresStore(postgres_dsn) as store_b,
                PostgresStore(postgres_dsn) as store_c,
                Supervisor(scripted(), store_b) as b,
                Supervisor(scripted(), store_c) as c,
            ):
                sent: list[Forwarded | None] = []

                async def answer() -> None:
                    answer = {"decision": "approve", "by": "ana"}
                    sent.append(await b.gates.resolve(gate_id, answer))

                async def cancel() -> None:
                    sent.append(await b.cancel(cancelled.run_id))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(answer)
                    tg.start_soon(cancel)
                    await anyio.sleep(0.3)
                    taken = await c.resume(answered.run_id)
                    await c.resume(cancelled.run_id)
                await taken.result()
    assert len(sent) == 2
    for forwarded in sent:
        assert forwarded is not None
        assert forwarded.applied
        if forwarded.gate_id is None:
            # The cancel ends the run as it is taken over, which lets go of
            # its lease at once: its sender may not see who held it.
            assert forwarded.driven_by in (None, c.owner.holder)
        else:
            assert forwarded.driven_by == c.owner.holder


async def test_an_answer_its_driver_refused_leaves_the_gate_open_to_answers_from_afar(
    postgres_dsn: str,
) -> None:
    with anyio.fail_after(30):
        async with _two(postgres_dsn) as (store_a, a, store_b, b):
            handle = await a.submit(spec(SEND))
            gate_id = await _at_gate(handle)
            # An answer the driver's own check refuses (a sender that checked
            # the run otherwise): an edit at a task's approval gate.
            edit = GateResolution(decision="edit", tasks=SEND, by="cy")
            await store_b.add_request(
                handle.run_id, "elsewhere:1", gate_id=gate_id, resolution=edit
            )
            for _ in range(400):  # the driver's next looks
                outcomes = _rows(postgres_dsn, "SELECT outcome FROM replan.requests")
                if outcomes == [("refused",)]:
                    break
                await anyio.sleep(0.05)
            else:
                raise AssertionError("the request was not settled")
            # The gate is still open, and any supervisor takes its answer.
            sent = await b.gates.resolve(gate_id, {"decision": "approve", "by": "ana"})
            assert sent is not None
            assert sent.applied
            result = await handle.result()
            events = await store_a.read(handle.run_id)
    assert result.status is RunStatus.COMPLETED
    assert [(r.decision, r.by) for r in _resolved(events)] == [("approve", "ana")]


async def test_an_answer_its_driver_refuses_is_refused_to_its_sender_naming_the_field(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replan.supervisor import _forwarding

    # A sender that checks the run otherwise than its driver (it read the
    # journal at another moment): here, one that checks nothing.
    monkeypatch.setattr(_forwarding, "answer_check", lambda state, request: None)
    with anyio.fail_after(30):
        async with _two(postgres_dsn) as (_store_a, a, _store_b, b):
            handle = await a.submit(spec(SEND))
            gate_id = await _at_gate(handle)
            edit = {"decision": "edit", "tasks": SEND, "by": "cy"}
            with pytest.raises(ResolutionRefused, match="approve or reject") as e:
                await b.gates.resolve(gate_id, edit)
            assert e.value.field == "decision"
            await a.gates.resolve(gate_id, {"decision": "approve", "by": "ana"})
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED


async def test_an_answer_at_a_supervisor_whose_run_was_taken_over_goes_on_to_it(
    postgres_dsn: str,
) -> None:
    # The first supervisor stalled past its lease, and another took the run
    # over before the first's renewal noticed: the answer, given to the
    # first, is applied by the second.
    with anyio.fail_after(30):
        async with _two(postgres_dsn) as (_store_a, a, store_b, b):
            handle = await a.submit(spec(SEND))
            gate_id = await _at_gate(handle)
            _rows(
                postgres_dsn,
                "UPDATE replan.runs SET lease_expires = now() RETURNING run_id",
            )
            taken = await b.resume(handle.run_id)
            sent = await a.gates.resolve(gate_id, {"decision": "approve", "by": "ana"})
            assert sent is not None
            assert sent.applied
            assert sent.driven_by == b.owner.holder
            result = await taken.result()
            events = await store_b.read(handle.run_id)
    assert result.status is RunStatus.COMPLETED
    assert [(r.decision, r.by) for r in _resolved(events)] == [("approve", "ana")]


class Overtaken(PostgresStore):
    """A journal on which, once a request is kept, ``meanwhile`` runs before
    the call that kept it goes on: the run's driver sees the gate answered
    or the run ended before it looks for the request."""

    meanwhile: Any = None

    async def add_request(self, *args: Any, **kwargs: Any) -> Any:
        kept = await super().add_request(*args, **kwargs)
        if self.meanwhile is not None:
            await self.meanwhile()
        return kept


@pytest.mark.parametrize("meanwhile", ["answered", "ended"])
async def test_an_answer_its_driver_cannot_apply_is_marked_and_raised_to_its_sender(
    meanwhile: str, postgres_dsn: str
) -> None:
    with anyio.fail_after(30):
        async with (
            PostgresStore(postgres_dsn) as store_a,
            Overtaken(postgres_dsn) as store_b,
            Supervisor(scripted(), store_a) as a,
            Supervisor(scripted(), store_b) as b,
        ):
            handle = await a.submit(spec(SEND))
            gate_id = await _at_gate(handle)

            async def overtake() -> None:
                if meanwhile == "answered":
                    await a.gates.resolve(gate_id, {"decision": "reject", "by": "bo"})
                else:
                    await a.cancel(handle.run_id)

            store_b.meanwhile = overtake
            answer = {"decision": "approve", "by": "ana"}
            # The error of an answer given once the gate was answered, or
            # its run ended.
            if meanwhile == "answered":
                with pytest.raises(GateAlreadyResolved, match="reject by bo"):
                    await b.gates.resolve(gate_id, answer)
                with pytest.raises(GateAlreadyResolved, match="reject by bo"):
                    await a.gates.resolve(gate_id, answer)
            else:
                with pytest.raises(GateError, match="closed") as waited:
                    await b.gates.resolve(gate_id, answer)
                store_b.meanwhile = None
                with pytest.raises(GateError, match="closed") as later:
                    await b.gates.resolve(gate_id, answer)
                assert str(waited.value) == str(later.value)
            await handle.result()
            events = await store_a.read(handle.run_id)
    assert "approve" not in [r.decision for r in _resolved(events)]
    outcome = "already_resolved" if meanwhile == "answered" else "closed"
    assert _rows(postgres_dsn, "SELECT outcome FROM replan.requests") == [(outcome,)]


async def test_an_answer_journaled_before_its_driver_settled_it_is_not_applied_again(
    postgres_dsn: str,
) -> None:
    with anyio.fail_after(30):
        async with (
            PostgresStore(postgres_dsn) as store,
            Supervisor(scripted(), store) as a,
        ):
            then = TaskDraft(
                key="s2",
                description="file it",
                depends_on=["s1"],
                requires_approval=True,
            )
            handle = await a.submit(spec([*SEND, then], milestone_every=100))
            gate_id = await _at_gate(handle)
            answer = GateResolution(decision="approve", by="ana")
            # The answer is journaled, and its request still waits: as a
            # driver that died before it settled the request leaves them.
            await a.gates.resolve(gate_id, answer)
            await store.add_request(
                handle.run_id, "elsewhere:1", gate_id=gate_id, resolution=answer
            )

            for _ in range(400):  # the driver's next looks
                if _rows(postgres_dsn, "SELECT outcome FROM replan.requests") == [
                    ("applied",)
                ]:
                    break
                await anyio.sleep(0.05)
            else:
                raise AssertionError("the request was not settled")
            (second,) = a.gates.pending()
            await a.gates.resolve(second.gate_id, answer)
            await handle.result()
            events = await store.read(handle.run_id)
    assert [r.by for r in _resolved(events)] == ["ana", "ana"]  # g1 once, g2


async def test_an_answer_to_a_tool_calls_gate_of_a_dead_driver_stands_at_the_takeover(
    postgres_dsn: str,
) -> None:
    # The run's driver died at a tool call's gate, its lease not yet
    # expired: the answer sent meanwhile waits in the journal. The
    # supervisor that takes the run over journals it instead of withdrawing
    # the gate, and the attempt run again takes it: no new gate, one email.
    sent: list[str] = []

    @tool(side_effect=True)
    def send_email(to: str, idempotency_key: str) -> str:
        """Email someone."""
        sent.append(idempotency_key)
        return "sent"

    answer = {"decision": "approve", "by": "ana"}
    with anyio.fail_after(30):
        async with PostgresStore(postgres_dsn) as store_a:
            model = scripted(execute=emails_first)
            async with Supervisor(model, store_a, tools=[send_email]) as a:
                handle = await a.submit(spec([TaskDraft(key="s1", description="x")]))
                gate_id = await _at_gate(handle)
            _as_a_killed_process_leaves_it(postgres_dsn)
            async with (
                PostgresStore(postgres_dsn) as store_b,
                Supervisor(model, store_b, tools=[send_email]) as b,
            ):
                forwarded = await b.gates.resolve(gate_id, answer)
                assert forwarded is not None
                assert not forwarded.applied
                assert forwarded.driven_by == "host:1"
                _lease_expired(postgres_dsn)
                taken = await b.resume(handle.run_id)
                result = await taken.result()
                assert b.gates.pending() == []
                events = await store_b.read(handle.run_id)
                await _settled_applied(postgres_dsn)
    assert result.status is RunStatus.COMPLETED
    assert sent == [f"{handle.run_id}:t1:s1c0"]
    assert sum(isinstance(e, GateOpened) for e in events) == 1
    assert [(r.decision, r.by) for r in _resolved(events)] == [("approve", "ana")]


async def test_an_answer_sent_as_the_run_is_taken_over_is_not_lost_to_the_withdrawal(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The answer reaches the journal's requests after the supervisor taking
    # the run over read them, before it withdrew the tool call's gate: it
    # stands, and nobody is asked again.
    sent: list[str] = []

    @tool(side_effect=True)
    def send_email(to: str, idempotency_key: str) -> str:
        """Email someone."""
        sent.append(idempotency_key)
        return "sent"

    waiting_for = Forwarding.waiting_for
    answer = GateResolution(decision="approve", by="ana")

    with anyio.fail_after(30):
        async with PostgresStore(postgres_dsn) as store_a:
            model = scripted(execute=emails_first)
            async with Supervisor(model, store_a, tools=[send_email]) as a:
                handle = await a.submit(spec([TaskDraft(key="s1", description="x")]))
                gate_id = await _at_gate(handle)

            async def answered_meanwhile(
                self: Forwarding, run_id: str
            ) -> tuple[dict[str, GateResolution], bool]:
                read = await waiting_for(self, run_id)
                # What a sender does once its checks passed (the run is
                # this supervisor's now, so they do).
                await store_a.add_request(
                    run_id, "host:2", gate_id=gate_id, resolution=answer
                )
                return read

            monkeypatch.setattr(Forwarding, "waiting_for", answered_meanwhile)
            async with (
                PostgresStore(postgres_dsn) as store_b,
                Supervisor(model, store_b, tools=[send_email]) as b,
            ):
                taken = await b.resume(handle.run_id)
                with anyio.fail_after(10):
                    result = await taken.result()
                events = await store_b.read(handle.run_id)
                await _settled_applied(postgres_dsn)
    assert result.status is RunStatus.COMPLETED
    assert sent == [f"{handle.run_id}:t1:s1c0"]
    assert sum(isinstance(e, GateOpened) for e in events) == 1
    assert [(r.decision, r.by) for r in _resolved(events)] == [("approve", "ana")]


async def test_a_tool_calls_gate_of_a_run_nobody_drives_is_not_answered_from_afar(
    postgres_dsn: str,
) -> None:
    # Whoever takes the run over withdraws the gate (its attempt was cut
    # short) and runs the attempt again, which asks again.
    with anyio.fail_after(30):
        async with PostgresStore(postgres_dsn) as store_a:
            model = scripted(execute=emails_first)
            async with Supervisor(model, store_a, tools=[send_email]) as a:
                handle = await a.submit(spec([TaskDraft(key="s1", description="x")]))
                gate_id = await _at_gate(handle)
            async with (
                PostgresStore(postgres_dsn) as store_b,
                Supervisor(scripted(), store_b) as b,
            ):
                answer = {"decision": "approve", "by": "ana"}
                with pytest.raises(GateError, match="no supervisor drives"):
                    await b.gates.resolve(gate_id, answer)
    assert _count(postgres_dsn, "requests") == 0


async def test_the_same_answer_sent_again_waits_for_the_first_and_says_how_it_went(
    postgres_dsn: str,
) -> None:
    # A sender that stopped waiting (or a client retrying) sends its answer
    # again: it is not applied twice, and is told what became of the first.
    answer = {"decision": "approve", "by": "ana"}
    with anyio.fail_after(30):
        async with PostgresStore(postgres_dsn) as store_a:
            async with Supervisor(scripted(), store_a) as a:
                handle = await a.submit(spec(SEND))
                gate_id = await _at_gate(handle)
            async with (
                PostgresStore(postgres_dsn) as store_b,
                Supervisor(scripted(), store_b) as b,
            ):
                first = await b.gates.resolve(gate_id, answer)
                again = await b.gates.resolve(gate_id, answer)
                assert isinstance(first, Forwarded)
                assert isinstance(again, Forwarded)
                assert again.request_id == first.request_id
                assert not again.applied
                # Another answer is still told the first stands.
                with pytest.raises(GateAlreadyResolved, match="approve by ana"):
                    await b.gates.resolve(gate_id, {"decision": "reject", "by": "bo"})
                taken = await b.resume(handle.run_id)
                result = await taken.result()
                # Journaled: the answer stands, as at the driver.
                with pytest.raises(GateAlreadyResolved, match="approve by ana"):
                    await b.gates.resolve(gate_id, answer)
                events = await store_b.read(handle.run_id)
    assert result.status is RunStatus.COMPLETED
    assert [(r.decision, r.by) for r in _resolved(events)] == [("approve", "ana")]
    assert _rows(postgres_dsn, "SELECT outcome FROM replan.requests") == [("applied",)]


class Retained(PostgresStore):
    """A journal whose retention takes a run away (``compact`` or
    ``delete``) as soon as a cancel sent from elsewhere ended it, before the
    cancel's request is settled: the request goes with the run."""

    retention = "compact"

    async def settle_request(
        self, request_id: int, outcome: RequestOutcome, detail: str | None = None
    ) -> bool:
        request = await self.get_request(request_id)
        assert request is not None
        events = await self.read(request.run_id)
        if self.retention == "compact":
            state = fold_journal(request.run_id, events)
            await self.compact_run(request.run_id, snapshot(state, len(events)))
        else:
            await self.delete_run(request.run_id)
        return True


@pytest.mark.parametrize("retention", ["compact", "delete"])
async def test_a_cancel_whose_run_retention_took_away_meanwhile_says_how_it_went(
    retention: str, postgres_dsn: str
) -> None:
    with anyio.fail_after(30):
        async with (
            Retained(postgres_dsn) as store_a,
            PostgresStore(postgres_dsn) as store_b,
            Supervisor(scripted(), store_a) as a,
            Supervisor(scripted(), store_b) as b,
        ):
            store_a.retention = retention
            handle = await a.submit(spec(SEND))
            await _at_gate(handle)
            if retention == "compact":
                sent = await b.cancel(handle.run_id)
                assert sent is not None
                assert sent.applied
            else:
                with pytest.raises(UnknownRunError):
                    await b.cancel(handle.run_id)
            result = await handle.result()
    assert result.status is RunStatus.CANCELLED
    assert _count(postgres_dsn, "requests") == 0


class RetainedOnceEnded(Retained):
    """A journal whose retention takes a run away once an answer sent from
    elsewhere let it end, before the answer's request is settled."""

    async def settle_request(
        self, request_id: int, outcome: RequestOutcome, detail: str | None = None
    ) -> bool:
        request = await self.get_request(request_id)
        assert request is not None
        for _ in range(200):
            run = await self.get_run(request.run_id)
            if run is not None and run.status.final:
                return await super().settle_request(request_id, outcome, detail)
            await anyio.sleep(0.01)
        raise AssertionError(f"run {request.run_id} did not end")


@pytest.mark.parametrize("retention", ["compact", "delete"])
async def test_an_answer_whose_run_retention_took_away_meanwhile_says_how_it_went(
    retention: str, postgres_dsn: str
) -> None:
    with anyio.fail_after(30):
        async with (
            RetainedOnceEnded(postgres_dsn) as store_a,
            PostgresStore(postgres_dsn) as store_b,
            Supervisor(scripted(), store_a) as a,
            Supervisor(scripted(), store_b) as b,
        ):
            store_a.retention = retention
            handle = await a.submit(spec(SEND))
            gate_id = await _at_gate(handle)
            answer = {"decision": "approve", "by": "ana"}
            if retention == "compact":
                sent = await b.gates.resolve(gate_id, answer)
                assert isinstance(sent, Forwarded)
                assert sent.applied
            else:
                with pytest.raises(GateError, match="gone from the journal"):
                    await b.gates.resolve(gate_id, answer)
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED
    assert _count(postgres_dsn, "requests") == 0


async def _settled_applied(dsn: str) -> None:
    """Wait until the one request is settled ``applied`` (at its driver's
    next look for requests)."""
    for _ in range(400):
        outcomes = _rows(dsn, "SELECT outcome FROM replan.requests")
        if outcomes == [("applied",)]:
            return
        await anyio.sleep(0.05)
    raise AssertionError(f"the request was not settled: {outcomes}")


def _as_a_killed_process_leaves_it(dsn: str) -> None:
    """Every run's lease held by a process that is gone, for an hour yet."""
    _rows(
        dsn,
        "UPDATE replan.runs SET owner = 'dead', holder = 'host:1', "
        "lease_expires = now() + interval '1 hour' RETURNING run_id",
    )


def _lease_expired(dsn: str) -> None:
    """Every run's lease expires now, as its owner's dying a lease ago
    would."""
    _rows(dsn, "UPDATE replan.runs SET lease_expires = now() RETURNING run_id")


def _rows(dsn: str, statement: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement).fetchall()  # type: ignore[arg-type]


def _count(dsn: str, table: str) -> int:
    (row,) = _rows(dsn, f"SELECT count(*) FROM replan.{table}")
    return int(row[0])  # type: ignore[call-overload]


async def test_a_cancel_sent_while_nobody_drives_the_run_ends_it_before_work_restarts(
    postgres_dsn: str,
) -> None:
    # The run's driver died with a task under way, its lease not yet
    # expired; a cancel sent meanwhile waits in the journal. The supervisor
    # that takes the run over ends it cancelled without asking the executor
    # again: cancelled work (a side effect, say) must not start anew.
    asked: list[str] = []

    async def hangs(request: ModelRequest) -> TaskOutcome:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    def records(request: ModelRequest) -> TaskOutcome:
        asked.append(request.context["task"].id)
        return TaskOutcome(success=True, summary="done")

    tasks = [TaskDraft(key="s1", description="send it")]
    with anyio.fail_after(30):
        async with PostgresStore(postgres_dsn) as store_a:
            async with Supervisor(scripted(execute=hangs), store_a) as a:
                handle = await a.submit(spec(tasks))
                async for event in handle.events():
                    if isinstance(event, TaskStarted):
                        break
            _as_a_killed_process_leaves_it(postgres_dsn)
            async with (
                PostgresStore(postgres_dsn) as store_b,
                Supervisor(scripted(execute=records), store_b) as b,
            ):
                forwarded = await b.cancel(handle.run_id)
                assert forwarded is not None
                assert not forwarded.applied
                _lease_expired(postgres_dsn)
                taken = await b.resume(handle.run_id)
                result = await taken.result()
                events = await store_b.read(handle.run_id)
                assert await b.replay(handle.run_id) == result
                await _settled_applied(postgres_dsn)
    assert result.status is RunStatus.CANCELLED
    assert result.stop_reason == "cancelled on request"
    assert asked == []
    assert sum(isinstance(e, TaskStarted) for e in events) == 1


async def test_an_explore_run_cancelled_at_its_takeover_briefs_what_its_journal_holds(
    postgres_dsn: str,
) -> None:
    # As a plan run: cancelled before its flow starts again. Its brief says
    # what the journal held (the analysis made before the stop), and no
    # model is asked again.
    script = ExploreScript(generated=[Idea("Cooks of one waste leftovers")])
    asked: list[str] = []

    async def stalls(request: ModelRequest) -> Any:
        if request.purpose == "critique":
            await anyio.sleep_forever()
        return script(request)

    def records(request: ModelRequest) -> Any:
        asked.append(request.purpose)
        return script(request)

    with anyio.fail_after(30):
        async with PostgresStore(postgres_dsn) as store_a:
            async with Supervisor(ScriptedModel(stalls), store_a) as a:
                handle = await a.submit(explore_spec())
                async for event in handle.events():
                    if isinstance(event, HypothesesAdded):
                        break
            _as_a_killed_process_leaves_it(postgres_dsn)
            async with (
                PostgresStore(postgres_dsn) as store_b,
                Supervisor(ScriptedModel(records), store_b) as b,
            ):
                assert await b.cancel(handle.run_id) is not None
                _lease_expired(postgres_dsn)
                result = await (await b.resume(handle.run_id)).result()
                assert await b.replay(handle.run_id) == result
    assert result.status is RunStatus.CANCELLED
    assert asked == []
    assert result.brief is not None
    assert "cancelled on request" in result.brief.summary
    # Read from the journal: the context analysis made before the stop.
    assert result.brief.gaps == ["no data on household size"]
