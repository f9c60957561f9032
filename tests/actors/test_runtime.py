from __future__ import annotations

import asyncio  # noqa: TID251 - a stray asyncio.CancelledError, asyncio only
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel
import pytest
from anyio import wait_all_tasks_blocked
from anyio.abc import TaskGroup
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from replan._errors import ActorCrashed, ActorStopped, ActorTimeout
from replan.actors import (
    Actor,
    ActorContext,
    ActorPool,
    ReplySlot,
    waiting_for_a_person,
)
from replan.messages import ActorFailure


@dataclass
class Script:
    """What the test actors do, shared by every instance the factory makes.

    Requests are strings: ``echo:x`` answers ``x``; ``crash`` raises;
    ``hold:name`` waits for ``release(name)`` (``person:name`` too, as a
    wait for a person); ``forever`` waits until cancelled. Every instance
    records what it saw so tests can assert on it.
    """

    made: int = 0
    handled: list[str] = field(default_factory=list)
    contexts: list[ActorContext] = field(default_factory=list)
    started: dict[str, anyio.Event] = field(default_factory=dict)
    gates: dict[str, anyio.Event] = field(default_factory=dict)
    cancelled: dict[str, anyio.Event] = field(default_factory=dict)
    crash_gate: anyio.Event | None = None

    def started_event(self, name: str) -> anyio.Event:
        return self.started.setdefault(name, anyio.Event())

    def cancelled_event(self, name: str) -> anyio.Event:
        return self.cancelled.setdefault(name, anyio.Event())

    def release(self, name: str) -> None:
        self.gates.setdefault(name, anyio.Event()).set()

    def factory(self) -> Actor[str, str]:
        self.made += 1
        return ScriptedActor(self, self.made)


class ScriptedActor:
    def __init__(self, script: Script, number: int) -> None:
        self.script = script
        self.number = number

    async def handle(self, request: str, ctx: ActorContext) -> str:
        script = self.script
        script.handled.append(request)
        script.contexts.append(ctx)
        verb, _, arg = request.partition(":")
        script.started_event(request).set()
        try:
            if verb == "echo":
                await anyio.lowlevel.checkpoint()
                return arg
            if verb == "whoami":
                return str(self.number)
            if verb == "crash":
                if script.crash_gate is not None:
                    await script.crash_gate.wait()
                raise ValueError(f"bad request {arg}")
            if verb == "hold":
                await script.gates.setdefault(arg, anyio.Event()).wait()
                return arg
            if verb == "person":
                with waiting_for_a_person():
                    await script.gates.setdefault(arg, anyio.Event()).wait()
                await anyio.lowlevel.checkpoint()
                return arg
            if verb == "forever":
                await anyio.sleep_forever()
            if verb == "stray":
                # asyncio code awaiting a future something else cancelled.
                future = asyncio.get_running_loop().create_future()
                future.cancel()
                await future
            raise AssertionError(f"unknown request {request}")
        except anyio.get_cancelled_exc_class():
            script.cancelled_event(request).set()
            raise


@asynccontextmanager
async def running(pool: ActorPool[str, str]) -> AsyncIterator[TaskGroup]:
    """Run the pool in a task group; cancel it (a shutdown) on the way out."""
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            yield tg
            tg.cancel_scope.cancel()


def pool_of(script: Script, **options: int | float) -> ActorPool[str, str]:
    return ActorPool("tester", script.factory, **options)  # type: ignore[arg-type]


Outcome = str | BaseException


def keep_errors(
    kind: type[BaseException], errors: list[BaseException], done: anyio.Event
) -> Callable[[ReplySlot[str]], None]:
    """A post's callback that keeps the answered slot's ``kind`` error and
    sets ``done``."""

    def on_done(slot: ReplySlot[str]) -> None:
        try:
            slot.result()
        except kind as exc:
            errors.append(exc)
        done.set()

    return on_done


async def enqueue(
    tg: TaskGroup, pool: ActorPool[str, str], request: str, outcomes: dict[str, Outcome]
) -> None:
    """Ask in the background and wait until the request is in the pool.

    Waiting for every task to block orders the requests in the mailbox, which
    ``start_soon`` alone does not promise (trio runs new tasks in any order).
    """

    async def ask() -> None:
        try:
            outcomes[request] = await pool.ask(request)
        except Exception as exc:
            outcomes[request] = exc

    tg.start_soon(ask)
    await wait_all_tasks_blocked()


async def test_a_reply_comes_back_to_the_caller_that_asked() -> None:
    script = Script()
    pool = pool_of(script, workers=3, mailbox_size=4)
    replies: dict[int, str] = {}

    async def caller(number: int) -> None:
        replies[number] = await pool.ask(f"echo:{number}", run_id=f"run-{number}")

    async with running(pool), anyio.create_task_group() as callers:
        for number in range(50):
            callers.start_soon(caller, number)

    assert replies == {number: str(number) for number in range(50)}
    assert {ctx.run_id for ctx in script.contexts} == {f"run-{n}" for n in range(50)}


async def test_the_handler_context_names_the_role_run_and_deadline() -> None:
    script = Script()
    pool = pool_of(script, workers=1)
    async with running(pool):
        deadline = anyio.current_time() + 3
        await pool.ask("echo:x", run_id="run-7", deadline=deadline)
        await pool.ask("echo:y")
    assert script.contexts == [
        ActorContext("tester", "run-7", deadline),
        ActorContext("tester", None, None),
    ]


async def test_a_crash_returns_a_typed_failure_and_the_worker_is_replaced() -> None:
    script = Script()
    pool = pool_of(script, workers=1)
    async with running(pool):
        assert await pool.ask("whoami") == "1"
        with pytest.raises(ActorCrashed) as caught:
            await pool.ask("crash:42")
        assert caught.value.failure == ActorFailure(
            role="tester", error_type="ValueError", message="bad request 42"
        )
        assert caught.value.role == "tester"
        assert script.made == 2
        assert await pool.ask("whoami") == "2"
        assert pool.statistics().restarts == 1
        assert not pool.stopped


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_handler_letting_out_a_stray_cancellation_is_a_crash_not_a_stop() -> (
    None
):
    # Only asyncio code can raise a cancellation no scope sent.
    script = Script()
    pool = pool_of(script, workers=2)
    async with running(pool):
        async with anyio.create_task_group() as tg:
            tg.start_soon(pool.ask, "hold:other")
            await wait_all_tasks_blocked()
            with pytest.raises(ActorCrashed) as caught:
                await pool.ask("stray")
            assert caught.value.failure.error_type == "CancelledError"
            # The request in flight on the other worker is not touched.
            script.release("other")
        assert "other" not in {k.partition(":")[2] for k in script.cancelled}
        assert not pool.stopped
        assert pool.statistics().restarts == 1
        assert await pool.ask("echo:next") == "next"


async def test_too_many_crashes_stop_the_role_and_queued_requests_get_stopped() -> None:
    script = Script(crash_gate=anyio.Event())
    pool = pool_of(script, workers=1, mailbox_size=8, max_restarts=2)
    outcomes: dict[str, Outcome] = {}
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            for request in ("crash:1", "crash:2", "crash:3", "echo:a", "echo:b"):
                await enqueue(tg, pool, request, outcomes)
            assert script.crash_gate is not None
            script.crash_gate.set()
        # The role stopped by itself: run() returned without a cancellation.

    assert all(isinstance(outcomes[f"crash:{n}"], ActorCrashed) for n in (1, 2, 3))
    for request in ("echo:a", "echo:b"):
        error = outcomes[request]
        assert isinstance(error, ActorStopped)
        assert "3 crashes within 10s" in str(error)
    assert script.handled == ["crash:1", "crash:2", "crash:3"]
    assert pool.stop_reason == "tester stopped after 3 crashes within 10s"
    statistics = pool.statistics()
    assert (statistics.restarts, statistics.stopped) == (2, True)
    with pytest.raises(ActorStopped, match="3 crashes"):
        await pool.ask("echo:later")


async def test_crashes_spread_over_longer_than_the_period_do_not_stop_the_role() -> (
    None
):
    script = Script()
    pool = pool_of(script, workers=1, max_restarts=1, restart_period_s=0.05)
    async with running(pool):
        for _ in range(3):
            with pytest.raises(ActorCrashed):
                await pool.ask("crash")
            await anyio.sleep(0.06)
        assert await pool.ask("echo:still here") == "still here"
        assert not pool.stopped
        assert pool.statistics().restarts == 3


async def test_a_second_crash_within_the_period_stops_a_role_allowed_one_restart() -> (
    None
):
    script = Script()
    pool = pool_of(script, workers=2, max_restarts=1, restart_period_s=60)
    async with running(pool):
        for _ in range(2):
            with pytest.raises(ActorCrashed):
                await pool.ask("crash")
        with pytest.raises(ActorStopped, match="2 crashes within 60s"):
            await pool.ask("echo:x")


async def test_messages_left_in_the_mailbox_when_the_pool_stops_receive_an_error() -> (
    None
):
    script = Script()
    pool = pool_of(script, workers=1, mailbox_size=8)
    outcomes: dict[str, Outcome] = {}
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            for request in ("hold:first", "echo:a", "echo:b", "echo:c"):
                await enqueue(tg, pool, request, outcomes)
            assert pool.statistics().mailbox_depth == 3
            pool.stop("shutting down")
            # Queued requests are answered at once, before the one in flight.
            await wait_all_tasks_blocked()
            for request in ("echo:a", "echo:b", "echo:c"):
                error = outcomes[request]
                assert isinstance(error, ActorStopped)
                assert str(error) == "tester: shutting down"
            # The request in flight finishes; then the workers end.
            script.release("first")
    assert outcomes["hold:first"] == "first"
    assert script.handled == ["hold:first"]


async def test_a_request_in_hand_at_shutdown_gets_stopped_and_nothing_runs_on() -> None:
    script = Script()
    pool = pool_of(script, workers=2, mailbox_size=4)
    outcomes: dict[str, Outcome] = {}
    with anyio.fail_after(5):
        async with anyio.create_task_group() as callers:
            async with anyio.create_task_group() as tg:
                await tg.start(pool.run)
                for request in ("forever:1", "forever:2", "echo:queued"):
                    await enqueue(callers, pool, request, outcomes)
                tg.cancel_scope.cancel()
            # Nothing of the pool is left running once its task group exits.
            statistics = pool.statistics()
            assert (statistics.busy, statistics.mailbox_depth) == (0, 0)
            assert statistics.stopped
            assert script.cancelled_event("forever:1").is_set()
            assert script.cancelled_event("forever:2").is_set()
    for request in ("forever:1", "forever:2", "echo:queued"):
        error = outcomes[request]
        assert isinstance(error, ActorStopped)
        assert str(error) == "tester: the supervisor stopped"
    with pytest.raises(ActorStopped):
        await pool.ask("echo:later")


async def test_senders_blocked_on_a_full_mailbox_get_actor_stopped_when_it_stops() -> (
    None
):
    script = Script()
    pool = pool_of(script, workers=1, mailbox_size=1)
    outcomes: dict[str, Outcome] = {}
    async with running(pool) as tg:
        for request in ("hold:first", "echo:queued", "echo:blocked"):
            await enqueue(tg, pool, request, outcomes)
        assert pool.statistics().senders_waiting == 1
        pool.stop("closing")
        await wait_all_tasks_blocked()
        assert isinstance(outcomes["echo:queued"], ActorStopped)
        assert isinstance(outcomes["echo:blocked"], ActorStopped)
        assert "closing" in str(outcomes["echo:blocked"])
        script.release("first")
        await wait_all_tasks_blocked()
    assert outcomes["hold:first"] == "first"


async def test_a_full_mailbox_blocks_senders_until_a_worker_takes_a_request() -> None:
    script = Script()
    pool = pool_of(script, workers=2, mailbox_size=3)
    outcomes: dict[str, Outcome] = {}
    async with running(pool) as tg:
        # Two requests in hand, three queued: the mailbox is full.
        for name in "abcde":
            await enqueue(tg, pool, f"hold:{name}", outcomes)
        statistics = pool.statistics()
        assert (statistics.busy, statistics.mailbox_depth) == (2, 3)
        assert statistics.senders_waiting == 0
        # The sixth sender waits for room.
        await enqueue(tg, pool, "hold:f", outcomes)
        statistics = pool.statistics()
        assert (statistics.busy, statistics.mailbox_depth) == (2, 3)
        assert statistics.senders_waiting == 1
        # One finishes: a worker takes the next request and the sender gets in.
        script.release("a")
        await wait_all_tasks_blocked()
        assert outcomes == {"hold:a": "a"}
        statistics = pool.statistics()
        assert (statistics.busy, statistics.mailbox_depth) == (2, 3)
        assert statistics.senders_waiting == 0
        for name in "bcdef":
            script.release(name)
        await wait_all_tasks_blocked()
    assert outcomes == {f"hold:{name}": name for name in "abcdef"}


async def test_a_deadline_that_passes_gives_actor_timeout_and_cancels_the_handler() -> (
    None
):
    script = Script()
    pool = pool_of(script, workers=1)
    async with running(pool):
        with pytest.raises(ActorTimeout):
            await pool.ask("forever", deadline=anyio.current_time() + 0.05)
        await script.cancelled_event("forever").wait()
        assert pool.statistics().busy == 0
        assert await pool.ask("echo:next") == "next"


async def test_handle_within_s_times_the_handling_not_the_wait_for_a_worker() -> None:
    script = Script()
    pool = pool_of(script, workers=1)
    answers: list[str] = []

    async def queued() -> None:
        answers.append(await pool.ask("echo:b", handle_within_s=0.05))

    async with running(pool):
        async with anyio.create_task_group() as tg:
            tg.start_soon(pool.ask, "hold:a")
            await script.started_event("hold:a").wait()
            tg.start_soon(queued)
            await anyio.sleep(0.2)  # in the mailbox four times its limit
            script.gates["a"].set()
        assert answers == ["b"]
        assert script.contexts[-1].deadline is not None  # set when taken
        with pytest.raises(ActorTimeout):
            await pool.ask("forever", handle_within_s=0.05)
        await script.cancelled_event("forever").wait()
        assert pool.statistics().busy == 0


async def test_a_deadline_that_passes_in_the_mailbox_times_out_without_handling() -> (
    None
):
    script = Script()
    pool = pool_of(script, workers=1, mailbox_size=1)
    outcomes: dict[str, Outcome] = {}
    async with running(pool) as tg:
        await enqueue(tg, pool, "hold:first", outcomes)
        with pytest.raises(ActorTimeout):
            await pool.ask("echo:late", deadline=anyio.current_time() + 0.02)
        script.release("first")
        assert await pool.ask("echo:next") == "next"
    assert script.handled == ["hold:first", "echo:next"]


async def test_a_deadline_that_passes_while_blocked_on_a_full_mailbox_times_out() -> (
    None
):
    script = Script()
    pool = pool_of(script, workers=1, mailbox_size=1)
    outcomes: dict[str, Outcome] = {}
    async with running(pool) as tg:
        await enqueue(tg, pool, "hold:first", outcomes)
        await enqueue(tg, pool, "echo:queued", outcomes)  # fills the mailbox
        with pytest.raises(ActorTimeout):
            await pool.ask("echo:late", deadline=anyio.current_time() + 0.02)
        assert pool.statistics().senders_waiting == 0
        script.release("first")
        await wait_all_tasks_blocked()
    assert script.handled == ["hold:first", "echo:queued"]
    assert outcomes == {"hold:first": "first", "echo:queued": "queued"}


def test_a_mailbox_must_hold_at_least_one_request() -> None:
    with pytest.raises(ValueError, match="mailbox_size must be at least 1"):
        pool_of(Script(), mailbox_size=0)


async def test_a_deadline_already_past_times_out_at_once() -> None:
    script = Script()
    pool = pool_of(script, workers=1)
    async with running(pool):
        with pytest.raises(ActorTimeout):
            await pool.ask("echo:x", deadline=anyio.current_time() - 1)
    assert script.handled == []


async def test_cancelling_the_caller_cancels_the_handlers_work() -> None:
    script = Script()
    pool = pool_of(script, workers=1)
    async with running(pool):
        async with anyio.create_task_group() as callers:
            callers.start_soon(pool.ask, "forever")
            await script.started_event("forever").wait()
            callers.cancel_scope.cancel()
        await script.cancelled_event("forever").wait()
        assert pool.statistics().busy == 0
        assert await pool.ask("echo:after") == "after"
        assert script.made == 1


async def test_a_handler_ignoring_cancellation_does_not_cancel_the_next_request() -> (
    None
):
    ignored = anyio.Event()
    entered = anyio.Event()

    class Stubborn:
        async def handle(self, request: str, ctx: ActorContext) -> str:
            if request == "stubborn":
                entered.set()
                try:
                    await anyio.sleep_forever()
                except anyio.get_cancelled_exc_class():
                    ignored.set()  # and carries on, which it should not
                return "late"
            await anyio.lowlevel.checkpoint()
            return request

    pool: ActorPool[str, str] = ActorPool("stubborn", Stubborn, workers=1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            async with anyio.create_task_group() as callers:
                callers.start_soon(pool.ask, "stubborn")
                await entered.wait()
                callers.cancel_scope.cancel()
            await ignored.wait()
            assert await pool.ask("next") == "next"
            assert await pool.ask("and the next") == "and the next"
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("how", ["cancel", "deadline"])
async def test_a_handler_whose_cleanup_fails_when_cancelled_counts_as_a_crash(
    how: str,
) -> None:
    # Its own task group's child raises while cancelled (a connection that
    # fails to close, say): on trio the error comes out of the worker's scope
    # without the cancellation. It must not leave the pool.
    entered = anyio.Event()

    class FailingCleanup:
        async def handle(self, request: str, ctx: ActorContext) -> str:
            if request != "hang":
                return request

            async def connection() -> None:
                try:
                    await anyio.sleep_forever()
                except anyio.get_cancelled_exc_class():
                    raise RuntimeError("the connection failed to close") from None

            async with anyio.create_task_group() as tg:
                tg.start_soon(connection)
                await wait_all_tasks_blocked()
                entered.set()
                await anyio.sleep_forever()
            return "never"

    pool: ActorPool[str, str] = ActorPool("cleanup", FailingCleanup, workers=1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            if how == "cancel":
                async with anyio.create_task_group() as callers:
                    callers.start_soon(pool.ask, "hang")
                    await entered.wait()
                    callers.cancel_scope.cancel()
            else:
                with pytest.raises(ActorTimeout):
                    await pool.ask("hang", deadline=anyio.current_time() + 0.05)
            assert await pool.ask("next") == "next"
            stats = pool.statistics()
            assert (stats.restarts, stats.stopped) == (1, False)
            tg.cancel_scope.cancel()


async def test_a_caller_cancelled_while_queued_is_skipped_by_the_worker() -> None:
    script = Script()
    pool = pool_of(script, workers=1, mailbox_size=2)
    outcomes: dict[str, Outcome] = {}
    async with running(pool) as tg:
        await enqueue(tg, pool, "hold:first", outcomes)
        async with anyio.create_task_group() as callers:
            await enqueue(callers, pool, "echo:abandoned", outcomes)
            callers.cancel_scope.cancel()
        script.release("first")
        assert await pool.ask("echo:next") == "next"
    assert script.handled == ["hold:first", "echo:next"]


async def test_statistics_report_workers_busy_mailbox_depth_restarts_and_stopped() -> (
    None
):
    script = Script()
    pool = pool_of(script, workers=2, mailbox_size=5, max_restarts=3)
    outcomes: dict[str, Outcome] = {}
    async with running(pool) as tg:
        with pytest.raises(ActorCrashed):
            await pool.ask("crash")
        for request in ("hold:a", "hold:b", "hold:c"):
            await enqueue(tg, pool, request, outcomes)
        statistics = pool.statistics()
        assert statistics.role == "tester"
        assert (statistics.workers, statistics.busy) == (2, 2)
        assert (statistics.mailbox_depth, statistics.mailbox_size) == (1, 5)
        assert (statistics.restarts, statistics.senders_waiting) == (1, 0)
        assert (statistics.stopped, statistics.stop_reason) == (False, None)
        for name in "abc":
            script.release(name)
        await wait_all_tasks_blocked()
        assert pool.statistics().busy == 0
        pool.stop("done")
        statistics = pool.statistics()
        assert (statistics.stopped, statistics.stop_reason) == (True, "done")


async def test_workers_start_on_demand_up_to_the_pool_size() -> None:
    script = Script()
    pool = pool_of(script, workers=3, mailbox_size=8)
    outcomes: dict[str, Outcome] = {}
    async with running(pool) as tg:
        await wait_all_tasks_blocked()
        assert (pool.statistics().live, script.made) == (1, 1)
        # One held request keeps the first worker; the next finds none free.
        await enqueue(tg, pool, "hold:a", outcomes)
        assert pool.statistics().live == 1
        await enqueue(tg, pool, "hold:b", outcomes)
        assert (pool.statistics().live, pool.statistics().busy) == (2, 2)
        for name in "cde":
            await enqueue(tg, pool, f"hold:{name}", outcomes)
        statistics = pool.statistics()
        assert (statistics.live, statistics.busy, statistics.mailbox_depth) == (3, 3, 2)
        for name in "abcde":
            script.release(name)
        await wait_all_tasks_blocked()
        # Free workers take later requests: the pool does not grow further.
        assert await pool.ask("echo:x") == "x"
        assert (pool.statistics().live, script.made) == (3, 3)
    assert outcomes == {f"hold:{name}": name for name in "abcde"}


async def test_a_handler_waiting_for_a_person_holds_up_no_other_request() -> None:
    script = Script()
    pool = pool_of(script, workers=1, mailbox_size=8)
    outcomes: dict[str, Outcome] = {}
    async with running(pool) as tg:
        await enqueue(tg, pool, "person:a", outcomes)
        await enqueue(tg, pool, "person:b", outcomes)
        await wait_all_tasks_blocked()
        statistics = pool.statistics()
        assert (statistics.waiting_for_people, statistics.live) == (2, 2)
        # The next request starts a worker in their place, as if none waited.
        assert await pool.ask("echo:x") == "x"
        assert pool.statistics().live == 3
        await enqueue(tg, pool, "hold:c", outcomes)
        statistics = pool.statistics()
        # Busy is the work done at once, within the pool's size.
        assert (statistics.busy, statistics.waiting_for_people) == (1, 2)
        script.release("a")
        script.release("b")
        await wait_all_tasks_blocked()
        # Two workers too many while "c" still runs: the two free ones retire.
        statistics = pool.statistics()
        assert (statistics.waiting_for_people, statistics.live) == (0, 1)
        script.release("c")
        await wait_all_tasks_blocked()
        assert await pool.ask("echo:y") == "y"
        assert pool.statistics().live == 1
    assert outcomes == {"person:a": "a", "person:b": "b", "hold:c": "c"}


def test_waiting_for_a_person_outside_a_pool_does_nothing() -> None:
    with waiting_for_a_person():
        pass


async def test_the_senders_trace_context_reaches_the_handler() -> None:
    tracer = TracerProvider().get_tracer("test")
    seen: list[trace.SpanContext] = []

    class Tracing:
        async def handle(self, request: str, ctx: ActorContext) -> str:
            seen.append(trace.get_current_span().get_span_context())
            return request

    pool: ActorPool[str, str] = ActorPool("tracer", Tracing, workers=1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            with tracer.start_as_current_span("sender") as span:
                await pool.ask("traced")
            await pool.ask("untraced")
            tg.cancel_scope.cancel()
    sender = span.get_span_context()
    assert seen[0].trace_id == sender.trace_id
    assert seen[0].span_id == sender.span_id
    assert not seen[1].is_valid


async def test_a_factory_that_fails_stops_the_role_instead_of_the_task_group() -> None:
    script = Script()
    made = 0

    def factory() -> Actor[str, str]:
        nonlocal made
        made += 1
        if made > 1:
            raise RuntimeError("no more actors")
        return script.factory()

    pool: ActorPool[str, str] = ActorPool("tester", factory, workers=1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            with pytest.raises(ActorCrashed):
                await pool.ask("crash")
            with pytest.raises(ActorStopped, match="no more actors"):
                await pool.ask("echo:x")
    assert pool.stopped


async def test_a_pool_runs_only_once() -> None:
    pool = pool_of(Script(), workers=1)
    async with running(pool):
        with pytest.raises(RuntimeError, match="already started"):
            await pool.run()


def test_a_pool_needs_at_least_one_worker() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        pool_of(Script(), workers=0)


async def test_a_reply_slot_keeps_the_first_answer() -> None:
    slot: ReplySlot[str] = ReplySlot()
    assert not slot.done
    slot.set("first")
    slot.fail(ActorStopped("r", "late"))
    slot.set("second")
    assert slot.done
    assert await slot.wait() == "first"


async def test_abandoning_an_answered_slot_does_not_cancel_the_worker() -> None:
    answered: ReplySlot[str] = ReplySlot()
    scope = anyio.CancelScope()
    answered.bind(scope)
    answered.set("answered")
    answered.abandon()
    assert not scope.cancel_called
    unanswered: ReplySlot[str] = ReplySlot()
    unanswered.bind(scope)
    unanswered.abandon()
    assert scope.cancel_called


async def test_abandon_says_when_the_cancelled_handling_has_ended() -> None:
    # The caller learns when the handling it cancelled is over (what it did
    # until its next checkpoint is done by then), and that a request not
    # taken yet, or answered, has nothing left to end.
    script = Script()
    pool = pool_of(script, workers=1)
    replies: list[str] = []
    settled: list[bool] = []
    async with running(pool):
        held = await pool.post("hold:a", lambda slot: replies.append("late"))
        queued = await pool.post("echo:b", lambda slot: replies.append("b"))
        await script.started_event("hold:a").wait()
        assert not queued.abandon(lambda: settled.append(False))
        cancelled = script.cancelled_event("hold:a")
        ended = anyio.Event()

        def on_settled() -> None:
            settled.append(cancelled.is_set())
            ended.set()

        assert held.abandon(on_settled)
        assert settled == []  # the handler has not seen its cancellation yet
        await ended.wait()
        assert await pool.ask("echo:c") == "c"
    assert settled == [True]
    assert replies == []  # neither on_done was called
    assert script.handled == ["hold:a", "echo:c"]
    assert not held.abandon(lambda: settled.append(False))


# post(): a reply delivered by the worker, with no task waiting for it.


async def test_post_calls_back_with_the_reply_from_the_worker() -> None:
    script = Script()
    pool = pool_of(script, workers=2)
    answered: list[tuple[str, str]] = []
    done = anyio.Event()

    def on_done(slot: ReplySlot[str]) -> None:
        answered.append((slot.result(), script.contexts[-1].run_id or ""))
        done.set()

    async with running(pool):
        slot = await pool.post("echo:hello", on_done, run_id="run-3")
        await done.wait()
    assert answered == [("hello", "run-3")]
    assert slot.done


async def test_post_reports_a_crash_as_an_error_from_the_slot() -> None:
    script = Script()
    pool = pool_of(script, workers=1)
    errors: list[BaseException] = []
    done = anyio.Event()

    on_done = keep_errors(ActorCrashed, errors, done)

    async with running(pool):
        await pool.post("crash:x", on_done)
        await done.wait()
    assert len(errors) == 1
    assert isinstance(errors[0], ActorCrashed)
    assert errors[0].failure.error_type == "ValueError"


async def test_several_posts_at_once_grow_the_pool_and_run_side_by_side() -> None:
    script = Script()
    pool = pool_of(script, workers=4)
    answered: list[str] = []
    all_done = anyio.Event()

    def on_done(slot: ReplySlot[str]) -> None:
        answered.append(slot.result())
        if len(answered) == 4:
            all_done.set()

    async with running(pool):
        await wait_all_tasks_blocked()  # the first worker waits on the mailbox
        for name in "abcd":
            await pool.post(f"hold:{name}", on_done)
        # Each post found no free worker (the first took "a"): four run at once.
        for name in "abcd":
            with anyio.fail_after(5):
                await script.started_event(f"hold:{name}").wait()
        assert pool.statistics().live == 4
        assert pool.statistics().busy == 4
        for name in "dcba":
            script.release(name)
        with anyio.fail_after(5):
            await all_done.wait()
    assert sorted(answered) == ["a", "b", "c", "d"]


async def test_abandoning_a_posted_request_cancels_it_and_drops_the_callback() -> None:
    script = Script()
    pool = pool_of(script, workers=1)
    called: list[ReplySlot[str]] = []

    async with running(pool):
        slot = await pool.post("forever", called.append)
        await script.started_event("forever").wait()
        slot.abandon()
        with anyio.fail_after(5):
            await script.cancelled_event("forever").wait()
        # The worker is free again for the next request.
        assert await pool.ask("echo:next") == "next"
    assert called == []


async def test_a_posted_request_past_its_deadline_is_cancelled_and_calls_back() -> None:
    script = Script()
    pool = pool_of(script, workers=1)
    errors: list[BaseException] = []
    done = anyio.Event()

    on_done = keep_errors(ActorTimeout, errors, done)

    async with running(pool):
        # Long enough for the worker to take the request even on a loaded
        # machine: what is tested is the cancellation of a running handler.
        await pool.post("forever", on_done, deadline=anyio.current_time() + 0.5)
        with anyio.fail_after(5):
            await script.started_event("forever").wait()
            assert not done.is_set()
            await done.wait()
            await script.cancelled_event("forever").wait()
        assert pool.statistics().busy == 0
        assert await pool.ask("echo:next") == "next"
    assert len(errors) == 1


async def test_a_post_whose_deadline_passes_on_a_full_mailbox_calls_back() -> None:
    script = Script()
    pool = pool_of(script, workers=1, mailbox_size=1)
    errors: list[BaseException] = []
    done = anyio.Event()

    on_done = keep_errors(ActorTimeout, errors, done)

    outcomes: dict[str, Outcome] = {}
    async with running(pool) as tg:
        await enqueue(tg, pool, "hold:first", outcomes)
        await script.started_event("hold:first").wait()
        await enqueue(tg, pool, "hold:second", outcomes)  # fills the mailbox
        # No room until "first" is done: the post waits, then its deadline
        # passes; it raises nothing, the callback hears of the timeout.
        slot = await pool.post(
            "echo:late", on_done, deadline=anyio.current_time() + 0.02
        )
        assert slot.done
        assert done.is_set()
        script.release("first")
        script.release("second")
        assert await pool.ask("echo:next") == "next"
    assert len(errors) == 1
    assert "echo:late" not in script.handled


async def test_a_posted_request_answered_in_time_keeps_its_reply() -> None:
    script = Script()
    pool = pool_of(script, workers=1)
    answered: list[str] = []
    done = anyio.Event()

    def on_done(slot: ReplySlot[str]) -> None:
        answered.append(slot.result())
        done.set()

    async with running(pool):
        await pool.post("echo:quick", on_done, deadline=anyio.current_time() + 5)
        with anyio.fail_after(5):
            await done.wait()
        await anyio.sleep(0.01)
    assert answered == ["quick"]


async def test_many_posted_deadlines_rebuild_the_timer_heap_only_now_and_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Posted requests have no waiting caller to count: the heap must still be
    # rebuilt only as it doubles, not on every new deadline (quadratic).
    import replan.actors._runtime as runtime

    rebuilds = 0
    heapify = runtime.heapq.heapify

    def counted(heap: list[object]) -> None:
        nonlocal rebuilds
        rebuilds += 1
        heapify(heap)

    monkeypatch.setattr(runtime.heapq, "heapify", counted)
    script = Script()
    pool = pool_of(script, workers=1, mailbox_size=2_000)
    async with running(pool):
        far = anyio.current_time() + 60
        for n in range(2_000):
            await pool.post(f"hold:{n}", lambda slot: None, deadline=far)
        assert pool.statistics().mailbox_depth >= 1_990
    assert 1 <= rebuilds <= 10


async def test_posting_to_a_stopped_pool_raises_actor_stopped() -> None:
    script = Script()
    pool = pool_of(script, workers=1)
    async with running(pool):
        pool.stop("closed for the test")
        with pytest.raises(ActorStopped, match="closed for the test"):
            await pool.post("echo:x", lambda slot: None)


async def test_a_posted_request_queued_at_a_stop_calls_back_with_stopped() -> None:
    script = Script()
    pool = pool_of(script, workers=1)
    errors: list[BaseException] = []

    def on_done(slot: ReplySlot[str]) -> None:
        try:
            slot.result()
        except ActorStopped as exc:
            errors.append(exc)

    async with running(pool):
        await pool.post("hold:first", lambda slot: None)
        await script.started_event("hold:first").wait()
        assert pool.statistics().live == pool.statistics().workers
        await pool.post("echo:queued", on_done)
        pool.stop("stopping")
        assert len(errors) == 1
    assert "stopping" in str(errors[0])


# Deadlines: one timer per pool, not one per request.


async def test_a_sooner_deadline_wakes_the_pools_timer() -> None:
    script = Script()
    pool = pool_of(script, workers=2)
    outcomes: dict[str, Outcome] = {}

    async def ask(request: str, seconds: float) -> None:
        try:
            outcomes[request] = await pool.ask(
                request, deadline=anyio.current_time() + seconds
            )
        except Exception as exc:
            outcomes[request] = exc

    async with running(pool) as tg:
        tg.start_soon(ask, "hold:late", 30)  # the timer sleeps for 30 s
        await script.started_event("hold:late").wait()
        started = anyio.current_time()
        with anyio.fail_after(5):
            await ask("hold:soon", 0.05)
        waited = anyio.current_time() - started
        script.release("late")
        await wait_all_tasks_blocked()
    assert isinstance(outcomes["hold:soon"], ActorTimeout)
    assert waited < 2
    assert outcomes["hold:late"] == "late"
    assert script.cancelled_event("hold:soon").is_set()


async def test_requests_time_out_each_at_its_own_deadline() -> None:
    script = Script()
    pool = pool_of(script, workers=4)
    order: list[str] = []
    all_timed_out = anyio.Event()

    async def ask(request: str, seconds: float) -> None:
        try:
            await pool.ask(request, deadline=anyio.current_time() + seconds)
        except ActorTimeout:
            order.append(request)
            if len(order) == 3:
                all_timed_out.set()

    async with running(pool) as tg:
        for name, seconds in (("c", 0.15), ("a", 0.05), ("b", 0.10)):
            tg.start_soon(ask, f"forever:{name}", seconds)
        tg.start_soon(ask, "echo:fast", 5)
        with anyio.fail_after(5):
            await all_timed_out.wait()
    assert order == ["forever:a", "forever:b", "forever:c"]
    assert "echo:fast" in script.handled


async def test_answered_requests_do_not_pile_up_in_the_timer() -> None:
    script = Script()
    pool = pool_of(script, workers=2)
    async with running(pool):
        for number in range(500):
            deadline = anyio.current_time() + 60
            assert await pool.ask(f"echo:{number}", deadline=deadline) == str(number)
        # Requests answered long before their deadline leave the heap.
        assert len(pool._deadlines._heap) <= 40


async def test_a_pool_stopped_by_crashes_ends_without_waiting_for_far_deadlines() -> (
    None
):
    script = Script()
    pool = pool_of(script, workers=2, max_restarts=0)
    outcomes: dict[str, Outcome] = {}
    far = anyio.current_time() + 3600

    async def ask(request: str) -> None:
        try:
            outcomes[request] = await pool.ask(request, deadline=far)
        except Exception as exc:
            outcomes[request] = exc

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            tg.start_soon(ask, "hold:slow")
            await script.started_event("hold:slow").wait()
            await ask("crash")  # stops the role; the slow one is still held
            assert pool.stopped
            script.release("slow")
            # Nothing waits any more: run() returns, and the group with it,
            # long before the hour-away deadlines.
    assert isinstance(outcomes["crash"], ActorCrashed)
    assert outcomes["hold:slow"] == "slow"


async def test_a_pool_starts_no_worker_once_its_shutdown_began() -> None:
    """A worker started in a closing group would wait there for work forever
    (or, on trio, the group refuses it with a RuntimeError)."""
    entered = anyio.Event()
    release = anyio.Event()

    class Unhurried:
        async def handle(self, request: str, ctx: ActorContext) -> str:
            entered.set()
            with anyio.CancelScope(shield=True):  # keeps the group open
                await release.wait()
            return request

    pool: ActorPool[str, str] = ActorPool("tester", Unhurried, workers=2)
    replies: list[str] = []

    async def serve_pool(
        *, task_status: anyio.abc.TaskStatus[anyio.CancelScope]
    ) -> None:
        with anyio.CancelScope() as scope:
            task_status.started(scope)
            await pool.run()

    async def ask(request: str) -> None:
        replies.append(await pool.ask(request))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            scope = await tg.start(serve_pool)
            tg.start_soon(ask, "first")
            try:
                await entered.wait()
                scope.cancel()  # the pool's host shuts down, from outside
                await wait_all_tasks_blocked()
                tg.start_soon(ask, "second")  # no worker is free
                await wait_all_tasks_blocked()
                live = pool.statistics().live
            finally:
                release.set()
    assert live == 1
    assert replies == ["first", "second"]  # the busy worker took it after all
    assert pool.statistics().live == 0
