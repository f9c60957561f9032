"""The actor runtime: envelopes, one-shot reply slots, and supervised pools."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup, TaskStatus
from anyio.lowlevel import checkpoint_if_cancelled
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._errors import (
    ActorCrashed,
    ActorError,
    ActorStopped,
    ActorTimeout,
    ModelError,
)
from ..messages import ActorFailure
from ..telemetry import Telemetry, current_carrier, serving

logger = logging.getLogger("replan.actors")

Req = TypeVar("Req", contravariant=True)
Rep = TypeVar("Rep", covariant=True)
ReqT = TypeVar("ReqT")
RepT = TypeVar("RepT")


@dataclass(frozen=True, slots=True)
class ActorContext:
    """What a handler knows about the request beyond its body."""

    role: str
    run_id: str | None
    deadline: float | None
    """Absolute time on the anyio clock (``anyio.current_time()``), or None."""


class Actor(Protocol[Req, Rep]):
    """Anything with one async ``handle``: it owns no run state."""

    async def handle(self, request: Req, ctx: ActorContext) -> Rep: ...


class ReplySlot(Generic[RepT]):
    """A one-shot reply channel: the worker fills it once, the caller waits.

    Cheaper than a memory stream pair per request, and it cannot be left
    unclosed. The caller may abandon it (cancellation, deadline), which
    cancels the worker's handling of the request too. The worker's cancel
    scope outlives the request, so answering unbinds it: a late abandon must
    not cancel the next request.

    A slot made with ``on_done`` has no waiter: the worker calls ``on_done``
    with the slot as soon as it is answered (see :meth:`ActorPool.post`).
    """

    __slots__ = (
        "_done",
        "_error",
        "_event",
        "_handling",
        "_on_done",
        "_on_settled",
        "_scope",
        "_value",
        "abandoned",
    )

    def __init__(
        self,
        new_event: Callable[[], anyio.Event] = anyio.Event,
        on_done: Callable[[ReplySlot[RepT]], None] | None = None,
    ) -> None:
        self._event = new_event() if on_done is None else None
        self._on_done = on_done
        self._done = False
        self._value: RepT | None = None
        self._error: ActorError | None = None
        self._scope: anyio.CancelScope | None = None
        self._handling = False
        self._on_settled: Callable[[], None] | None = None
        self.abandoned = False

    @property
    def done(self) -> bool:
        return self._done

    @property
    def replied(self) -> bool:
        """Answered with a reply, not an error."""
        return self._done and self._error is None

    def set(self, value: RepT) -> None:
        self._scope = None
        if not self._done:
            self._value = value
            self._answered()

    def fail(self, error: ActorError) -> None:
        self._scope = None
        if not self._done:
            self._error = error
            self._answered()

    def _answered(self) -> None:
        self._done = True
        if self._event is not None:
            self._event.set()
        if self._on_done is not None:
            on_done, self._on_done = self._on_done, None
            on_done(self)

    def bind(self, scope: anyio.CancelScope) -> None:
        """Let :meth:`abandon` cancel the worker's handling of the request."""
        self._scope = scope
        self._handling = True
        if self.abandoned:
            scope.cancel()

    def release(self) -> None:
        """The worker's handling of the request has ended, answered or not."""
        self._handling = False
        on_settled, self._on_settled = self._on_settled, None
        if on_settled is not None:
            on_settled()

    def when_settled(self, on_settled: Callable[[], None]) -> bool:
        """Call ``on_settled`` once the worker's handling has ended, if it
        has not: a handling that a deadline or an abandon cancelled goes on
        until its next checkpoint, and a function blocked in a thread
        until it returns. Returns whether it will be called."""
        if not self._handling:
            return False
        self._on_settled = on_settled
        return True

    def abandon(self, on_settled: Callable[[], None] | None = None) -> bool:
        """The caller stopped waiting: cancel the handling if it started.

        Returns whether a handling was under way, that the cancellation
        reaches at its next checkpoint only: if so, ``on_settled`` is called
        once it has ended (what it did meanwhile, a model call answered, is
        done by then). A request not taken yet is skipped when it is.
        """
        self.abandoned = True
        self._on_done = None
        scope = self._scope
        if scope is None or self._done:
            return False
        scope.cancel()
        return on_settled is None or self.when_settled(on_settled)

    def expire(self, error: ActorError) -> None:
        """The request's deadline passed: cancel the handling (or skip it, if
        not started) and answer with ``error``, through ``on_done`` too."""
        self.abandoned = True
        if self._scope is not None:
            self._scope.cancel()  # before answering, which unbinds the scope
        self.fail(error)

    def result(self) -> RepT:
        """The reply of an answered slot, or its error raised."""
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    async def wait(self) -> RepT:
        assert self._event is not None, "a slot with on_done has no waiter"
        await self._event.wait()
        return self.result()


@dataclass(slots=True)
class Envelope(Generic[ReqT, RepT]):
    """A request in a mailbox with everything needed to answer it."""

    request: ReqT
    reply: ReplySlot[RepT]
    run_id: str | None = None
    deadline: float | None = None
    carrier: dict[str, str] = field(default_factory=dict)
    """The sender's W3C trace context."""
    timeout: float | None = None
    """Seconds the handling may take, from when a worker takes the request
    (which sets ``deadline`` then): the wait in the mailbox is not counted."""


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    role: str
    workers: int
    """The most requests the role handles at once (the pool's size)."""
    busy: int
    """Workers handling a request, not counting those whose handlers wait
    for a person (``waiting_for_people``): at most ``workers``."""
    mailbox_depth: int
    """Requests waiting in the mailbox."""
    mailbox_size: int
    restarts: int
    stopped: bool
    stop_reason: str | None
    senders_waiting: int = 0
    """Senders blocked because the mailbox is full (backpressure)."""
    live: int = 0
    """Workers started so far: a pool grows to ``workers`` on demand."""
    waiting_for_people: int = 0
    """Workers whose handlers wait for a person (see
    :func:`waiting_for_a_person`): the pool counts them out of its size."""


_SERVING: ContextVar[ActorPool[Any, Any] | None] = ContextVar(
    "replan_serving_pool", default=None
)
"""The pool whose worker runs the current task, if any."""
_FAILED: ContextVar[BaseException | None] = ContextVar(
    "replan_failed_request", default=None
)
"""The exception a handler marked with :func:`mark_request_failed`."""


def mark_request_failed(exc: Exception) -> None:
    """Mark ``exc``, about to leave a handler, as the failure of the code
    the request ran (a user's task function), not of the actor.

    The caller is answered with :class:`ActorCrashed` as for a crash, with
    the exception's type and message, but the worker goes on serving and no
    crash counts toward the role's restart intensity: a fresh actor would
    run the same code, and a few failing tasks must not stop the role for
    every run. The exception itself leaves the handler unchanged (its span
    records it as it is).
    """
    _FAILED.set(exc)


@contextmanager
def waiting_for_a_person() -> Iterator[None]:
    """Mark a handler's wait for a person: its worker stands aside meanwhile.

    A pool's size bounds the work its role does at once, not how many
    people it waits for: while the handler waits, the pool may start
    another worker in this one's place, so requests queued behind it are
    not held up by someone who answers tomorrow. When the wait ends the
    handler goes on, and the pool retires the first worker that is free
    while it has more than its size. Outside a pool's worker it does
    nothing.
    """
    pool = _SERVING.get()
    if pool is None:
        yield
        return
    pool._stand_aside()
    try:
        yield
    finally:
        pool._step_back_in()


def _waiting(slot: ReplySlot[Any]) -> bool:
    return not slot.done and not slot.abandoned


class _Deadlines:
    """The deadlines of one pool's requests, timed by one task.

    A cancel scope per request would arm a timer per round trip (a timer
    handle on asyncio, a deadline entry on trio); that cost more than the
    rest of a round trip. Here each request with a deadline goes into a heap,
    and one task sleeps until the earliest: a request still unanswered then
    is abandoned (its handling is cancelled) and answered with
    :class:`ActorTimeout`. Answered requests leave the heap lazily; the heap
    is rebuilt when they outnumber the waiting ones.
    """

    def __init__(self, pool: ActorPool[Any, Any]) -> None:
        self._pool = pool
        self._heap: list[tuple[float, int, ReplySlot[Any]]] = []
        self._order = itertools.count()
        self._pending = 0
        """Requests with a deadline whose callers still wait."""
        self._kept = 0
        """Entries the last rebuild of the heap kept."""
        self._timer: anyio.Event | None = None
        """Set to wake the timer task (None: no timer task running)."""
        self._next = math.inf

    def add(
        self, deadline: float, slot: ReplySlot[Any], *, waited: bool = True
    ) -> bool:
        """Time ``slot`` out at ``deadline``; False if no timer can run.

        ``waited``: a caller waits for the slot and calls :meth:`finished`
        when it stops (a posted slot has no waiter; it leaves the heap once
        answered).
        """
        task_group = self._pool._task_group
        if task_group is None:
            return False
        heap = self._heap
        heapq.heappush(heap, (deadline, next(self._order), slot))
        if waited:
            self._pending += 1
        if len(heap) > 2 * max(self._pending, self._kept) + 32:
            # Rebuilt once the heap doubles over what the last rebuild kept
            # (posted slots are not counted in _pending): amortized O(1).
            self._heap = heap = [e for e in heap if _waiting(e[2])]
            heapq.heapify(heap)
            self._kept = len(heap)
        if self._timer is None:
            self._timer = self._pool._new_event()
            task_group.start_soon(self._run)
        elif deadline < self._next:
            self._timer.set()  # sooner than the timer sleeps: wake it
        return True

    def wake(self) -> None:
        """Let the timer task look again (it ends once nothing waits)."""
        if self._timer is not None:
            self._timer.set()

    def finished(self) -> None:
        """A caller added with :meth:`add` stopped waiting."""
        self._pending -= 1
        if self._pending == 0 and self._pool.stop_reason is not None:
            self.wake()  # the last one of a stopped pool: the timer can end

    async def _run(self) -> None:
        pool = self._pool
        try:
            while True:
                now = anyio.current_time()
                heap = self._heap
                while heap and (heap[0][0] <= now or not _waiting(heap[0][2])):
                    deadline, _, slot = heapq.heappop(heap)
                    if deadline <= now and _waiting(slot):
                        slot.expire(
                            ActorTimeout(pool.role, "the request's deadline passed")
                        )
                if not heap or (pool.stop_reason is not None and self._pending == 0):
                    return
                self._next = heap[0][0]
                self._timer = wake = pool._new_event()
                with pool._new_scope(deadline=self._next):
                    await wake.wait()
        finally:
            self._timer = None
            self._next = math.inf


class ActorPool(Generic[ReqT, RepT]):
    """N workers of one role sharing a bounded mailbox, restarted one for one.

    A handler that raises answers its caller with :class:`ActorCrashed` and
    the worker is replaced with a fresh actor from ``factory`` (a
    ``ModelError`` is answered the same way, with its ``model_failure``
    report, and so is an exception marked by :func:`mark_request_failed`,
    but neither is a crash: the worker goes on). Workers start on
    demand: one at first, another whenever a request arrives and no worker
    is free, up to ``workers``, so an idle role costs one task. More than
    ``max_restarts`` crashes within ``restart_period_s`` stop the role: every
    queued and later request gets :class:`ActorStopped` with the reason, as
    does a factory that raises. One timer task per pool times the requests'
    deadlines (see ``_Deadlines``); when a deadline passes, or the caller is
    cancelled, the handler is cancelled too.

    Args:
        role: the role name (``planner``, ``executor``, ...).
        factory: makes a new actor for each worker (re)start.
        workers: how many requests the role handles at once.
        mailbox_size: requests that may wait (at least 1); senders block
            beyond it.
        max_restarts: crashes tolerated within ``restart_period_s``.
        restart_period_s: the sliding window for ``max_restarts``.
        telemetry: where each request's span goes (under the sender's).
    """

    def __init__(
        self,
        role: str,
        factory: Callable[[], Actor[ReqT, RepT]],
        *,
        workers: int = 4,
        mailbox_size: int = 64,
        max_restarts: int = 5,
        restart_period_s: float = 10.0,
        telemetry: Telemetry | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        if mailbox_size < 1:
            # Workers take requests without blocking on the stream, so a
            # zero-size stream (a rendezvous) could strand a sender that
            # blocks just after the only idle worker looked.
            raise ValueError("mailbox_size must be at least 1")
        self.role = role
        self._factory = factory
        self._workers = workers
        self._mailbox_size = mailbox_size
        self._max_restarts = max_restarts
        self._restart_period_s = restart_period_s
        self._telemetry = telemetry
        send: MemoryObjectSendStream[Envelope[ReqT, RepT]]
        receive: MemoryObjectReceiveStream[Envelope[ReqT, RepT]]
        send, receive = anyio.create_memory_object_stream(mailbox_size)
        self._send = send
        self._receive = receive
        self._crashes: deque[float] = deque()
        self._restarts = 0
        self._busy = 0
        self._live = 0
        self._aside = 0
        """Workers whose handlers wait for a person: not counted as live."""
        self._idle: deque[anyio.Event] = deque()
        """One event per worker waiting for work: a sender sets the first.

        Workers take requests with ``receive_nowait`` and wait on these
        instead of the stream's ``receive``, which passes through the event
        loop once before it even looks at the mailbox."""
        self._new_event: Callable[[], anyio.Event] = anyio.Event
        self._new_scope: Callable[..., anyio.CancelScope] = anyio.CancelScope
        self._deadlines = _Deadlines(self)
        self._started = False
        self._task_group: TaskGroup | None = None
        """Where workers start; None once the pool's shutdown has begun."""
        self._closing: anyio.Event | None = None
        """Set by :meth:`stop`: ends :meth:`run`'s wait."""
        self.stop_reason: str | None = None
        self.failed = False
        """The role stopped for its own failure (too many crashes, no actor
        could start), not with the supervisor."""

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def statistics(self) -> PoolStatistics:
        mailbox = self._receive.statistics()
        return PoolStatistics(
            role=self.role,
            workers=self._workers,
            busy=self._busy - self._aside,
            mailbox_depth=mailbox.current_buffer_used,
            mailbox_size=self._mailbox_size,
            restarts=self._restarts,
            stopped=self.stopped,
            stop_reason=self.stop_reason,
            senders_waiting=mailbox.tasks_waiting_send,
            live=self._live,
            waiting_for_people=self._aside,
        )

    async def run(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the workers until :meth:`stop`; for ``task_group.start``."""
        if self._started:
            raise RuntimeError(f"the {self.role} pool was already started")
        self._started = True
        # The running backend's Event class, made directly: anyio.Event()
        # looks the backend up on every call, once per request here.
        self._new_event = type(anyio.Event())
        self._new_scope = type(anyio.CancelScope())
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                self._closing = closing = self._new_event()
                self._grow()
                task_status.started()
                try:
                    if self.stop_reason is None:
                        await closing.wait()  # set by stop()
                finally:
                    # Shutting down (stopped, or cancelled from outside): no
                    # worker or timer may join a group that is closing; it
                    # would wait there for work that never comes.
                    self._task_group = None
        finally:
            self._task_group = None
            self.stop("the supervisor stopped")

    def _grow(self) -> None:
        """Start one more worker, unless the pool is full or shutting down."""
        if self._task_group is None or self.stop_reason is not None:
            return
        if self._live - self._aside < self._workers:
            self._live += 1
            self._task_group.start_soon(self._worker, self._live - 1)

    def _stand_aside(self) -> None:
        """A handler waits for a person: a request queued meanwhile may
        start another worker in its place."""
        self._aside += 1
        if self._receive.statistics().current_buffer_used:
            self._wake_worker()

    def _step_back_in(self) -> None:
        """The wait is over: one worker too many retires once it is free."""
        self._aside -= 1

    def stop(self, reason: str) -> None:
        """Stop taking requests; answer every queued one with ActorStopped."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._send.close()
        while True:
            try:
                envelope = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            envelope.reply.fail(ActorStopped(self.role, self.stop_reason))
        # Closing the receive side wakes senders blocked on a full mailbox;
        # idle workers wake to find it closed.
        self._receive.close()
        while self._idle:
            self._idle.popleft().set()
        self._deadlines.wake()
        if self._closing is not None:
            self._closing.set()

    async def ask(
        self,
        request: ReqT,
        *,
        run_id: str | None = None,
        deadline: float | None = None,
        handle_within_s: float | None = None,
    ) -> RepT:
        """Send ``request`` and wait for the reply.

        ``handle_within_s`` (instead of a ``deadline``) bounds the handling
        alone: it counts from when a worker takes the request, so a request
        that waits its turn behind other callers' is not cut short for it.

        Raises:
            ActorCrashed: the handler raised.
            ActorStopped: the role is stopped, or stopped while waiting.
            ActorTimeout: ``deadline`` passed, or the handling took longer
                than ``handle_within_s``.
        """
        if self.stop_reason is not None:
            raise ActorStopped(self.role, self.stop_reason)
        slot: ReplySlot[RepT] = ReplySlot(self._new_event)
        envelope = Envelope(request, slot, run_id, deadline, current_carrier())
        if handle_within_s is not None:
            if self._task_group is not None:
                # The worker that takes it hands its deadline to the timer.
                envelope.timeout = handle_within_s
                return await self._deliver(envelope)
            deadline = envelope.deadline = anyio.current_time() + handle_within_s
        if deadline is None:
            return await self._deliver(envelope)
        if deadline <= anyio.current_time():
            raise ActorTimeout(self.role, "the request's deadline passed")
        if self._deadlines.add(deadline, slot):
            # The pool's timer answers the slot with ActorTimeout in time.
            try:
                return await self._deliver(envelope)
            finally:
                self._deadlines.finished()
        # Not running (no timer task): a scope of the caller's own.
        with self._new_scope(deadline=deadline):
            return await self._deliver(envelope)
        raise ActorTimeout(self.role, "the request's deadline passed")

    async def post(
        self,
        request: ReqT,
        on_done: Callable[[ReplySlot[RepT]], None],
        *,
        run_id: str | None = None,
        deadline: float | None = None,
        handle_within_s: float | None = None,
    ) -> ReplySlot[RepT]:
        """Send ``request`` without waiting for the reply.

        The worker that answers calls ``on_done`` with the answered slot
        (``slot.result()`` returns the reply or raises the error), so the
        reply reaches its destination without a task waiting for it.
        ``on_done`` runs on the worker's task (or the pool's timer task): it
        must not block or raise. Abandoning the returned slot cancels the
        handling and drops the callback. Waits only while the mailbox is full.

        ``deadline`` (on the anyio clock): past it, the handling is cancelled
        (or the request is not sent, if the mailbox had no room until then)
        and ``on_done`` gets the slot answered with :class:`ActorTimeout`.
        ``handle_within_s`` (instead) bounds the handling alone, counted
        from when a worker takes the request, as in :meth:`ask`.

        Raises:
            ActorStopped: the role is stopped.
        """
        if self.stop_reason is not None:
            raise ActorStopped(self.role, self.stop_reason)
        slot: ReplySlot[RepT] = ReplySlot(on_done=on_done)
        envelope = Envelope(request, slot, run_id, deadline, current_carrier())
        # Timed by the worker that takes it (a running pool has its timer).
        envelope.timeout = handle_within_s
        try:
            if not self._enqueue_nowait(envelope):
                await self._enqueue(envelope)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise ActorStopped(self.role, self.stop_reason or "stopped") from None
        except ActorTimeout as exc:
            # The deadline passed while the mailbox had no room: nothing was
            # sent, and the callback hears of it as of any timeout.
            slot.expire(exc)
            return slot
        if deadline is not None:
            # Timed by the pool's timer task; a pool that has not started
            # has no workers either, and post() is for running pools.
            self._deadlines.add(deadline, slot, waited=False)
        return slot

    def _enqueue_nowait(self, envelope: Envelope[ReqT, RepT]) -> bool:
        """Put ``envelope`` in the mailbox if it has room; False if full.

        The fast path of :meth:`_enqueue`, without a coroutine: a caller
        awaits that only when this returns False.
        """
        try:
            # Skips send()'s extra trip through the event loop.
            self._send.send_nowait(envelope)
        except anyio.WouldBlock:
            return False
        self._wake_worker()
        return True

    async def _enqueue(self, envelope: Envelope[ReqT, RepT]) -> None:
        """Send ``envelope`` to a full mailbox (or one of size 0), waiting for
        room (see :meth:`_enqueue_nowait`)."""
        # A worker that takes a request takes this one from the blocked
        # sender too.
        self._wake_worker()
        if envelope.deadline is None:
            await self._send.send(envelope)
        else:
            # The pool's timer cannot reach a sender blocked here.
            with self._new_scope(deadline=envelope.deadline) as waited:
                await self._send.send(envelope)
            if waited.cancelled_caught:
                raise ActorTimeout(self.role, "the request's deadline passed") from None
        # Wake one now: the request may have gone into the buffer after every
        # worker looked (send() passes through the loop before it tries).
        self._wake_worker()

    def _wake_worker(self) -> None:
        if self._idle:
            self._idle.popleft().set()
        else:
            # Nobody is free: one more worker, if there is room (otherwise
            # the next worker to finish takes the request).
            self._grow()

    async def _deliver(self, envelope: Envelope[ReqT, RepT]) -> RepT:
        slot = envelope.reply
        try:
            # A caller already cancelled, or past its deadline, sends nothing.
            await checkpoint_if_cancelled()
            if not self._enqueue_nowait(envelope):
                await self._enqueue(envelope)
            # Waiting for the reply is the checkpoint.
            return await slot.wait()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise ActorStopped(self.role, self.stop_reason or "stopped") from None
        except BaseException:
            # Cancelled from outside, or by the deadline: the handling must
            # stop too, not run on for nobody.
            if not slot.done:
                slot.abandon()
            raise

    async def _worker(self, index: int) -> None:
        _SERVING.set(self)  # this task's own context: its handlers see it
        try:
            await self._work(index)
        finally:
            self._live -= 1

    async def _work(self, index: int) -> None:
        while self.stop_reason is None:
            try:
                actor = self._factory()
            except Exception as exc:
                # Contain it: a broken factory stops this role, not the
                # supervisor's task group and every other role with it.
                logger.exception("could not start a %s actor", self.role)
                self.failed = True
                self.stop(
                    f"{self.role} could not start an actor: {type(exc).__name__}: {exc}"
                )
                return
            crashed = await self._serve(actor)
            if not crashed or self.stop_reason is not None:
                return
            now = anyio.current_time()
            self._crashes.append(now)
            while self._crashes and self._crashes[0] < now - self._restart_period_s:
                self._crashes.popleft()
            if len(self._crashes) > self._max_restarts:
                self.failed = True
                self.stop(
                    f"{self.role} stopped after {len(self._crashes)} crashes "
                    f"within {self._restart_period_s:g}s"
                )
                logger.error("actor role %s stopped: %s", self.role, self.stop_reason)
                return
            self._restarts += 1
            logger.warning("restarting %s worker %d after a crash", self.role, index)

    async def _serve(self, actor: Actor[ReqT, RepT]) -> bool:
        """Handle requests until the mailbox closes (False) or a crash (True)."""
        while True:
            crashed: bool | None = None
            # One cancel scope serves request after request until a caller
            # abandons its request: entering a scope per request would cost
            # more than the rest of the round trip.
            try:
                with anyio.CancelScope() as scope:
                    crashed = await self._serve_in(scope, actor)
            except Exception:
                # A handler cancelled by its caller whose cleanup raised: on
                # trio the scope takes its cancellation out of the handler's
                # exception group and the error is left. A crash, as on
                # asyncio (the caller got its answer already).
                logger.exception("%s handler crashed while cancelled", self.role)
                return True
            if crashed is not None:
                return crashed

    async def _serve_in(
        self, scope: anyio.CancelScope, actor: Actor[ReqT, RepT]
    ) -> bool | None:
        """Serve inside ``scope`` until it is cancelled (None), or as _serve."""
        receive = self._receive
        role = self.role
        ctx: ActorContext | None = None
        while not scope.cancel_called:
            if self._live - self._aside > self._workers:
                # A handler came back from waiting for a person while
                # another worker served in its place: one retires.
                return False
            envelope: Envelope[ReqT, RepT] | None = None
            try:
                # Take queued work without an extra trip through the event
                # loop; wait (a checkpoint) only when the mailbox is empty.
                envelope = receive.receive_nowait()
            except anyio.WouldBlock:
                pass
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return False
            if envelope is None:
                # Waited for outside the except clause: an idle worker keeps
                # no WouldBlock, traceback and frame alive while it waits.
                work = self._new_event()
                self._idle.append(work)
                try:
                    await work.wait()
                except BaseException:
                    if work.is_set():
                        # Woken for a request, then cancelled: wake another.
                        self._wake_worker()
                    else:
                        self._idle.remove(work)
                    raise
                continue
            slot = envelope.reply
            if slot.abandoned:
                continue
            if envelope.timeout is not None:
                # Timed from now: the wait in the mailbox is not the handling's.
                envelope.deadline = anyio.current_time() + envelope.timeout
                self._deadlines.add(envelope.deadline, slot, waited=False)
            if (
                ctx is None
                or ctx.run_id != envelope.run_id
                or ctx.deadline != envelope.deadline
            ):
                # Frozen: the worker's requests of one run (with no
                # deadline) share one, where building it costs more than
                # the check.
                ctx = ActorContext(role, envelope.run_id, envelope.deadline)
            carrier = envelope.carrier
            self._busy += 1
            # No deadline here: the pool's timer (or the caller, when it is
            # cancelled) cancels this scope through the slot.
            slot.bind(scope)
            try:
                if carrier:
                    value = await self._traced(actor, envelope, ctx)
                else:
                    # Untraced (no span is recording): no context to enter.
                    value = await actor.handle(envelope.request, ctx)
            except ModelError as exc:
                # The model failed, not the actor: answer with the typed
                # report and keep serving (a restart would not help).
                slot.fail(
                    ActorCrashed(
                        ActorFailure(
                            role=role,
                            error_type=type(exc).__name__,
                            message=str(exc),
                            model_failure=exc.failure(),
                        )
                    )
                )
            except Exception as exc:
                failure = ActorCrashed(
                    ActorFailure(
                        role=role,
                        error_type=type(exc).__name__,
                        message=str(exc),
                    )
                )
                if _FAILED.get() is not exc:
                    logger.exception("%s handler crashed", role)
                    slot.fail(failure)
                    return True
                # The request's code failed, not the actor: no restart.
                _FAILED.set(None)
                logger.error("%s request failed", role, exc_info=exc)
                slot.fail(failure)
            except BaseException as exc:
                if not scope.cancel_called and await _stray_cancellation(exc):
                    # asyncio: the handler let out a CancelledError that no
                    # cancellation sent (it awaited a future or a task that
                    # something else cancelled). A crash of the handler like
                    # any other, not a stop of the role.
                    logger.error("%s handler crashed: %r", role, exc)
                    slot.fail(
                        ActorCrashed(
                            ActorFailure(
                                role=role,
                                error_type=type(exc).__name__,
                                message="the handler raised a cancellation "
                                "that nothing had asked for",
                            )
                        )
                    )
                    return True
                # The caller gave up (our scope swallows that cancellation
                # and _serve opens a new one), or the pool is shutting down.
                slot.fail(
                    _caller_gone(role, envelope.deadline)
                    if slot.abandoned
                    else ActorStopped(
                        role, self.stop_reason or "the supervisor stopped"
                    )
                )
                raise
            else:
                slot.set(value)
            finally:
                self._busy -= 1
                slot.release()
        return None

    async def _traced(
        self,
        actor: Actor[ReqT, RepT],
        envelope: Envelope[ReqT, RepT],
        ctx: ActorContext,
    ) -> RepT:
        """Handle a request under its sender's trace context, in a span."""
        with serving(
            self._telemetry, self.role, envelope.request, ctx.run_id, envelope.carrier
        ) as span:
            value = await actor.handle(envelope.request, ctx)
            if span is not None:
                span.replied(value)
            return value


async def _stray_cancellation(exc: BaseException) -> bool:
    """Is ``exc`` a cancellation exception no cancel scope around us sent?

    Only asyncio code can raise one (``asyncio.CancelledError`` is an
    ordinary exception to construct; ``trio.Cancelled`` is not). A real
    cancellation is level-triggered: the next checkpoint raises it again.
    """
    cancelled = anyio.get_cancelled_exc_class()
    if not isinstance(exc, cancelled):
        return False
    try:
        await anyio.lowlevel.checkpoint_if_cancelled()
    except cancelled:
        return False
    return True


def _caller_gone(role: str, deadline: float | None) -> ActorError:
    """The error left in a slot whose caller stopped waiting (never read)."""
    if deadline is not None and anyio.current_time() >= deadline:
        return ActorTimeout(role, "the request's deadline passed")
    return ActorStopped(role, "the caller stopped waiting")
