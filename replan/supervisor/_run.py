"""One run's driver: plan, execute, review at milestones, finish.

The driver is the only writer of its run. Every change is an event that is
appended to the journal before the new state is installed; the decisions it
acts on are the pure functions of ``_decide``; the replan flow lives in
``_replanning``.
"""

from __future__ import annotations

import logging
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, nullcontext, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Literal, TypeVar, cast

import anyio
from anyio import CancelScope
from anyio.abc import TaskGroup
from anyio.lowlevel import checkpoint_if_cancelled
from pydantic_core import PydanticSerializationError

from .._errors import (
    ActorCrashed,
    ActorError,
    ActorStopped,
    ActorTimeout,
    ConfigurationError,
    LeaseLost,
    ModelOutputError,
    ModelRefusal,
)
from ..actors import ActorPool, ReplySlot
from ..messages import (
    EXECUTOR_CRASHED,
    ActorFailure,
    Event,
    ExecuteReply,
    ExecuteRequest,
    ExploreErrorRecorded,
    GateOpened,
    GateRequest,
    GateResolution,
    GateResolved,
    ModelCall,
    ModelCallFailed,
    ModelFailure,
    PlanCreated,
    PlanReply,
    PlanRequest,
    PlanVersion,
    RetryScheduled,
    RunFinished,
    RunStatus,
    Synthesis,
    SynthesizeReply,
    SynthesizeRequest,
    Task,
    TaskDraft,
    TaskFinished,
    TaskOutcome,
    TaskStarted,
    TaskStatus,
    TokenUsage,
    ToolCall,
    UsageRecorded,
)
from ..messages._base import built
from ..messages._events import built_event
from ..messages._spec import MAX_RETRY_BACKOFF_S
from ..store import EffectLedger, EffectRecord, RunSummary, Store
from ..telemetry import RunTrace, Telemetry, actor_span_suspended
from ._budget import REQUEST_KEY, RunMeter
from ._decide import (
    ReadyWalk,
    budget_spent,
    iter_ready,
    milestone_due,
    phase_done,
    phase_gate,
)
from ._gates import GateRegistry, Validator
from ._handle import RunRecord
from ._roles import Roles, expect
from ._state import RunState, apply
from ._versions import build_version

logger = logging.getLogger("replan.supervisor")

Req = TypeVar("Req")
Rep = TypeVar("Rep")
_T = TypeVar("_T")


ANSWER_FAILURES = frozenset({ModelOutputError.__name__, ModelRefusal.__name__})
"""Model failures of one answer (malformed even after the re-ask, refused):
a plan run goes on without it where it can. Any other failure that is neither
transient nor fatal (a bad request, an unknown model, an adapter's answer of
the wrong type) would fail every call alike: it ends the run."""

APPROVAL_TAKEN_WAIT_S = 5.0
"""How long a run waiting only for approvals lets the gate actor take them
before it suspends its trace."""

SETTLE_S = 1.0
"""How long a run's end (or stop) waits for the model calls it cancels to
end: one that answered by then is in the run's usage."""


class RunEnded(Exception):
    """Raised inside a driver to end the run with a status and a reason."""

    def __init__(self, status: RunStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Unanswered(RunEnded):
    """A role gave no usable answer to one request, and no retry is left.

    Its model's answer failed for good (malformed even after its one
    re-ask, or refused: :data:`ANSWER_FAILURES`), or the role crashed or
    passed ``call_timeout_s`` on every attempt. A plan run goes on without
    the answer where it can (a milestone review continues, a replan is
    refused); where it cannot (the first plan, the boundary, the synthesis)
    the run ends ``failed``.
    """


class RoleFailed(Unanswered):
    """A role crashed or passed ``call_timeout_s`` on every attempt of one
    request (explore runs go on); ``transient``: the last attempt was a
    transient model failure or timed out."""

    def __init__(
        self, status: RunStatus, reason: str, *, transient: bool = False
    ) -> None:
        super().__init__(status, reason)
        self.transient = transient


class Unjournalable(RunEnded):
    """What the run would journal cannot be stored: the run ends ``failed``."""


@dataclass(frozen=True, slots=True)
class _Done:
    task_id: str
    outcome: TaskOutcome
    calls: list[ModelCall]
    failures: Sequence[ModelFailure] = ()
    attempt: int = 0
    unsecured: bool = False
    """Not in the effect ledger: the driver journals it before it waits on
    anything else, or puts it in the ledger first (see ``_secure``)."""
    timed_out: bool = False
    """The attempt passed ``task_timeout_s`` and was cut short."""
    retry_at: datetime | None = None
    """When a retry may start, as a transient failure asked (a server's
    ``Retry-After``, counted from the failure; kept in the effect ledger
    too); None: no wait was asked."""
    lingering: bool = False
    """Timed out, its handling has not ended yet (a task function blocked
    in a thread): it keeps its place in ``max_concurrency`` until
    :class:`_Settled` says it has."""


@dataclass(frozen=True, slots=True)
class _Fatal:
    """A model failure no retry can fix (bad credentials, spent budget)."""

    failure: ModelFailure


@dataclass(frozen=True, slots=True)
class _RoleStopped:
    error: ActorStopped


@dataclass(frozen=True, slots=True)
class _Answered:
    request: GateRequest
    resolution: GateResolution


@dataclass(frozen=True, slots=True)
class _Ended:
    """A task other than the driver (an approval's) found the run must end."""

    end: RunEnded


@dataclass(frozen=True, slots=True)
class _ToolGate:
    """An attempt's tool call began or ended waiting at a gate with no
    timeout: the driver looks again whether anything but people can move
    the run on."""


@dataclass(frozen=True, slots=True)
class _Settled:
    """A timed-out attempt's handling has ended: its place is free."""


_SETTLED = _Settled()

_Report = _Done | _Answered | _RoleStopped | _Fatal | _Ended | _ToolGate | _Settled
"""What reaches the driver's inbox."""


class _JournalLock:
    """A mutex for a driver's journal appends.

    Nearly always free: taking a free one is a flag, with no trip through
    the event loop and no task lookup. When it is held, waiters queue and
    the holder hands it to the first of them on release.
    """

    __slots__ = ("_held", "_waiters")

    def __init__(self) -> None:
        self._held = False
        self._waiters: deque[anyio.Event] = deque()

    def try_acquire(self) -> bool:
        """Take the lock if it is free (the driver's way: no coroutine)."""
        if self._held:
            return False
        self._held = True
        return True

    async def __aenter__(self) -> None:
        await self.acquire()

    async def acquire(self) -> None:
        if not self._held:
            self._held = True
            return
        handed = anyio.Event()
        self._waiters.append(handed)
        try:
            await handed.wait()
        except BaseException:
            if handed.is_set():
                self._release()  # handed over while cancelled: pass it on
            else:
                self._waiters.remove(handed)
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._release()

    def release(self) -> None:
        self._release()

    def _release(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()  # still held: now by that waiter
        else:
            self._held = False


class _Inbox:
    """The driver's inbox: reports from executions and approvals.

    One reader (the driver), any number of writers, none of which ever
    waits: an execution's report is put here by the executor worker that
    answers it. Bounded by construction: at most one report per execution
    in flight (``max_concurrency``) and per approval awaited.
    """

    __slots__ = ("_closed", "_items", "_new_event", "_waiter")

    def __init__(self) -> None:
        self._items: deque[_Report] = deque()
        self._waiter: anyio.Event | None = None
        self._new_event: Callable[[], anyio.Event] = anyio.Event
        self._closed = False

    def put(self, item: _Report) -> None:
        if self._closed:
            return  # the run is over; its driver secured what it held
        self._items.append(item)
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.set()

    async def take(self) -> list[_Report]:
        """Every report in, waiting for the first if there is none."""
        while not self._items:
            if self._new_event is anyio.Event:
                # The running backend's Event class: anyio.Event() looks the
                # backend up on every call.
                self._new_event = type(anyio.Event())
            self._waiter = self._new_event()
            await self._waiter.wait()
        return self.take_nowait()

    def take_nowait(self) -> list[_Report]:
        items = list(self._items)
        self._items.clear()
        return items

    def close(self) -> None:
        self._closed = True


def approval_check(resolution: GateResolution) -> None:
    """An approval gate takes approve or reject."""
    if resolution.decision == "edit":
        raise ValueError("an approval gate takes approve or reject, not edit")


def summary_of(state: RunState, last: RunSummary | None = None) -> RunSummary:
    """The run's row; from ``last`` (the previous one) when only its seq and
    time moved, as on nearly every append."""
    if (
        last is not None
        and last.status is state.status
        and last.stop_reason == state.stop_reason
        and last.run_id == state.run_id
    ):
        return last.evolve(updated_at=state.updated_at, last_seq=state.seq)
    return RunSummary(
        run_id=state.run_id,
        goal=state.spec.goal,
        kind=state.spec.kind,
        pattern=state.spec.pattern,
        status=state.status,
        created_at=state.created_at,
        updated_at=state.updated_at,
        last_seq=state.seq,
        stop_reason=state.stop_reason,
    )


def failure_events(
    failure: ModelFailure, *, with_usage: bool
) -> list[tuple[type[Event], dict[str, Any]]]:
    """Journal a failed model call: its usage (unless reported elsewhere) and
    the failure with its raw text. A spent budget made no call: no failure."""
    events: list[tuple[type[Event], dict[str, Any]]] = []
    usage = failure.usage
    if with_usage and (usage.calls or usage.total_tokens):
        events.append(
            (
                UsageRecorded,
                {"role": failure.role, "purpose": failure.purpose, "usage": usage},
            )
        )
    if failure.error_type != "BudgetExhausted":
        events.append((ModelCallFailed, {"failure": failure}))
    return events


def finish_events(item: _Done) -> list[tuple[type[Event], dict[str, Any]]]:
    """What journals one finished attempt: its ``task_finished`` and usage."""
    fields: dict[str, Any] = {"task_id": item.task_id, "outcome": item.outcome}
    usage = execution_usage(item.calls)
    if usage is not None:
        fields["usage"] = usage
    return [
        (TaskFinished, fields),
        *(usage_events(item.calls) if usage is None else ()),
        *(
            event
            for failure in item.failures
            for event in failure_events(failure, with_usage=False)
        ),
    ]


_PURPOSES = {
    "review_request": "milestone",
    "critique_request": "critique",
    "alignment_request": "alignment",
    "rank_request": "compare",
    "evolve_request": "evolve",
    "synthesize_request": "synthesize",
}


def purpose_of(request: object) -> str:
    """The model purpose a role's request asks for (see DESIGN §5)."""
    purpose = getattr(request, "purpose", None)
    if isinstance(purpose, str):
        return purpose  # a plan's, an explore call's
    return _PURPOSES.get(getattr(request, "kind", ""), "")


def failure_ending(failure: ModelFailure) -> RunEnded:
    """How a model failure that cannot be retried ends the run.

    One of :data:`ANSWER_FAILURES` is :class:`Unanswered`: a plan run goes
    on without the answer where it can.
    """
    if failure.error_type == "BudgetExhausted":
        return RunEnded(RunStatus.LIMIT_REACHED, failure.message)
    if failure.fatal:
        return RunEnded(RunStatus.FAILED, failure.message)
    reason = (
        f"the {failure.role} could not answer ({failure.error_type}): {failure.message}"
    )
    if failure.error_type in ANSWER_FAILURES:
        return Unanswered(RunStatus.FAILED, reason)
    return RunEnded(RunStatus.FAILED, reason)


def execution_usage(calls: Sequence[ModelCall]) -> TokenUsage | None:
    """The tokens of an attempt's calls, when all are the executor's own
    (journaled in its ``task_finished``); None otherwise or without calls."""
    usage: TokenUsage | None = None
    for call in calls:
        if call.role != "executor" or call.purpose != "execute":
            return None
        usage = call.usage if usage is None else usage + call.usage
    return usage


def _asked_wait(failures: Sequence[ModelFailure]) -> float | None:
    """The longest wait transient ``failures`` asked for (``Retry-After``)."""
    waits = [f.retry_after_s for f in failures if f.retry_after_s is not None]
    return max(waits) if waits else None


def usage_events(
    calls: Sequence[ModelCall],
) -> list[tuple[type[Event], dict[str, Any]]]:
    """One ``usage_recorded`` per role and purpose among ``calls``."""
    totals: dict[tuple[str, str], Any] = {}
    for call in calls:
        key = (call.role, call.purpose)
        totals[key] = totals[key] + call.usage if key in totals else call.usage
    return [
        (UsageRecorded, {"role": role, "purpose": purpose, "usage": usage})
        for (role, purpose), usage in totals.items()
    ]


def _effect_ledger(store: Store) -> EffectLedger | None:
    """``store`` if it keeps finished attempts apart from the journal.

    Asked once per run: ``issubclass`` on the store's class first, which
    ``ABCMeta`` caches, where ``isinstance`` against a runtime protocol
    walks the protocol's members on every call (~10 us).
    """
    if issubclass(type(store), EffectLedger):
        return cast(EffectLedger, store)
    return store if isinstance(store, EffectLedger) else None


class RunDriver:
    """Runs one plan run to its end under the supervisor's task group."""

    def __init__(
        self,
        record: RunRecord,
        roles: Roles,
        store: Store,
        gates: GateRegistry,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.record = record
        self.telemetry = telemetry or Telemetry()
        self.roles = roles
        self.store = store
        self.gates = gates
        self.limits = record.state.spec.limits
        self.meter = RunMeter(
            self.limits.token_budget, record.state.usage.total.total_tokens
        )
        """Tokens used as responses arrive (the model wrapper checks it)."""
        self._gate_seq = len(record.state.gates)
        self._requests = 0
        """Requests timed by ``call_timeout_s`` so far (their meter keys)."""
        self._in_flight = 0
        self._tool_gates: dict[str, str] = {}
        """Tool calls' gates with no timeout that attempts in flight wait at:
        gate id -> task id. Each change wakes the driver (``_ToolGate``)."""
        self._awaiting_approval: set[str] = set()
        self._cancel_requested = False
        self._stopping_with_supervisor = False
        """A role the run asked stopped with the supervisor, not for its own
        failure: the run is let go of unfinished, as at any shutdown."""
        self.cancel_at_start = False
        """Cancelled before it is driven on (a cancel that waited for the run
        while nobody drove it): nothing of its work starts again."""
        self._staged: list[Event] = []
        self._journal_lock = _JournalLock()
        self._summary: RunSummary | None = None
        self._staged_state: RunState | None = None
        self._cancel_scope = anyio.CancelScope()
        self._inbox = _Inbox()
        self._posted: dict[ReplySlot[Any], Task] = {}
        """Executions sent to the executor pool and not answered yet."""
        self._tg: TaskGroup | None = None
        self._children = 0
        """Tasks started in the driver's group that have not ended (approvals'
        waits, reports being secured): the group is cancelled at the end of
        the run only while there are any, which spares a run without them a
        cancellation's trip through the driver."""
        self.trace = RunTrace(
            self.telemetry,
            record.state,
            self.record_events,
            (RunEnded,),
            stage=self.stage,
        )
        self.effects = _effect_ledger(store)
        """Where finished attempts are kept until journaled (see ``_resume``)."""
        self.recovery: Callable[[RunDriver, TaskGroup], Awaitable[None]] | None = None
        """Set on a resumed run: picks up what the journal left unfinished."""
        self.unpicked: Sequence[EffectRecord] = ()
        """Set on a resumed run: the attempts the ledger holds as finished,
        until its recovery takes them up (see ``_resume``)."""
        self._draining = False
        self._collecting = False
        """The driver waits for task reports (and journals them on arrival)."""
        self._unjournaled: list[_Report] = []
        """Taken reports outside the ledger whose finish is only staged."""
        self._held: list[_Report] = []
        """Reports of the batch being taken that are not taken yet (a review
        one of them led to may end the run first)."""
        self._busy = 0
        self._parked = 0
        """Busy attempts waiting at their tool call's journaled gate for a
        person (see :meth:`_parked_at_gate`)."""
        self._idle = anyio.Event()
        self._unrecorded = 0
        """Answers taken from a role and not yet journaled: busy until the
        next append journals them (a drain lets the run get there)."""
        self._ready = ReadyWalk()
        """The run's ready tasks, walked from past the tasks that ended."""
        self._due: list[str] = []
        """Tasks whose finish reached a milestone while the run waited at a
        gate: reviewed once it is answered."""
        self._retry_wake: float | None = None
        """When (``anyio.current_time()``) the first ready task that waits
        for its retry time may start, as the last dispatch found it."""

    @property
    def state(self) -> RunState:
        return self.record.state

    def request_cancel(self) -> None:
        self._cancel_requested = True
        self._cancel_scope.cancel()

    # Draining -----------------------------------------------------------------

    def drain(self) -> None:
        """Start no model call or task from now on; let those in flight end."""
        self._draining = True
        self._idle_if_drained()

    async def wait_idle(self) -> None:
        """Return once draining and nothing is in flight but attempts that
        wait for a person at a journaled gate."""
        await self._idle.wait()

    def _idle_if_drained(self) -> None:
        # A run cancelled is not idle until its end is journaled (see run()):
        # its calls, cancelled, leave it idle before it gets there.
        if self._draining and self._busy <= self._parked and not self._cancel_requested:
            self._idle.set()

    @contextmanager
    def _parked_at_gate(self) -> Iterator[None]:
        """An attempt waits for a person at its tool call's gate, journaled.

        A drain does not wait for it: a person's answer may come tomorrow,
        and nothing is lost by stopping. The resumed run asks again (the
        call had not run), or takes the answer if it was journaled.
        """
        self._parked += 1
        self._idle_if_drained()
        try:
            yield
        finally:
            self._parked -= 1

    async def _hold_if_draining(self) -> None:
        # Held until the supervisor stops; the run resumes from the journal.
        if self._draining:
            if not any(isinstance(e, ExploreErrorRecorded) for e in self._staged):
                # What it took since its last append is journaled, as the
                # dispatch journals it when draining: the resumed run asks
                # again for an answer it threw away (a revision before its
                # drift check), and the tokens of both are the run's. An
                # explore step's errors wait for their step (see _explore).
                await self.record_events()
            # What it took cannot reach the journal now: it keeps the drain
            # waiting no more.
            self._recorded()
            await anyio.sleep_forever()

    def _begin(self) -> None:
        self._busy += 1

    def _end(self, count: int = 1) -> None:
        self._busy -= count
        self._idle_if_drained()

    def _recorded(self) -> None:
        """The answers taken since the last append are journaled (or never
        will be before the stop)."""
        if self._unrecorded:
            count, self._unrecorded = self._unrecorded, 0
            self._end(count)

    # Journal ----------------------------------------------------------------

    def stage(self, *specs: tuple[type[Event], dict[str, Any]]) -> RunState:
        """Build events on top of what is staged, without journaling them yet.

        Nothing acts on a staged state until :meth:`record_events` has put its
        events in the journal; staging lets a task's finish and the next
        task's start share one append (one commit) on the hot path.
        """
        state = self._staged_state or self.state
        now = datetime.now(UTC)
        for cls, fields in specs:
            event = built_event(cls, state.seq + 1, now, fields)
            state = apply(state, event)
            self._staged.append(event)
        self._staged_state = state
        return state

    @property
    def view(self) -> RunState:
        """The state including staged events (for deciding what to stage next)."""
        return self._staged_state or self.state

    async def record_events(
        self,
        *specs: tuple[type[Event], dict[str, Any]],
        before_install: Callable[[], None] | None = None,
        unless_cancelled: bool = False,
        lock_held: bool = False,
    ) -> RunState:
        """Append staged and new events to the journal, then install the state.

        Serialized by a lock: approval answers are journaled by their own
        tasks while the driver may be waiting elsewhere (at a replan gate).

        ``unless_cancelled``: raise the cancellation instead, should the
        caller's task be cancelled by the time it holds the lock (taking the
        lock is no cancellation point when the lock is free or handed over).

        ``lock_held``: the caller holds the lock (see :meth:`appends_held`).
        """
        # Not ``async with``: its two coroutines cost more than taking a free
        # lock, and an append comes after nearly every report.
        lock = self._journal_lock
        if not lock_held and not lock.try_acquire():
            await lock.acquire()
        try:
            if unless_cancelled:
                # Switches to no other task when not cancelled: nothing can
                # change between this check and the append below.
                await checkpoint_if_cancelled()
            if self.state.status.final:
                # Journaled its end already: a late caller (a tool call's
                # approval on an executor worker not yet cancelled) must not
                # append after run_finished, which would revive the run.
                self._staged, self._staged_state = [], None
                raise RunEnded(self.state.status, "the run has ended")
            state = self.stage(*specs)
            events, self._staged = self._staged, []
            if events:
                summary = summary_of(state, self._summary)
                try:
                    await self.store.append(state.run_id, events, summary)
                except (PydanticSerializationError, UnicodeError) as exc:
                    raise self._unstorable(exc) from None
                self._summary = summary
                self._unjournaled.clear()
                if before_install is not None:
                    before_install()
                self.record.install(state, events)
                self.trace.on_events(events, state)
                self._recorded()
            if self._staged_state is state:
                self._staged_state = None
            return state
        finally:
            if not lock_held:
                lock.release()

    @asynccontextmanager
    async def appends_held(self) -> AsyncIterator[None]:
        """Hold the journal lock: no other append (an approval's answer,
        journaled by its own task) changes the run's state until the caller,
        which appends with ``record_events(..., lock_held=True)``, is done.
        Once it holds the lock, no append is under way either."""
        lock = self._journal_lock
        if not lock.try_acquire():
            await lock.acquire()
        try:
            yield
        finally:
            lock.release()

    async def _journal_unreported(
        self, lost: list[tuple[type[Event], dict[str, Any]]]
    ) -> None:
        try:
            await self.record_events(*lost)
        except LeaseLost:
            # Another supervisor drives the run: the usage is its no more.
            logger.debug("run %s: let go of", self.state.run_id, exc_info=True)
        except Exception:
            # The store may be failing too: the run stops all the same.
            logger.exception(
                "run %s: the usage of answers cut short was not journaled",
                self.state.run_id,
            )

    def _unstorable(self, exc: Exception) -> Unjournalable:
        """End the run when what it would journal cannot be stored.

        A string no journal can hold (a lone UTF-16 surrogate in a task's
        result, say) fails the run, with what it journaled so far; a store
        writes nothing of an append it cannot serialize, so the events built
        meanwhile are dropped and the run's end follows the journal.

        The append may be another task's (an approval's answer carries the
        driver's staged events with it): that task hands the ending to the
        driver through the inbox (see :class:`_Ended`).
        """
        self._staged_state = None
        self._unjournaled.clear()
        problem = " ".join(str(exc).split())
        return Unjournalable(
            RunStatus.FAILED, f"an event could not be journaled: {problem}"
        )

    # Asking actors ------------------------------------------------------------

    async def ask(
        self, pool: ActorPool[Req, Any], request: Req, reply_type: type[Rep]
    ) -> Rep:
        """Ask a model-backed role for a ``reply_type`` answer.

        Crashes and timeouts (``call_timeout_s``) are retried up to
        ``max_task_attempts``; a malformed answer was asked once more by
        the role already (see ``actors._calls.answer``).

        Raises:
            Unanswered: the model's answer failed for good (one of
                :data:`ANSWER_FAILURES`), or the last attempt failed
                (:class:`RoleFailed`); the failure's events are staged.
            RunEnded: the role stopped, or the model failure ends the run
                (bad credentials, a bad request, a spent budget).
        """
        attempts = self.limits.max_task_attempts
        timeout = self.limits.call_timeout_s
        timed_out = 0
        key = ""
        wait: float | None = None
        for attempt in range(1, attempts + 1):
            await self._hold_if_draining()
            if wait:
                # The server asked to wait (Retry-After): asked sooner, it
                # would refuse again, or the model would not even send.
                await anyio.sleep(wait)
                await self._hold_if_draining()
                wait = None
            self.check_budget()
            budget = self.limits.token_budget
            if budget is not None and hasattr(request, "token_allowance"):
                left = budget - self.view.usage.total.total_tokens
                request = request.model_copy(update={"token_allowance": left})  # type: ignore[attr-defined]
            # Every request is metered, not only a timed one: a request cut
            # short before its reply (a stop, the run's end) still has its
            # answered calls counted for the run.
            request, key = self._timed(request)
            self._begin()
            answered = False
            reported = False  # a reply or a failure says what its calls used
            try:
                reply = expect(
                    # Timed from when a worker takes it: a request that waits
                    # for a busy role (other runs' requests first) is not cut
                    # short for the wait.
                    await pool.ask(
                        request, run_id=self.state.run_id, handle_within_s=timeout
                    ),
                    reply_type,
                )
                # Staged, not committed: the budget checks read the staged view,
                # and the flow's next append journals it with its outcome.
                # A reply's fields are in its __dict__; getattr() on a model
                # that lacks the field costs a raised AttributeError.
                fields = reply.__dict__
                calls: list[ModelCall] | None = fields.get("calls")
                if calls:
                    self.stage(*usage_events(calls))
                answered = reported = True
                if fields.get("cut_short", False):
                    self.check_budget()
                return reply
            except ActorStopped as exc:
                raise self._role_stopped(exc) from None
            except (ActorCrashed, ActorTimeout) as exc:
                failure = (
                    exc.failure.model_failure
                    if isinstance(exc, ActorCrashed)
                    else self._cut_short(pool.role, request, key)
                )
                if failure is not None:
                    reported = True
                    self.stage(*failure_events(failure, with_usage=True))
                    if failure.fatal or not failure.transient:
                        raise failure_ending(failure) from None
                    wait = failure.retry_after_s
                timed_out += isinstance(exc, ActorTimeout)
                if attempt == attempts:
                    raise RoleFailed(
                        RunStatus.FAILED,
                        f"call_timeout_s: the {pool.role} gave no answer within "
                        f"{timeout:g}s, {attempts} time(s)"
                        if timed_out == attempts
                        else f"{pool.role} failed {attempts} time(s); last: "
                        + (
                            failure.message
                            if isinstance(exc, ActorTimeout) and failure is not None
                            else str(exc)
                        ),
                        transient=failure is not None or isinstance(exc, ActorTimeout),
                    ) from None
            finally:
                spent = self.meter.take_request(key)  # none left behind
                if not reported and (spent.calls or spent.total_tokens):
                    # Cut short before its reply (the supervisor stops, the
                    # run ends, the role stopped or crashed): the answers it
                    # had are the run's, journaled as it stops or ends.
                    self.meter.hold(pool.role, purpose_of(request), spent)
                if answered:
                    # Busy until journaled: a drain waits for the append.
                    self._unrecorded += 1
                else:
                    self._end()
        raise AssertionError("unreachable")

    def _timed(self, request: Req) -> tuple[Req, str]:
        """``request`` marked for the run's meter, which counts what its
        calls spend: a request cut short has no reply to say it."""
        self._requests += 1
        key = f"{self.state.run_id}-r{self._requests}"
        self.meter.watch(key)
        context = {**request.context, REQUEST_KEY: key}  # type: ignore[attr-defined]
        return request.model_copy(update={"context": context}), key  # type: ignore[attr-defined]

    def _cut_short(self, role: str, request: object, key: str) -> ModelFailure:
        """The failure a request cut short by ``call_timeout_s`` journals,
        with what its model calls used until then."""
        timeout = self.limits.call_timeout_s
        return ModelFailure(
            role=role,
            purpose=purpose_of(request),
            error_type="ActorTimeout",
            message=f"call_timeout_s: no answer within {timeout:g}s",
            transient=True,
            usage=self.meter.take_request(key),
        )

    def check_budget(self) -> None:
        reason = budget_spent(self.view) or self.meter.spent_reason()
        if reason is not None:
            raise RunEnded(RunStatus.LIMIT_REACHED, reason)

    def base_context(self) -> dict[str, Any]:
        spec = self.state.spec
        return {"goal": spec.goal, "metadata": spec.metadata, "context": spec.context}

    def completed_context(self) -> list[Task]:
        state = self.state
        return [state.tasks[t] for t in state.completion_order]

    # Gates --------------------------------------------------------------------

    def next_gate_id(self) -> str:
        # A counter, not the journal's gate count: tool approvals open gates
        # from executor tasks while the driver may be opening one too.
        self._gate_seq = max(self._gate_seq, len(self.state.gates)) + 1
        return f"{self.state.run_id}-g{self._gate_seq}"

    def gate_request(self, reason: str, **fields: Any) -> GateRequest:
        now = datetime.now(UTC)
        timeout = self.limits.gate_timeout_s
        return GateRequest(
            gate_id=self.next_gate_id(),
            run_id=self.state.run_id,
            reason=reason,
            created_at=now,
            expires_at=now + timedelta(seconds=timeout) if timeout else None,
            on_timeout=self.state.spec.gate_policy.on_timeout,
            **fields,
        )

    async def open_gate(self, request: GateRequest, validate: Validator | None) -> None:
        # Listed in the registry once gate_opened is journaled (a gate a
        # person can see survives a crash) and before the state that shows it
        # is installed (whoever reacts to the event can resolve it at once).
        # A tool call's gate is opened by the attempt's executor worker: an
        # attempt cut short meanwhile (task_timeout_s) must not open it after
        # its end is journaled.
        await self.record_events(
            (GateOpened, {"request": request}),
            before_install=lambda: self.gates.open(request, validate),
            unless_cancelled=request.tool_call is not None,
        )

    async def await_gate(
        self, request: GateRequest, validate: Validator | None, *, reopen: bool = False
    ) -> GateResolution:
        """Open a gate, wait for its answer, and journal it (the run waits).

        ``reopen``: the gate is already in the journal (a resumed run); it is
        only listed again, unless the resume listed it already.
        """
        if reopen:
            if self.gates.get(request.gate_id) is None:
                self.gates.open(request, validate)
        else:
            await self.open_gate(request, validate)
        # A tool call's gate is awaited by a busy attempt (an executor
        # worker); the run's own gates keep nothing busy.
        parked = self._parked_at_gate() if request.tool_call else nullcontext()
        try:
            async with self.trace.waiting(request):
                with parked:
                    resolution = await (
                        self._ask_gate(request)
                        if request.tool_call or self.state.spec.kind == "explore"
                        else self._ask_gate_folding(request)
                    )
            await self.resolve_gate(request, resolution)
        finally:
            self.gates.close(
                request.gate_id, "the run ended before the gate was resolved"
            )
        if request.tool_call is not None and self._draining:
            # Answered (a timeout's default, say) as the run drains: the
            # call starts no more now; its journaled answer stands when
            # the run resumes.
            with self._parked_at_gate():
                await anyio.sleep_forever()
        return resolution

    async def _ask_gate_folding(self, request: GateRequest) -> GateResolution:
        """Wait for the answer to a gate of the run's own (a replan's, a
        validation gate), journaling meanwhile the attempts that finish.

        Nothing starts while the run waits: the answer may change the plan.
        What finishes is journaled and folded at once, so that the run's
        state and events show it while a person takes their time; a
        milestone it reaches is reviewed once the gate is answered. A
        report that ends the run (a spent budget, a role that stopped) ends
        it now, closing the gate.
        """
        resolution: GateResolution | None = None
        errors: list[Exception] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._fold_reports, errors, tg.cancel_scope)
            try:
                resolution = await self._ask_gate(request)
            except Exception as exc:
                # Raised below, as it is: a task group would wrap it in an
                # exception group that no caller of the driver looks into.
                errors.append(exc)
            finally:
                tg.cancel_scope.cancel()
        if errors:
            raise errors[0]
        assert resolution is not None
        return resolution

    async def _fold_reports(self, errors: list[Exception], scope: CancelScope) -> None:
        """Journal the reports that come while the driver waits at a gate;
        what ends the run (a report, a failing journal) ends the wait."""
        try:
            while True:
                # The reports of the batch a review came from come first
                # (the driver's loop holds this same list).
                held = self._held
                if not held:
                    held.extend(await self._inbox.take())
                # Not cut short halfway by the answer: a staged event that
                # misses the journal would leave the next append a seq ahead.
                with anyio.CancelScope(shield=True):
                    while held:
                        # Taken one by one from the held list: those after
                        # a report that ends the run stay there, and are
                        # journaled with its end.
                        await self._take(held.pop(0), due=self._due)
                    await self.record_events()
        except Exception as exc:
            errors.append(exc)
            scope.cancel()

    async def _ask_gate(self, request: GateRequest) -> GateResolution:
        try:
            return await self.gate_answer(request)
        except ActorError as exc:
            raise RunEnded(RunStatus.FAILED, f"the human gate failed: {exc}") from None

    async def gate_answer(self, request: GateRequest) -> GateResolution:
        """Ask the human gate role for an open gate's answer.

        A worker of the role waits for the person (or the gate's timeout).
        While every worker is busy with other gates, the request waits in the
        role's mailbox; a person's answer, or the timeout, counts all the
        same: the registry gives it, and the queued request is withdrawn.

        Raises:
            ActorError: the role failed or stopped.
        """
        answer: GateResolution | None = None
        failure: ActorError | None = None

        async def by_actor() -> None:
            nonlocal answer, failure
            try:
                answer = await self.roles.human_gate.ask(
                    request, run_id=self.state.run_id
                )
            except ActorError as exc:
                failure = exc
            tg.cancel_scope.cancel()

        async def while_queued() -> None:
            nonlocal answer
            resolution = await self.gates.unattended(request)
            if resolution is not None:
                answer = resolution
                tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(by_actor)
            tg.start_soon(while_queued)
        if failure is not None:
            raise failure
        if answer is None:  # pragma: no cover - one of the two always answers
            raise RuntimeError(f"gate {request.gate_id} got no answer")
        return answer

    async def resolve_gate(
        self, request: GateRequest, resolution: GateResolution
    ) -> None:
        await self.record_events(
            (GateResolved, {"gate_id": request.gate_id, "resolution": resolution}),
            # A tool call's answer is journaled by the attempt's worker: an
            # attempt cut short meanwhile had its gate withdrawn already.
            unless_cancelled=request.tool_call is not None,
        )
        self.gates.close(request.gate_id)

    # The run ------------------------------------------------------------------

    async def run(self) -> None:
        """Drive the run to its end and journal how it ended.

        A supervisor shutdown cancels the driver without journaling an end:
        the run stays ``running`` in the journal, to be resumed from it (its
        trace is suspended, and the resumed run's trace links to it).
        """
        try:
            async with self.trace.running():
                await self._run()
        finally:
            self._recorded()  # nothing more will be journaled
            self._idle.set()  # ended (or let go): a drain waits no more

    async def _run(self) -> None:
        ended: tuple[RunStatus, str | None, Synthesis | None] | None = None
        try:
            with self._cancel_scope:
                with anyio.CancelScope(deadline=self._deadline()) as deadline_scope:
                    ended = await self._drive()
                if ended is None and deadline_scope.cancelled_caught:
                    ended = (
                        RunStatus.LIMIT_REACHED,
                        f"deadline_s: {self.limits.deadline_s:g}s passed",
                        None,
                    )
            if ended is None and self._cancel_requested:
                ended = (RunStatus.CANCELLED, "cancelled on request", None)
            if ended is not None and self._needs_brief():
                # An explore run's deadline or a cancel cut its flow short:
                # its brief still says what was found so far.
                from ._explore import brief_after

                with anyio.CancelScope(shield=True):
                    await brief_after(self, RunEnded(ended[0], ended[1] or ""))
            if (
                ended is not None
                and ended[0] is RunStatus.FAILED
                and (
                    anyio.current_effective_deadline() == -math.inf
                    or self._stopping_with_supervisor
                )
            ):
                # The supervisor is stopping (this task is cancelled, or is
                # about to be: an exception such as a KeyboardInterrupt went
                # out of a handler, and its role stopped first): the roles
                # stop with it, which fails no run. Cancelled, the run stays
                # unfinished in the journal, for resume().
                await anyio.sleep_forever()
            if ended is not None:
                status, reason, synthesis = ended
                await self._settle()
                self._take_unpicked()
                self._stage_finished_meanwhile()
                with anyio.CancelScope(shield=True):
                    try:
                        await self._record_end(status, reason, synthesis)
                    except RunEnded as unstorable:  # the synthesis, say
                        await self._record_end(
                            unstorable.status, unstorable.reason, None
                        )
        finally:
            # Reports the driver never took (it was stopped): keep what
            # finished in the ledger, so that a resumed run does not redo it.
            untaken = [*self._held, *self._inbox.take_nowait()]
            await self._keep([*self._unjournaled, *untaken])
            await self._settle()
            # Reports that came as the run's calls settled: kept alike.
            late = self._inbox.take_nowait()
            await self._keep(late)
            untaken.extend(late)
            lost = [
                *self._attempts_spent(),
                *self._unreported(),
                *self._usage_not_kept(untaken),
            ]
            if (
                (lost or self._staged)
                and not self.state.status.final
                and not any(isinstance(e, ExploreErrorRecorded) for e in self._staged)
            ):
                # Stopped (a drain's grace ran out) with answers taken by a
                # role whose reply never came, or with reports no ledger
                # keeps (an attempt task_timeout_s cut short): their tokens
                # are the run's, journaled before it is resumed. So is what
                # the run staged for its next append: the usage of replies
                # it took (revisions before their critiques, a finish), and
                # what they decided, which nothing acted on yet.
                with anyio.CancelScope(shield=True):
                    await self._journal_unreported(lost)
            self._inbox.close()
            state = self.state
            self.gates.close_run(
                state.run_id,
                "the run ended before the gate was resolved",
                {g: info.resolution for g, info in state.gates.items()}
                if state.status.final
                else None,
            )

    async def _keep(self, reports: Sequence[_Report]) -> None:
        """Put the finished attempts among ``reports`` in the ledger as the
        run stops (see :meth:`_secure`)."""
        if reports and self.effects is not None:
            # Not this supervisor's ledger once another drives the run.
            with anyio.CancelScope(shield=True), suppress(LeaseLost):
                await self._secure(reports)

    async def _settle(self) -> None:
        """Wait (briefly) until the run's model calls cut short have ended:
        one that answered meanwhile is in the usage journaled next."""
        if self.meter.calls:
            with anyio.CancelScope(shield=True), anyio.move_on_after(SETTLE_S):
                await self.meter.settled()

    def _role_stopped(self, error: ActorStopped) -> RunEnded:
        """How a role's stop ends the run: ``failed`` when the role stopped
        for its own failure (too many crashes); one that stops with the
        supervisor lets go of the run instead (see :meth:`_run`)."""
        pool = getattr(self.roles, error.role, None)
        if pool is not None and not pool.failed:
            self._stopping_with_supervisor = True
        return RunEnded(RunStatus.FAILED, f"the {error.role} role stopped: {error}")

    def _take_unpicked(self) -> None:
        """A resumed run that ends before it picked up where its journal
        left off (its deadline passed while nobody drove it): the attempts
        its ledger holds as finished are journaled with its end, as those
        that finished while it waited, so that their results and the tokens
        of their calls are the run's."""
        unpicked, self.unpicked = self.unpicked, ()
        finished = {(record.task_id, record.attempt): record for record in unpicked}
        for task in self.view.with_status(TaskStatus.IN_PROGRESS):
            record = finished.get((task.id, task.attempts))
            if record is not None:
                self.recovered(record)

    def _stage_finished_meanwhile(self) -> None:
        """Attempts that finished while the run waited (at a gate, on a
        review) and that its end came before: journaled with the end, so
        that their results are kept (``abort`` keeps the partial results).
        Of those still running, what their model calls have cost so far
        (a tool loop's steps), so that the run's usage counts every call."""
        held, self._held = self._held, []
        for item in [*held, *self._inbox.take_nowait()]:
            if isinstance(item, _Fatal):
                # Another attempt's call the spent budget (say) refused:
                # what its calls cost until then.
                self.stage(*failure_events(item.failure, with_usage=True))
                continue
            if not isinstance(item, _Done):
                continue
            task = self.view.tasks.get(item.task_id)
            if task is None or task.status is not TaskStatus.IN_PROGRESS:
                continue
            if item.attempt and item.attempt != task.attempts:
                continue
            self.stage(*finish_events(item))
        self.stage(*self._attempts_spent(), *self._unreported())

    def _attempts_spent(self) -> list[tuple[type[Event], dict[str, Any]]]:
        """What the model calls of attempts still running cost so far: no
        report will say it once the run ends or stops."""
        events: list[tuple[type[Event], dict[str, Any]]] = []
        for task in self.view.with_status(TaskStatus.IN_PROGRESS):
            spent = self.meter.take_attempt(task.id, task.attempts)
            if spent is not None:
                fields = {"role": "executor", "purpose": "execute", "usage": spent}
                events.append((UsageRecorded, fields))
        return events

    def _usage_not_kept(
        self, reports: Sequence[_Report]
    ) -> list[tuple[type[Event], dict[str, Any]]]:
        """What reports the run stops before taking used, where no effect
        ledger keeps them for the resumed run to journal: an attempt that
        ``task_timeout_s`` cut short (it runs again), one on a store with no
        ledger, a model failure that would have ended the run."""
        calls: list[ModelCall] = []
        for item in reports:
            if isinstance(item, _Done):
                if not (item.unsecured and self.effects is not None):
                    calls.extend(item.calls)
            elif isinstance(item, _Fatal):
                usage = item.failure.usage
                if usage.calls or usage.total_tokens:
                    calls.append(
                        ModelCall(
                            role=item.failure.role,
                            purpose=item.failure.purpose,
                            usage=usage,
                        )
                    )
        return usage_events(calls)

    def _unreported(self) -> list[tuple[type[Event], dict[str, Any]]]:
        """Usage of answers whose request was cut short before its reply
        (a malformed answer being asked again): no reply will report it."""
        return [
            (UsageRecorded, {"role": role, "purpose": purpose, "usage": usage})
            for role, purpose, usage in self.meter.take_unreported()
        ]

    def _needs_brief(self) -> bool:
        """An explore run that has not issued its brief."""
        state = self.state
        if state.spec.kind != "explore":
            return False
        return state.explore is None or state.explore.brief is None

    async def _record_end(
        self, status: RunStatus, reason: str | None, synthesis: Synthesis | None
    ) -> None:
        fields = {"status": status, "stop_reason": reason, "synthesis": synthesis}
        await self.record_events((RunFinished, fields))

    def _deadline(self) -> float:
        deadline_at = self.state.deadline_at
        if deadline_at is None:
            return float("inf")
        left = (deadline_at - datetime.now(UTC)).total_seconds()
        return anyio.current_time() + left

    async def _drive(self) -> tuple[RunStatus, str | None, Synthesis | None]:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                outcome: tuple[RunStatus, str | None, Synthesis | None]
                try:
                    if self.cancel_at_start:
                        # Nothing to pick up: an explore run's brief reads
                        # the journaled state as it stands.
                        self.recovery = None
                        raise RunEnded(RunStatus.CANCELLED, "cancelled on request")
                    if self.state.spec.kind == "explore":
                        from ._explore import explore

                        outcome = await explore(self)
                    else:
                        synthesis = await self._loop(tg)
                        outcome = (RunStatus.COMPLETED, None, synthesis)
                except RunEnded as end:
                    outcome = (end.status, end.reason, None)
                finally:
                    # The run is over (or stopped): a report that arrives
                    # from now on must not start a task in a group that is
                    # closing; _run() secures what reaches the inbox.
                    self._tg = None
                if self._children:
                    tg.cancel_scope.cancel()
        finally:
            self._tg = None
            # Executions still running are nobody's business any more:
            # cancel their handling (their reports would find the run over).
            # A model call of theirs that answered meanwhile is in the run's
            # meter once it returns: the end waits for those (_settle). A
            # handling past its last checkpoint answers all the same.
            posted, self._posted = self._posted, {}
            for slot, task in posted.items():
                slot.abandon(partial(self._answered_after_all, task, slot))
                self._end()
        return outcome

    async def _loop(self, tg: TaskGroup) -> Synthesis:
        from ._replanning import boundary, first_plan, review

        recovery, self.recovery = self.recovery, None
        if recovery is not None:
            await recovery(self, tg)
        if not self.state.versions:
            await first_plan(self)
        while True:
            if self._due and self._review_due():
                await review(self)
                continue
            self.trace.sync()
            await self._dispatch(tg)
            # After the dispatch, which journals what is staged: a ``complete``
            # verdict staged by a review has superseded its tasks only then.
            self._withdraw_stale_approvals()
            if (
                self._in_flight == 0
                and not self._awaiting_approval
                and self._retry_wake is None
            ):
                state = self.state
                if phase_done(state):
                    if state.window and not state.completing:
                        await review(self)
                        continue
                    if phase_gate(state) == "boundary":
                        await boundary(self)
                        continue
                    return await self._synthesize()
                if next(iter_ready(state), None) is not None:
                    raise RunEnded(
                        RunStatus.LIMIT_REACHED,
                        f"max_task_executions: {state.task_executions} task "
                        "attempts started, the limit",
                    )
                raise RunEnded(RunStatus.FAILED, "no pending task can ever run")
            # Take every report that is already in, so that tasks finishing
            # together share one append with the starts that follow them.
            self._collecting = True
            try:
                # Attempts waiting at a tool call's gate with no timeout move
                # only when a person answers.
                moving = self._in_flight - len(self._tool_gates)
                if self._retry_wake is not None:
                    # A retry waits for its time: the reports that come
                    # meanwhile are taken as usual.
                    items = []
                    with anyio.move_on_after(self._retry_wake - anyio.current_time()):
                        items = await self._inbox.take()
                elif moving or self.limits.gate_timeout_s is not None:
                    items = await self._inbox.take()
                else:
                    # Only people can move the run on now (approvals, tool
                    # calls' gates, none with a timeout). Task approvals'
                    # gate spans come first, inside the run's span.
                    await self._approvals_taken()
                    async with self.trace.idle("waiting for people, no timeout"):
                        items = await self._inbox.take()
            finally:
                self._collecting = False
            self.trace.sync()
            held = self._held = list(items)
            try:
                while held:
                    await self._take(held.pop(0), later=held)
            except BaseException:
                # Stopped or ended mid-batch: what finished may not be
                # journaled; keep it in the ledger for a resumed run.
                with anyio.CancelScope(shield=True):
                    await self._secure(items)
                raise

    def _review_due(self) -> bool:
        """A milestone reached by tasks that finished while the run waited at
        a gate, not reviewed since (a review staged, not yet journaled, is
        held: a resumed run's review of the milestones its journal left due
        covers those its gate's wait reached too)."""
        due, self._due = self._due, []
        state = self.view
        return bool(state.window) and any(milestone_due(state, t) for t in due)

    async def _approvals_taken(self) -> None:
        """Wait (briefly: a busy gate pool does not hold up the run) until
        the gate actor has taken every approval request."""
        with anyio.move_on_after(APPROVAL_TAKEN_WAIT_S):
            for gate_id in list(self._awaiting_approval):
                await self.gates.waited_on(gate_id)

    async def _secure(self, items: Sequence[_Report]) -> None:
        """Put finished attempts that skipped the effect ledger into it.

        A task that finishes while the driver waits for reports skips the
        ledger: the driver journals it at once, a window no wider than the
        ledger's own. Before the driver waits on anything else (a review), the
        reports it still holds go to the ledger, so that a crash during the
        wait does not run those tasks again.
        """
        if self.effects is None:
            return
        for item in items:
            if isinstance(item, _Done) and item.unsecured:
                record = EffectRecord(
                    task_id=item.task_id,
                    attempt=item.attempt,
                    outcome=item.outcome,
                    calls=item.calls,
                    failures=list(item.failures),
                    retry_at=item.retry_at,
                )
                try:
                    await self.effects.record_effect(self.state.run_id, record)
                except (PydanticSerializationError, UnicodeError) as exc:
                    # No store can keep it; journaling it fails the run.
                    logger.warning(
                        "the result of task %s cannot be stored: %s", item.task_id, exc
                    )

    async def _take(
        self,
        item: _Report,
        later: Sequence[_Report] = (),
        due: list[str] | None = None,
    ) -> None:
        """Act on one report from a task or an approval.

        ``due``: the driver waits at a gate; a milestone the report reaches
        is put there, to be reviewed once the gate is answered.
        """
        if isinstance(item, _RoleStopped):
            raise self._role_stopped(item.error)
        if isinstance(item, _Answered):
            self._awaiting_approval.discard(item.request.gate_id)
            return
        if isinstance(item, _ToolGate):
            return
        if isinstance(item, _Settled):
            self._in_flight -= 1
            return
        if isinstance(item, _Ended):
            raise item.end
        if isinstance(item, _Fatal):
            self.stage(*failure_events(item.failure, with_usage=True))
            raise failure_ending(item.failure)
        if not item.lingering:
            self._in_flight -= 1
        if item.unsecured:
            self._unjournaled.append(item)
        if item.timed_out:
            self._withdraw_tool_gates_of(item.task_id)
        staged = self.stage(*finish_events(item))
        if not item.outcome.success:
            retry_at = self._retry_at(item, staged)
            if retry_at is not None:
                fields = {"task_id": item.task_id, "retry_at": retry_at}
                staged = self.stage((RetryScheduled, fields))
        finished = staged.tasks[item.task_id].status is not TaskStatus.PENDING
        if finished and milestone_due(staged, item.task_id):
            if due is not None:
                due.append(item.task_id)
                return
            # Imported here, not per report: an import statement costs
            # more than the rest of a report's checks.
            from ._replanning import review

            await self.record_events()
            await self._secure(later)
            await review(self)

    def _retry_at(self, item: _Done, state: RunState) -> datetime | None:
        """When the retry of a transiently failed attempt may start: after
        the wait its failure asked for, else after the run's backoff (which
        doubles with each attempt, with equal jitter); None: at once, or no
        retry is coming (``state`` has the task's finish)."""
        if state.tasks[item.task_id].status is not TaskStatus.PENDING:
            return None  # failed for good, or superseded by a ``complete``
        now = datetime.now(UTC)
        if item.retry_at is not None:
            # The time the failure asked for (also after a crash, from the
            # ledger): the wait counts from the failure, not from now.
            return item.retry_at if item.retry_at > now else None
        first = self.limits.retry_backoff_s
        ceiling = min(MAX_RETRY_BACKOFF_S, first * 2 ** max(0, item.attempt - 1))
        wait = ceiling / 2 + random.uniform(0, ceiling / 2)
        if wait <= 0:
            return None
        return now + timedelta(seconds=wait)

    def _not_yet(self, retry_at: datetime) -> bool:
        """Whether a retry due at ``retry_at`` must wait still; the first
        such wait ends at ``_retry_wake``."""
        left = (retry_at - datetime.now(UTC)).total_seconds()
        if left <= 0:
            return False
        wake = anyio.current_time() + left
        if self._retry_wake is None or wake < self._retry_wake:
            self._retry_wake = wake
        return True

    async def _dispatch(self, tg: TaskGroup) -> None:
        """Start ready tasks up to ``max_concurrency``; gate side effects first.

        Journals whatever is staged together with the starts, in one append.
        While draining nothing starts: the run waits for what is in flight,
        then holds until the supervisor stops.
        """
        self._retry_wake = None
        if self._draining:
            await self.record_events()
            if self._in_flight == 0:
                await self._hold_if_draining()
            return
        state = self.view
        room = self.limits.max_concurrency - self._in_flight
        budget = self.limits.max_task_executions - state.task_executions
        to_start: list[Task] = []
        gated: set[str | None] | None = None  # looked up for side effects only
        retry_at = state.retry_at
        for task in self._ready(state):
            if task.requires_approval and not task.approved:
                if gated is None:
                    gated = {g.request.task_id for g in state.open_gates}
                if task.id not in gated:
                    await self._request_approval(tg, task)
                continue
            if len(to_start) >= min(room, budget):
                break
            if retry_at and task.id in retry_at and self._not_yet(retry_at[task.id]):
                continue
            to_start.append(task)
        if not to_start:
            await self.record_events()
            return
        self.check_budget()
        state = await self.record_events(
            *(
                (TaskStarted, {"task_id": t.id, "attempt": t.attempts + 1})
                for t in to_start
            )
        )
        for task in to_start:
            await self._post(state.tasks[task.id])

    def _withdraw_tool_gates_of(self, task_id: str) -> None:
        """Close the gates a timed-out attempt's tool calls left open.

        The attempt no longer waits for their answers; one that runs again
        asks again, at a gate of its own. (An answer journaled before the
        attempt was cut short has closed its gate already.)
        """
        note = (
            "the attempt that asked passed task_timeout_s; "
            "an attempt that runs again asks again"
        )
        # Its worker may not have left the gate yet: the attempt waits no more.
        for gate_id, waiting in list(self._tool_gates.items()):
            if waiting == task_id:
                del self._tool_gates[gate_id]
        for gate in self.view.open_gates:
            request = gate.request
            if request.tool_call is not None and request.task_id == task_id:
                resolution = GateResolution(
                    decision="reject", by="supervisor", note=note
                )
                self.stage(
                    (
                        GateResolved,
                        {"gate_id": request.gate_id, "resolution": resolution},
                    )
                )
                # Answered, not closed: a gate worker may hold the request
                # still; it answers with this, and the attempt's own cleanup
                # closes the gate.
                self.gates.withdraw(request.gate_id, note)

    def _withdraw_stale_approvals(self) -> None:
        """A side effect that a replan or ``complete`` superseded needs no answer."""
        state = self.state
        for gate in state.open_gates:
            task_id = gate.request.task_id
            if gate.request.tool_call is not None:
                continue  # the running task itself waits for this answer
            if task_id is not None and state.tasks[task_id].status is not (
                TaskStatus.PENDING
            ):
                self.gates.withdraw(
                    gate.request.gate_id, f"task {task_id} is no longer pending"
                )

    async def restart(self, task: Task) -> None:
        """Run an attempt a resumed run has journaled as started again."""
        await self._post(task)

    def reopen_approval(self, tg: TaskGroup, request: GateRequest) -> None:
        """Wait again for a journaled approval gate's answer (listed again)."""
        if self.gates.get(request.gate_id) is None:
            self.gates.open(request, approval_check)
        self._awaiting_approval.add(request.gate_id)
        self._start_child(tg, self._await_approval, request)

    def _start_child(
        self, tg: TaskGroup, func: Callable[[_T], Awaitable[None]], arg: _T
    ) -> None:
        """Start ``func(arg)`` in the driver's group, counted until it ends."""
        self._children += 1
        try:
            tg.start_soon(self._counted, func, arg)
        except BaseException:
            self._children -= 1
            raise

    async def _counted(self, func: Callable[[_T], Awaitable[None]], arg: _T) -> None:
        try:
            await func(arg)
        finally:
            self._children -= 1

    async def _request_approval(self, tg: TaskGroup, task: Task) -> None:
        request = self.gate_request(
            f"task {task.id} has side effects and needs approval: {task.description}",
            task_id=task.id,
        )

        await self.open_gate(request, approval_check)
        self._awaiting_approval.add(request.gate_id)
        self._start_child(tg, self._await_approval, request)

    async def _await_approval(self, request: GateRequest) -> None:
        """Wait for a side effect's approval and journal the answer at once.

        The answer is journaled here, not by the main loop, so that a person's
        ``resolve()`` returns even while the run waits at another gate.
        """
        try:
            resolution = await self.gate_answer(request)
        except ActorStopped as exc:
            self._inbox.put(_RoleStopped(exc))
            return
        except ActorError as exc:
            resolution = GateResolution(
                decision="reject", by="supervisor", note=str(exc)
            )
        try:
            await self.resolve_gate(request, resolution)
        except RunEnded as end:
            # Not raised here: this task's failure would crash the driver's
            # task group instead of ending the run.
            self._inbox.put(_Ended(end))
            return
        self._inbox.put(_Answered(request, resolution))

    async def approve_tool_call(self, task_id: str, call: ToolCall) -> GateResolution:
        """A running task's side-effect tool call waits for a person's answer."""
        request = self.gate_request(
            f"task {task_id} asks to run the tool {call.name}, which has side effects",
            task_id=task_id,
            tool_call=call,
        )
        try:
            request.check_storable()
        except ConfigurationError as exc:  # the model's call, not a person's
            note = f"the tool call cannot be journaled: {exc}"
            return GateResolution(decision="reject", by="supervisor", note=note)
        if request.expires_at is not None:
            return await self._tool_call_answer(request)
        # No timeout: the attempt waits without bound. The driver counts it
        # as held by a person, and the executor's span ends while it waits.
        self._tool_gates[request.gate_id] = task_id
        self._inbox.put(_ToolGate())
        reason = f"gate {request.gate_id} waits for a person, no timeout"
        with actor_span_suspended(reason, self.trace.live_context):
            try:
                return await self._tool_call_answer(request)
            finally:
                # Answered or withdrawn: the driver looks again (not when a
                # timeout's report took the gate off already).
                if self._tool_gates.pop(request.gate_id, None) is not None:
                    self._inbox.put(_ToolGate())

    async def _tool_call_answer(self, request: GateRequest) -> GateResolution:
        try:
            return await self.await_gate(request, approval_check)
        except RunEnded as end:
            if isinstance(end, Unjournalable):
                # The driver's staged events went with this append: the run
                # cannot go on without them.
                self._inbox.put(_Ended(end))
            return GateResolution(decision="reject", by="supervisor", note=end.reason)

    async def _post(self, task: Task) -> None:
        """Send one attempt to the executor pool; its report comes back
        through :meth:`_reported`, called by the worker that answers."""
        state = self.state
        context = self.base_context()
        context.update(
            task=task,
            dependency_results={d: state.tasks[d].result for d in task.depends_on},
            attempt=task.attempts,
        )
        # Built from validated values (the task, the spec's), not checked
        # again: one per execution.
        request = built(
            ExecuteRequest,
            {
                "context": context,
                "task": task,
                "max_tool_steps": self.limits.max_tool_steps,
            },
        )
        self._in_flight += 1
        # Busy until the report is with the driver: a drain that sees no
        # execution busy finds every report in the inbox or the ledger.
        self._begin()
        try:
            slot = await self.roles.executor.post(
                request,
                partial(self._reported, task),
                run_id=state.run_id,
                # Timed from when an executor takes it: an attempt that waits
                # for one (other runs' tasks first) is not cut short for it.
                handle_within_s=self.limits.task_timeout_s,
            )
        except ActorStopped as exc:
            self._inbox.put(_RoleStopped(exc))
            self._end()
            return
        except BaseException:
            # Cancelled while the mailbox was full: nothing was sent.
            self._in_flight -= 1
            self._end()
            raise
        if not slot.done:
            self._posted[slot] = task

    def _reported(self, task: Task, slot: ReplySlot[Any]) -> None:
        """Hand one attempt's report to the driver (on the worker's task)."""
        self._posted.pop(slot, None)
        try:
            report = self._report(task, slot)
        except Exception as exc:
            # A fault here must neither take the executor pool down (this
            # runs on its worker) nor leave the run waiting for the report.
            logger.exception("the report of task %s could not be read", task.id)
            report = _Done(
                task.id,
                TaskOutcome(
                    success=False,
                    reason=f"the executor's reply could not be read: {exc}",
                ),
                [],
                (),
                task.attempts,
            )
        try:
            self._inbox.put(report)
        finally:
            self._end()

    def _answered_after_all(self, task: Task, slot: ReplySlot[Any]) -> None:
        """An execution the stopping run abandoned whose handling answered
        all the same (its last wait was over: the cancel found no checkpoint
        left): its report goes to the inbox, whose reports the stopping run
        puts in the effect ledger, so that a resumed run does not run the
        task again. On the worker's task, once its handling has ended."""
        if not slot.replied:
            return  # cut short: the resumed run asks again
        try:
            report = self._report(task, slot)
        except Exception:
            logger.exception("the report of task %s could not be read", task.id)
            return
        if isinstance(report, _Done):
            self._inbox.put(report)

    def _report(self, task: Task, slot: ReplySlot[Any]) -> _Report:
        calls: list[ModelCall] = []
        failures: Sequence[ModelFailure] = ()
        retry_after: float | None = None
        try:
            reply = slot.result()
            if not isinstance(reply, ExecuteReply):
                raise ActorCrashed(
                    ActorFailure(
                        role="executor",
                        error_type="TypeError",
                        message=f"expected ExecuteReply, got {type(reply).__name__}",
                    )
                )
            outcome, calls, failures = reply.outcome, reply.calls, reply.failures
            if failures and not outcome.success:
                retry_after = _asked_wait(failures)
        except ActorCrashed as exc:
            failure = exc.failure.model_failure
            if failure is not None:
                if failure.fatal:
                    return _Fatal(failure)
                retry_after = _asked_wait([failure])
            # A crash may be the worker's, not the task's: retry on a fresh one.
            outcome = TaskOutcome(
                success=False, transient=True, reason=f"{EXECUTOR_CRASHED}{exc}"
            )
        except ActorTimeout:
            # The pool's timer cut the attempt short (task_timeout_s): no
            # reply tells what its model calls used, the run's meter does.
            timeout = self.limits.task_timeout_s
            outcome = TaskOutcome(
                success=False,
                transient=True,
                reason=f"task_timeout_s: the attempt took longer than {timeout:g}s",
            )
            spent = self.meter.take_attempt(task.id, task.attempts, cut=True)
            if spent is not None:
                calls = [ModelCall(role="executor", purpose="execute", usage=spent)]
            # Until its code has stopped, the attempt is still running: a
            # retry or another task must not take its place beyond
            # max_concurrency.
            inbox = self._inbox
            lingering = slot.when_settled(lambda: inbox.put(_SETTLED))
            return _Done(
                task.id,
                outcome,
                calls,
                (),
                task.attempts,
                False,
                timed_out=True,
                lingering=lingering,
            )
        except ActorStopped as exc:
            # The supervisor stops: what the attempt's calls cost is the
            # run's, journaled as it stops (see _attempts_spent).
            spent = self.meter.take_attempt(task.id, task.attempts)
            if spent is not None and (spent.calls or spent.total_tokens):
                self.meter.hold("executor", "execute", spent)
            return _RoleStopped(exc)
        finally:
            self.meter.take_attempt(task.id, task.attempts)  # none left behind
        report = _Done(
            task.id,
            outcome,
            calls,
            failures,
            task.attempts,
            self.effects is not None,
            False,
            # Counted from the failure, as the server meant it, and kept so
            # (in the ledger too): the driver may journal it later.
            None
            if retry_after is None
            else datetime.now(UTC) + timedelta(seconds=retry_after),
        )
        tg = self._tg
        if report.unsecured and not self._collecting and tg is not None:
            # The driver is busy elsewhere (a review, a gate): make the
            # outcome durable now, so that a crash before the driver journals
            # it does not run the task again (see _secure).
            self._start_child(tg, self._secure_soon, report)
            self._begin()  # after: a group that refused leaves no count
        return report

    async def _secure_soon(self, report: _Done) -> None:
        try:
            with anyio.CancelScope(shield=True):
                await self._secure([report])
        finally:
            self._end()

    def recovered(self, record: EffectRecord) -> None:
        """An attempt that finished before a crash: handle it as if just done."""
        self._in_flight += 1
        self._inbox.put(
            _Done(
                record.task_id,
                record.outcome,
                record.calls,
                record.failures,
                record.attempt,
                retry_at=record.retry_at,
            )
        )

    async def _synthesize(self) -> Synthesis:
        context = self.base_context()
        context["completed"] = self.completed_context()
        reply = await self.ask(
            self.roles.executor, SynthesizeRequest(context=context), SynthesizeReply
        )
        return reply.synthesis

    async def plan_proposal(
        self,
        purpose: Literal["plan", "replan", "boundary"],
        context: dict[str, Any],
        candidates: int = 1,
    ) -> PlanReply:
        request = PlanRequest(purpose=purpose, candidates=candidates, context=context)
        return await self.ask(self.roles.planner, request, PlanReply)

    def plan_version(
        self, drafts: list[TaskDraft], reason: str, *, boundary: bool
    ) -> PlanVersion:
        """The first plan's version, or the boundary's, built from ``drafts``.

        Raises:
            ValueError: the drafts are no valid plan on the run as it is.
        """
        state = self.view
        return build_version(
            state,
            drafts,
            trigger=None,
            reason=reason,
            phase="synthesis" if boundary else state.phase,
            replace_pending=False,
        )

    def create_plan(self, version: PlanVersion, *, boundary: bool) -> None:
        """Install the first plan, or the boundary's synthesis plan."""
        # Staged: the plan takes effect when its first tasks start, and the
        # dispatch that starts them journals both in one append.
        self.stage((PlanCreated, {"version": version, "boundary": boundary}))
