"""The supervisor: owns the actor pools and every run, enforces the rules."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.lowlevel
import anyio.to_thread
from anyio.abc import TaskGroup, TaskStatus
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider
from pydantic import Field

from .._errors import (
    ConfigurationError,
    JournalCorrupt,
    JournalUnavailable,
    ReplanError,
    RunDrivenElsewhere,
    SupervisorError,
    UnknownRunError,
)
from ..actors import ActorPool, PoolStatistics
from ..actors._evolver import Evolver
from ..actors._executor import Executor, TaskRunner
from ..actors._human_gate import HumanGate
from ..actors._planner import Planner
from ..actors._ranker import Ranker
from ..actors._reviewer import Reviewer
from ..llm import Model, Tool
from ..llm._tools import as_tools
from ..messages import (
    GateResolution,
    RunResult,
    RunSpec,
    RunStatus,
    RunSubmitted,
    ToolCall,
)
from ..messages._base import Settings
from ..store import (
    DriverLease,
    EffectLedger,
    MemoryStore,
    RunLease,
    RunLeases,
    RunOwner,
    RunRequest,
    RunRequests,
    Store,
    ToolEffectLedger,
)
from ..telemetry import Telemetry
from ._arguments import an_id, seconds
from ._budget import MeteredModel, RunMeter
from ._exits import lone_exit
from ._forwarding import FORWARD_WAIT_S, Forwarded, Forwarding, gate_of
from ._gates import GateRegistry, resolution_from
from ._handle import RunHandle, RunRecord
from ._leases import claim, keep_leases, lease_lost, new_owner, owned_journal, release
from ._resume import Recovery
from ._roles import DEFAULT_WORKERS, ROLES, Roles
from ._run import RunDriver, summary_of
from ._state import RunState, apply, fold_journal

logger = logging.getLogger("replan.supervisor")

_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")
"""A run id a caller may choose: one URL path segment, as the API names it."""


class _Workers(Settings):
    """Pool sizes per role (see ``DEFAULT_WORKERS``)."""

    planner: int = Field(default=DEFAULT_WORKERS["planner"], ge=1)
    executor: int = Field(default=DEFAULT_WORKERS["executor"], ge=1)
    reviewer: int = Field(default=DEFAULT_WORKERS["reviewer"], ge=1)
    ranker: int = Field(default=DEFAULT_WORKERS["ranker"], ge=1)
    evolver: int = Field(default=DEFAULT_WORKERS["evolver"], ge=1)
    human_gate: int = Field(default=DEFAULT_WORKERS["human_gate"], ge=1)


class _Options(Settings):
    """The supervisor's arguments, checked as a run's limits are: whole
    numbers where counts are meant, finite numbers, no true or false."""

    workers: _Workers
    mailbox_size: int = Field(ge=1)
    max_restarts: int = Field(ge=0)
    restart_period_s: float = Field(gt=0)
    executor_temperature: float = Field(ge=0, le=2)
    evolver_temperature: float = Field(ge=0, le=2)
    keep_finished: int = Field(ge=0)


class Supervisor:
    """Runs plans with six supervised actor pools and a journal.

    Use it as ``async with Supervisor(model=...) as sup:``, or start it in a
    task group you own with ``await tg.start(sup.serve)``.

    Args:
        model: the model every role asks (a ``ScriptedModel`` offline).
        store: the journal; in memory when omitted.
        task_runner: ``async fn(task, ctx) -> TaskOutcome`` to run tasks
            instead of asking the model (or a plain function returning the
            outcome, which runs on the event loop). An exception it raises
            fails that attempt as a crash (retried up to
            ``max_task_attempts``); it never counts toward the executor
            role's ``max_restarts``.
        workers: pool size per role (``planner``, ``executor``, ``reviewer``,
            ``ranker``, ``evolver``, ``human_gate``): the role's global
            concurrency across all runs, and so its model rate limit.
        mailbox_size: requests that may wait per role before senders block.
        max_restarts: crashes a role survives within ``restart_period_s``;
            past that the role stops and the runs that need it fail.
        restart_period_s: the window of ``max_restarts``.
        executor_temperature: sampling temperature for task execution
            (0 to 2).
        evolver_temperature: sampling temperature for refining candidates
            (0 to 2).
        keep_finished: how many finished runs :meth:`get` and :meth:`handles`
            still know (the oldest are forgotten first; their journal stays,
            :meth:`replay` reads it). Bounds a long-lived supervisor's memory.
        tracer_provider: where the runs' spans go (OpenTelemetry API); the
            global provider when omitted.
        meter_provider: where the metrics go; the global provider when omitted.
        tools: functions (or :class:`~replan.llm.Tool` objects) the executor
            may call while running a task; a ``side_effect`` tool waits for a
            person's approval at a human gate before each call.
        resume: on start, resume every run the store holds unfinished
            (``running`` or ``waiting_for_human``); see :meth:`resume`.

    Counts must be whole numbers and periods and temperatures finite; true
    and false are no numbers (text that spells one reads, as in a spec).

    Raises:
        ConfigurationError: an argument is invalid (names it, as in
            ``workers.executor``; a store opened read-only, or closed, is
            ``store``),
            before anything runs.
    """

    def __init__(
        self,
        model: Model,
        store: Store | None = None,
        *,
        task_runner: TaskRunner | None = None,
        workers: Mapping[str, int] | None = None,
        mailbox_size: int = 64,
        max_restarts: int = 5,
        restart_period_s: float = 10.0,
        executor_temperature: float = 0.2,
        evolver_temperature: float = 0.7,
        keep_finished: int = 1000,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        resume: bool = False,
    ) -> None:
        if isinstance(model, type):
            # The protocol's check sees the class's generate: every call
            # failed as a crash of the role, which then stopped.
            raise ConfigurationError(
                "model",
                f"expected a model, got the class {model.__name__}: pass an "
                f"instance ({model.__name__}(...))",
            )
        if not isinstance(model, Model):
            raise ConfigurationError(
                "model",
                "expected a model with `async generate(request)` "
                f"(ScriptedModel, OpenAIModel, ...), got {type(model).__name__}",
            )
        if store is not None and not isinstance(store, Store):
            raise ConfigurationError(
                "store",
                "expected a journal store (MemoryStore, SQLiteStore(path), ...), "
                f"got {type(store).__name__}",
            )
        if getattr(store, "closed", False) is True:
            # Else refused only at the first submit, as a journal failure.
            raise ConfigurationError(
                "store", f"{store!r} is closed: pass a store that is open"
            )
        if getattr(store, "read_only", False) is True:
            raise ConfigurationError(
                "store",
                f"{store!r} is open read-only: a supervisor journals its runs "
                "in a store it can write to",
            )
        if task_runner is not None and not callable(task_runner):
            raise ConfigurationError(
                "task_runner",
                "expected `async fn(task, ctx) -> TaskOutcome`, "
                f"got {type(task_runner).__name__}",
            )
        if workers is None:
            workers = {}
        elif not isinstance(workers, Mapping):
            raise ConfigurationError(
                "workers", "expected a mapping of role names to pool sizes"
            )
        for role in workers:
            if role not in ROLES:
                raise ConfigurationError(
                    f"workers.{role}", f"unknown role; use one of {', '.join(ROLES)}"
                )
        options = _Options.model_validate(
            {
                "workers": dict(workers),
                "mailbox_size": mailbox_size,
                "max_restarts": max_restarts,
                "restart_period_s": restart_period_s,
                "executor_temperature": executor_temperature,
                "evolver_temperature": evolver_temperature,
                "keep_finished": keep_finished,
            }
        )  # ConfigurationError naming the argument
        sizes = options.workers.model_dump()
        if not isinstance(resume, bool):
            raise ConfigurationError(
                "resume", f"expected True or False, got {type(resume).__name__}"
            )
        if isinstance(tools, Tool) or callable(tools):
            raise ConfigurationError(
                "tools", "expected a list of tools, got one: pass tools=[...]"
            )
        if isinstance(tools, str) or not isinstance(tools, Iterable):
            raise ConfigurationError(
                "tools", f"expected a list of tools, got {type(tools).__name__}"
            )
        try:
            self._tools = as_tools(list(tools))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError("tools", str(exc)) from None
        self.model = model
        self._meters: dict[str, RunMeter] = {}
        self._metered = MeteredModel(model, self._meters)
        self.store: Store = store if store is not None else MemoryStore()
        if not isinstance(self.store, ToolEffectLedger) and any(
            t.side_effect for t in self._tools.values()
        ):
            logger.warning(
                "%r keeps no tool effects (replan.store.ToolEffectLedger): a "
                "side-effect call of a task retried or resumed runs again",
                self.store,
            )
        self._owner = new_owner()
        """Who this supervisor is, as the owner of the runs it leases."""
        self._leases = self.store if isinstance(self.store, RunLeases) else None
        """The store's run leases, when it has them (see ``_leases``)."""
        self._journal: Store = (
            self.store
            if self._leases is None
            else owned_journal(self._leases, self._owner)
        )
        """What the runs append through (naming their owner, if leased)."""
        self.gates = GateRegistry(self._gate_elsewhere)
        """The open human gates: ``pending()`` and ``await resolve(id, resolution)``."""
        self._task_runner = task_runner
        self._sizes = sizes
        self._telemetry = Telemetry(
            tracer_provider,
            meter_provider,
            provider_name=str(getattr(model, "provider_name", None) or "unknown"),
        )
        self._pool_options: dict[str, Any] = {
            "mailbox_size": options.mailbox_size,
            "max_restarts": options.max_restarts,
            "restart_period_s": options.restart_period_s,
            "telemetry": self._telemetry,
        }
        self._temperatures = (
            options.executor_temperature,
            options.evolver_temperature,
        )
        self._roles: Roles | None = None
        self._records: dict[str, RunRecord] = {}
        # Finished runs still in memory, oldest first (a dict: forget() takes
        # one out of the middle).
        self._finished: dict[str, None] = {}
        self._keep_finished = options.keep_finished
        self._drivers: dict[str, RunDriver] = {}
        requests = self.store if isinstance(self.store, RunRequests) else None
        self._forwarding = (
            None
            if self._leases is None or requests is None
            else Forwarding(
                requests,
                self._leases,
                self.store,
                self._owner,
                self.gates,
                self._drivers,
            )
        )
        """Gate answers and cancels for runs other supervisors drive: sent
        on, and applied to the runs this one drives (see ``_forwarding``)."""
        self._taking_up: dict[str, anyio.Event] = {}
        """Runs whose journal is being written (submit) or read (resume) before
        a driver starts: another resume of one waits for the first to end, so
        that a run never gets two drivers."""
        self._let_go: dict[str, anyio.CancelScope] = {}
        """Each driven run's scope, cancelled when another supervisor took
        its lease over (see ``_leases``)."""
        self._crashes: dict[str, Exception] = {}
        """Why the driver of a run let go of unfinished had to stop."""
        self._unreadable: set[str] = set()
        """Unfinished runs whose journal a resume found it cannot read back:
        :meth:`_drive_on` leaves them alone (they were logged)."""
        self._task_group: TaskGroup | None = None
        self._serve_scope: anyio.CancelScope | None = None
        self._exit_stack: AsyncExitStack | None = None
        self._stopping = False
        self._served = False
        """serve() has ended: a supervisor serves once."""
        self._resume_on_start = resume

    # Lifecycle ----------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._check_can_serve()  # here, where the error is not in a group
        self._hold_lease(exclusive=self._resume_on_start)
        try:
            async with AsyncExitStack() as stack:
                tg = await stack.enter_async_context(anyio.create_task_group())
                try:
                    await tg.start(self.serve)
                except Exception as exc:
                    # serve() ended before it served (resuming runs failed):
                    # raised as it was, not wrapped by this group on its way
                    # out.
                    failure = exc
                else:
                    self._exit_stack = stack.pop_all()
                    return self
        except BaseExceptionGroup as group:
            lone = lone_exit(group)
            if lone is None:
                raise
            raise lone from None  # an interrupt while resuming runs
        raise failure

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self.stop()
        stack, self._exit_stack = self._exit_stack, None
        if stack is not None:
            # The body's exception is the caller's to catch as it is: handed
            # to the task group, it would come out wrapped in an
            # ExceptionGroup. The group only waits for serve() to end.
            try:
                await stack.aclose()
            except BaseExceptionGroup as group:
                lone = lone_exit(group)
                if lone is None:
                    raise
            else:
                return None
            # An interrupt that stopped serve(), raised out of the group's
            # handler: an error of the body's (a cleanup that failed as it
            # was cancelled) is its context, shown, not hidden; the body's
            # own cancellation is no part of the story.
            cancelled = anyio.get_cancelled_exc_class()
            lone.__suppress_context__ = exc is None or isinstance(exc, cancelled)
            raise lone
        return None

    def stop(self) -> None:
        """Stop serving: runs in flight stay in the journal, unfinished.

        From the call on, :meth:`submit` and :meth:`resume` raise
        :class:`SupervisorError`. Before the supervisor serves it does nothing.
        """
        if self._serve_scope is not None:
            self._stopping = True
            self._serve_scope.cancel()

    async def serve(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the actor pools and the runs until cancelled (``tg.start``)."""
        self._check_can_serve()
        self._hold_lease(exclusive=self._resume_on_start)
        try:
            roles = self._build_roles()
        except BaseException:
            self._release_lease()
            raise
        self._roles = roles
        try:
            failure = await self._serve(roles, task_status)
        except BaseExceptionGroup as group:
            lone = lone_exit(group)
            if lone is None:
                raise
            raise lone from None  # an interrupt, as the caller catches it
        if failure is not None:
            raise failure

    async def _serve(
        self, roles: Roles, task_status: TaskStatus[None]
    ) -> Exception | None:
        """Serve until stopped; the failure of resuming the runs on start."""
        failure: Exception | None = None
        try:
            with anyio.CancelScope() as scope:
                self._serve_scope = scope
                async with anyio.create_task_group() as tg:
                    for pool in roles.all():
                        await tg.start(pool.run)
                    self._task_group = tg
                    if self._leases is not None:
                        tg.start_soon(
                            keep_leases,
                            self._leases,
                            self._owner,
                            lambda: [*self._drivers, *self._taking_up],
                            self._still_driving,
                            self._lost_lease,
                        )
                    if self._forwarding is not None:
                        tg.start_soon(self._forwarding.take)
                    try:
                        self._telemetry.watch(roles.all())
                        if self._resume_on_start:
                            try:
                                await self._resume_on_serve()
                            except Exception as exc:
                                # Kept out of the group, which would wrap it
                                # in an ExceptionGroup: raised below as is.
                                failure = exc
                                tg.cancel_scope.cancel()
                        if failure is None:
                            task_status.started()
                            await anyio.sleep_forever()
                    finally:
                        # Shutting down (stop(), or cancelled from outside):
                        # from here no run starts in the closing group.
                        self._stopping = True
                        self._task_group = None
        finally:
            self._stopping = self._served = True
            self._task_group = None
            self._telemetry.unwatch()
            for pool in roles.all():
                pool.stop("the supervisor stopped")
            self.gates.close_all("the supervisor stopped")
            for record in self._records.values():
                record.detach("the supervisor stopped before the run finished")
            self._release_lease()
            if self._leases is not None:
                # Another supervisor takes the runs over at its next look,
                # without waiting for the leases to expire.
                await release(self._leases, self._owner, None)
        return failure

    def _serving(self) -> tuple[TaskGroup, Roles]:
        """The task group and pools to start a run with, while serving."""
        tg, roles = self._task_group, self._roles
        if self._served:
            raise SupervisorError("the supervisor has stopped: it starts no run")
        if self._stopping or (roles is not None and tg is None):
            raise SupervisorError("the supervisor is stopping: it starts no run")
        if tg is None or roles is None:
            raise SupervisorError(
                "the supervisor is not serving: use `async with` or serve()"
            )
        return tg, roles

    def _hold_lease(self, *, exclusive: bool) -> None:
        """Share a durable journal with other supervisors, or hold it alone
        to take over its unfinished runs (see :class:`DriverLease`). A
        store that leases runs one by one needs neither."""
        if self._leases is None and isinstance(self.store, DriverLease):
            self.store.hold_lease(self, exclusive=exclusive)

    def _hold_lease_alone(self) -> None:
        self._hold_lease(exclusive=True)

    def _release_lease(self) -> None:
        if self._leases is None and isinstance(self.store, DriverLease):
            self.store.release_lease(self)

    async def _gate_elsewhere(
        self,
        gate_id: str,
        resolution: GateResolution | Mapping[str, Any],
        stopped: bool = False,
    ) -> Forwarded | None:
        """Send an answer to a gate not open here on to the supervisor that
        drives its run (a gate's id is its run's, ``-g``, a number); on a
        store that keeps no requests, raise :class:`RunDrivenElsewhere` for
        a run another supervisor holds the lease of.

        ``stopped``: the gate was open here, and its run stopped here before
        it journaled the answer; the answer goes on only to a supervisor
        that took the run over (None otherwise).

        Raises:
            GateError: no such gate is open (see ``Forwarding.answer``).
        """
        run_id = gate_of(gate_id)
        forwarding = self._forwarding
        if stopped:
            return await self._after_let_go(gate_id, resolution)
        if forwarding is None or run_id is None or run_id in self._drivers:
            if not isinstance(resolution, GateResolution):
                resolution_from(gate_id, resolution)  # a bad one is named first
            await self._check_elsewhere(run_id)
            raise self.gates.no_open_gate(gate_id)
        return await forwarding.answer(gate_id, resolution)

    async def _after_let_go(
        self, gate_id: str, resolution: GateResolution | Mapping[str, Any]
    ) -> Forwarded | None:
        """Send an answer on to the supervisor that took the gate's run over
        from this one, or to the one that takes it over (it let go of the
        run); None when the run ended here, or is still this one's."""
        run_id = gate_of(gate_id)
        if self._forwarding is None or self._leases is None or run_id is None:
            return None
        driver = self._drivers.get(run_id)
        if driver is not None:
            # It is stopping: its gates were closed as it let go of the run.
            with anyio.move_on_after(FORWARD_WAIT_S):
                await driver.record.done.wait()
            if not driver.record.done.is_set() or driver.state.status.final:
                return None
        try:
            lease = await self._leases.run_lease(run_id)
        except Exception:
            return None  # the journal fails: the run's own error stands
        if lease is not None and lease.owner == self._owner.id:
            return None
        return await self._forwarding.answer(gate_id, resolution)

    async def _check_elsewhere(self, run_id: str | None) -> None:
        """Raise :class:`RunDrivenElsewhere` if another supervisor holds the
        run's lease; nothing when it cannot be told (the journal fails)."""
        leases = self._leases
        if leases is None or not run_id or run_id in self._drivers:
            return
        try:
            lease = await leases.run_lease(run_id)
        except Exception:
            logger.debug("could not look up the lease of run %s", run_id, exc_info=True)
            return
        if lease is not None and lease.owner != self._owner.id:
            raise RunDrivenElsewhere(run_id, lease.holder)

    def _still_driving(self, run_id: str) -> bool:
        driver = self._drivers.get(run_id)
        return driver is not None and not driver.state.status.final

    def _lost_lease(self, run_id: str, lease: RunLease | None) -> None:
        """Let go of a run whose lease is no longer this supervisor's
        (another took it over after this one stalled past its expiry): its
        driver stops, journaling nothing."""
        scope = self._let_go.get(run_id)
        if scope is not None and not scope.cancel_called:
            logger.warning(
                # As a refused append says (see LeaseLost).
                "run %s: its lease is %s now; this supervisor no longer drives it",
                run_id,
                "nobody's" if lease is None else f"{lease.holder}'s",
            )
            scope.cancel()

    async def _resume_on_serve(self) -> None:
        try:
            await self.resume_all()
        except SupervisorError:
            if not self._stopping:
                raise
            # Stopped while resuming: the runs left wait in the journal.

    def _check_can_serve(self) -> None:
        if self._served:
            raise SupervisorError(
                "this supervisor has stopped and does not serve again: "
                "make a new one (resume=True picks up its unfinished runs)"
            )
        if self._roles is not None:
            raise SupervisorError("this supervisor is already serving")

    async def drain(self, grace_s: float) -> None:
        """Stop gracefully: start nothing new, let calls in flight end, stop.

        New submissions are refused at once; runs start no further model
        call or task; what is in flight gets up to ``grace_s`` seconds to
        finish and reach the journal (or the effect ledger). An attempt
        waiting for a person at its tool call's gate is not waited for:
        the gate is journaled, and the resumed run asks again (the call
        had not run), or takes the answer journaled meanwhile (a gate's
        timeout) and runs the call then. Then the supervisor stops, and
        unfinished runs wait in the journal for :meth:`resume`. A drain
        its caller cancels stops the supervisor as one whose grace ran out.
        On a supervisor that is not serving (not started yet, or stopping
        or stopped) it does nothing.

        Raises:
            ConfigurationError: ``grace_s`` is no number of seconds (NaN, a
                string, an int too large for a float), before anything
                changes (field ``grace_s``).
        """
        grace_s = seconds(grace_s, "grace_s")
        if self._task_group is None:
            return
        self._stopping = True
        drivers = list(self._drivers.values())
        for driver in drivers:
            driver.drain()
        try:
            with anyio.move_on_after(grace_s):
                for driver in drivers:
                    await driver.wait_idle()
        finally:
            # Cancelled by its caller, it stops too, as when the grace runs
            # out: the runs it holds wait for the stop.
            self.stop()

    def _build_roles(self) -> Roles:
        model, runner = self._metered, self._task_runner
        tools, approve = self._tools, self._approve_tool_call
        # Through the runs' journal: on a leased store, a side-effect call
        # is recorded (and so run) only while this supervisor holds the run.
        journal = self._journal
        effects = journal if isinstance(journal, ToolEffectLedger) else None
        executor_t, evolver_t = self._temperatures
        opts = self._pool_options
        size = self._sizes
        return Roles(
            planner=ActorPool(
                "planner", lambda: Planner(model), workers=size["planner"], **opts
            ),
            executor=ActorPool(
                "executor",
                lambda: Executor(model, runner, executor_t, tools, approve, effects),
                workers=size["executor"],
                **opts,
            ),
            reviewer=ActorPool(
                "reviewer", lambda: Reviewer(model), workers=size["reviewer"], **opts
            ),
            ranker=ActorPool(
                "ranker", lambda: Ranker(model), workers=size["ranker"], **opts
            ),
            evolver=ActorPool(
                "evolver",
                lambda: Evolver(model, evolver_t),
                workers=size["evolver"],
                **opts,
            ),
            human_gate=ActorPool(
                "human_gate",
                lambda: HumanGate(self.gates),
                workers=size["human_gate"],
                **opts,
            ),
        )

    # Runs ---------------------------------------------------------------------

    async def submit(
        self, spec: RunSpec | Mapping[str, Any], *, run_id: str | None = None
    ) -> RunHandle:
        """Validate ``spec``, journal it, and start the run.

        Args:
            spec: the run.
            run_id: the run's id (letters, digits, ``-`` and ``_``); a new
                random one if not given. A caller that derives it from a
                request's idempotency key looks the journal up first: the
                journal refuses a second run under one id.

        Raises:
            ConfigurationError: the spec is invalid (names the field), or
                ``run_id`` is malformed or a run of this supervisor has it.
            SupervisorError: the supervisor is not serving.
            JournalUnavailable: the journal refused the run's first write.
        """
        if not isinstance(spec, RunSpec):
            if not isinstance(spec, Mapping):
                raise ConfigurationError(
                    "spec",
                    "a RunSpec or a mapping of its fields expected, "
                    f"not {type(spec).__name__}",
                )
            spec = RunSpec.model_validate(spec)  # ConfigurationError if bad
        spec.check_storable()  # a lone surrogate in a string: ConfigurationError
        if run_id is not None and not _RUN_ID.fullmatch(an_id(run_id, "run_id")):
            raise ConfigurationError(
                "run_id", "1 to 200 letters, digits, '-' or '_' expected"
            )
        if run_id is not None and (
            run_id in self._records or run_id in self._taking_up
        ):
            raise ConfigurationError("run_id", f"run {run_id} exists already")
        tg, roles = self._serving()
        run_id = run_id or uuid.uuid4().hex
        now = datetime.now(UTC)
        deadline = spec.limits.deadline_s
        event = RunSubmitted(
            seq=1,
            at=now,
            run_id=run_id,
            spec=spec,
            deadline_at=now + timedelta(seconds=deadline) if deadline else None,
        )
        state = apply(None, event)
        # Journaled before it is driven: a resume that finds it in the journal
        # meanwhile waits for this driver instead of starting another.
        with self._taking_up_run(run_id):
            try:
                await self._journal.append(run_id, [event], summary_of(state))
            except ReplanError:
                raise
            except Exception as exc:
                raise JournalUnavailable(
                    f"run {run_id} was not started: the journal refused its "
                    f"first write ({type(exc).__name__}: {exc}); if the write "
                    "went through after all, resume() drives the run, so look "
                    "it up before submitting again",
                    run_id=run_id,
                ) from exc
            record = RunRecord(state)
            self._records[run_id] = record
            self._start(tg, self._driver(record, roles))
        return self._handle(record)

    @contextmanager
    def _taking_up_run(self, run_id: str) -> Iterator[None]:
        """Mark ``run_id`` as being taken up until its driver has started (or
        taking it up failed). Entered with no checkpoint between the check
        that nobody takes it up and this mark."""
        assert run_id not in self._taking_up
        self._taking_up[run_id] = taken = anyio.Event()
        try:
            yield
        finally:
            del self._taking_up[run_id]
            taken.set()

    @property
    def owner(self) -> RunOwner:
        """Who this supervisor is as the owner of the runs it leases, on a
        store that leases runs one by one (``PostgresStore``): its id is
        unique to this supervisor, its ``holder`` names the host and the
        process (``host:pid``)."""
        return self._owner

    def drives(self, run_id: str) -> bool:
        """Whether this supervisor drives the run now (or is starting to).

        Raises:
            ConfigurationError: ``run_id`` is no string (field ``run_id``).
        """
        run_id = an_id(run_id, "run_id")
        return run_id in self._drivers or run_id in self._taking_up

    def _driver(self, record: RunRecord, roles: Roles) -> RunDriver:
        """A driver for ``record`` with this supervisor's journal and telemetry."""
        return RunDriver(record, roles, self._journal, self.gates, self._telemetry)

    def _start(self, tg: TaskGroup, driver: RunDriver, *, quiet: bool = False) -> None:
        """Drive a run: its model calls are metered from now on.

        ``tg`` is the group seen before the journal was read or written: if
        the supervisor began to stop meanwhile, the run is not started (it
        waits in the journal, unfinished) and SupervisorError is raised.
        """
        run_id = driver.state.run_id
        if tg is not self._task_group or self._stopping:
            for gate in driver.state.open_gates:  # listed again by resume()
                self.gates.close(gate.request.gate_id, "the supervisor stopped")
            driver.record.detach("the supervisor stopped before the run started")
            raise SupervisorError(
                f"the supervisor stopped before run {run_id} started: it "
                "waits in the journal for resume() (resume=True on start)"
            )
        self._drivers[run_id] = driver
        self._meters[run_id] = driver.meter
        self._let_go[run_id] = anyio.CancelScope()
        self._crashes.pop(run_id, None)
        tg.start_soon(self._drive, driver, quiet)

    async def _drive(self, driver: RunDriver, quiet: bool) -> None:
        scope = self._let_go[driver.state.run_id]
        try:
            with scope:
                await driver.run()
            if scope.cancel_called:
                driver.record.detach("another supervisor took the run over")
                self._forget_lost(driver.record)
        except Exception as exc:
            # A bug in one run must not take the supervisor and its other
            # runs down; the run stays unfinished in the journal. So does a
            # run whose journal failed (a full disk, a lost connection).
            # ``quiet``: whoever drove it on again reports it instead.
            run_id = driver.state.run_id
            lost = lease_lost(exc)
            if lost is not None:
                # Not a failure: another supervisor drives the run now.
                logger.warning("%s", lost)
                driver.record.detach(f"another supervisor took the run over: {lost}")
                self._forget_lost(driver.record)
                return
            outage = _journal_outage(self.store, exc)
            if self._leases is not None:
                # Free for another supervisor (or this one's next look); in
                # an outage it expires instead, as the line below says.
                await release(
                    self._leases, self._owner, [run_id], quiet=outage is not None
                )
            if quiet:
                logger.debug("run %s crashed again", run_id, exc_info=True)
            elif outage is not None:
                # The journal's outage, not the run's bug: one line per run
                # (an outage lets go of every run at once), the traceback
                # for debugging only.
                logger.warning(
                    "run %s is let go of, unfinished: its journal cannot be "
                    "reached (%s); it waits there to be taken up again once "
                    "the journal is back",
                    run_id,
                    outage,
                )
                logger.debug("run %s: the journal's failure", run_id, exc_info=True)
            else:
                logger.exception("run %s crashed", run_id)
            self._crashes[run_id] = exc
            driver.record.detach(
                "the run's driver crashed (see the log)"
                if outage is None
                else f"its journal cannot be reached ({outage}): it waits there, "
                "unfinished, to be taken up again once the journal is back"
            )
            if self._leases is not None:
                # Not this supervisor's any more: its lease is let go of, or
                # lapses, and whichever supervisor claims it next (this one
                # too) drives it on, with a handle of its own.
                self._forget_lost(driver.record)
        finally:
            run_id = driver.state.run_id
            self._drivers.pop(run_id, None)
            self._meters.pop(run_id, None)
            if self._let_go.get(run_id) is scope:
                del self._let_go[run_id]
            if driver.state.status.final:
                self._forget_oldest_finished(run_id)

    def _forget_lost(self, record: RunRecord) -> None:
        """Drop a run another supervisor took over, or may take over (on a
        store that leases runs, one this supervisor let go of unfinished):
        it is not this one's, so this one neither lists it (``handles()``,
        ``get()``) nor counts it with its own unfinished runs. Its journal
        tells how it goes on; a handle on it already given out still says
        why it stopped here."""
        run_id = record.state.run_id
        if self._records.get(run_id) is record:
            del self._records[run_id]

    def _forget_oldest_finished(self, run_id: str) -> None:
        self._finished[run_id] = None
        while len(self._finished) > self._keep_finished:
            oldest = next(iter(self._finished))
            del self._finished[oldest]
            self._records.pop(oldest, None)

    async def _approve_tool_call(
        self, run_id: str, task_id: str, call: ToolCall
    ) -> GateResolution:
        driver = self._drivers.get(run_id)
        if driver is None:
            return GateResolution(
                decision="reject", by="supervisor", note="the run is not active"
            )
        return await driver.approve_tool_call(task_id, call)

    async def resume(self, run_id: str) -> RunHandle:
        """Drive an unfinished run on from its journal (after a restart).

        Completed tasks are not run again and the plan is not made again;
        attempts that finished without being journaled are taken from the
        store's effect ledger; open gates are listed in :attr:`gates` again.
        An explore run takes its journaled steps from the journal (no model
        call is made again for them) and waits again at a review gate left
        open, the same gate. A finished run gets a handle on its journaled
        result, and a run this supervisor drives the handle it has. A run it
        let go of unfinished (its journal failed, say) is resumed like any
        other, with a new handle.

        Within this supervisor a run has one driver at most: a run being
        submitted or resumed at the same moment (its journal written or read,
        its driver not yet started) is waited for, and its handle returned.
        Taking over runs needs the journal to itself: with a store shared by
        processes (``SQLiteStore``), no other supervisor may be serving on
        it, lest a run be driven twice and its tasks run again. A store that
        leases runs one by one (``PostgresStore``, see
        :class:`~replan.store.RunLeases`) needs only the run's lease: it is
        claimed here, unless another live supervisor holds it.

        Raises:
            UnknownRunError: the store has no events for the run.
            SupervisorError: the supervisor is not serving.
            RunDrivenElsewhere: another supervisor holds the run's lease
                (names it).
            ConfigurationError: another supervisor serves on the same journal
                (field ``store``), or ``run_id`` is no string.
        """
        run_id = an_id(run_id, "run_id")
        return await self._resume(run_id, hold_lease=True, quiet=False)

    async def _resume(
        self,
        run_id: str,
        *,
        hold_lease: bool,
        quiet: bool,
        listed_unfinished: bool = False,
    ) -> RunHandle:
        """See :meth:`resume`. ``listed_unfinished``: the run was listed as
        one to take up; one that another supervisor drove to its end since
        raises :class:`_EndedElsewhere` instead of getting a handle here."""
        tg, roles = self._serving()
        while (taken := self._taking_up.get(run_id)) is not None:
            # Being submitted or resumed: its driver, if it gets one, is the
            # run's only driver.
            await taken.wait()
        known = self._records.get(run_id)
        if known is not None and (run_id in self._drivers or known.state.status.final):
            return self._handle(known)
        # Otherwise unknown here, or let go of unfinished (its driver
        # crashed, its journal failed): driven on from the journal.
        with self._taking_up_run(run_id):
            return await self._take_up(
                run_id, tg, roles, hold_lease, quiet, listed_unfinished
            )

    async def _take_up(
        self,
        run_id: str,
        tg: TaskGroup,
        roles: Roles,
        hold_lease: bool,
        quiet: bool,
        listed_unfinished: bool = False,
    ) -> RunHandle:
        leases = self._leases
        # Claimed before the journal is read: its previous owner, should it
        # still live, can append nothing after that (see ``_leases``).
        claimed = leases is not None and await claim(leases, self._owner, run_id)
        try:
            events = await self.store.read(run_id)
            if not events:
                raise UnknownRunError(run_id)
            state = fold_journal(run_id, events)
            record = RunRecord(state)
            if state.status.final:
                if listed_unfinished and leases is not None and not claimed:
                    # Another supervisor took it up and drove it to its end
                    # since the listing: not resumed here, nor a run of this
                    # supervisor's (its handles, a daemon's count of them).
                    raise _EndedElsewhere(run_id)
                if claimed:
                    assert leases is not None
                    await self._settle_row(leases, run_id, state)
                self._records[run_id] = record
                record.install(state, events)
                # Counted with the runs that finished here: a supervisor that
                # looks up old results this way stays bounded too.
                self._forget_oldest_finished(run_id)
                return self._handle(record)
            if leases is not None and not claimed:
                # Unfinished in its journal, yet not in the runs table: its
                # row is damaged.
                raise JournalCorrupt(
                    f"{self.store!r}: run {run_id}: its journal is unfinished "
                    "and its row in the runs table is not",
                    run_id=run_id,
                )
            # Registered only once it can be driven: a run refused here (the
            # lease, an unreadable ledger) is not left held with no driver.
            if hold_lease:
                self._hold_lease(exclusive=True)
            store = self.store
            effects = (
                await store.read_effects(run_id)
                if isinstance(store, EffectLedger)
                else []
            )
            forwarding = self._forwarding
            answers: dict[str, GateResolution] = {}
            cancelled = False
            sent: list[RunRequest] = []
            if forwarding is not None:
                answers, cancelled, sent = await forwarding.waiting_for(run_id)
            self._records[run_id] = record
            driver = self._driver(record, roles)
            recovery = Recovery(
                events,
                effects,
                answers,
                None if forwarding is None else forwarding.withdrawal,
            )
            recovery.list_gates(driver)
            driver.recovery = recovery
            driver.unpicked = effects
            # A cancel sent while nobody drove the run: it ends before any of
            # its cut-short work (a side-effect tool's task) starts again; the
            # request is settled at the next look for requests.
            driver.cancel_at_start = cancelled
            self._start(tg, driver, quiet=quiet)
            if forwarding is not None and sent:
                tg.start_soon(forwarding.taken_over, sent)
        except BaseException:
            if claimed:
                assert leases is not None
                await release(leases, self._owner, [run_id])
            raise
        logger.log(
            logging.DEBUG if quiet else logging.INFO,
            "resumed run %s at seq %d",
            run_id,
            state.seq,
        )
        return self._handle(record)

    async def _settle_row(
        self, leases: RunLeases, run_id: str, state: RunState
    ) -> None:
        """Set right a run's row that says it is unfinished while its journal
        says it ended (a table restored apart from the others, an edit by
        hand), and let go of its lease: otherwise every look for runs to
        take up claims it again, and it is listed as running for good."""
        logger.warning(
            "run %s: the journal's runs table says it is unfinished, its "
            "events that it ended (%s): its row is set right from its events",
            run_id,
            state.status,
        )
        await self.store.append(run_id, [], summary_of(state))
        await release(leases, self._owner, [run_id])

    async def resume_all(self) -> list[RunHandle]:
        """Resume every run the store holds as running or waiting for a person.

        A run whose journal cannot be read (a damaged row, an event this
        version cannot parse) is logged and left as it is; the others resume.
        Runs this supervisor drives already keep their driver (their handles
        are returned), so it may be called at any time, periodically too.
        On a store that leases runs one by one (``PostgresStore``), only
        the runs this supervisor can claim are resumed: those another live
        supervisor holds are left to it, and one it drove to its end
        before this one could claim it is left out (no handle here).

        Raises:
            ConfigurationError: another supervisor serves on the same journal
                (field ``store``); see :meth:`resume`.
        """
        self._hold_lease(exclusive=True)
        handles: list[RunHandle] = []
        damaged: set[str] = set()  # each call says so again
        run_ids = await self._runs_to_take_up(damaged)
        self._unreadable |= damaged
        for run_id in reversed(run_ids):
            # A SQLite journal reads without yielding: thousands of runs
            # would hold the event loop (a daemon's HTTP API) until all
            # had resumed.
            await anyio.lowlevel.checkpoint()
            try:
                handles.append(
                    await self._resume(
                        run_id, hold_lease=False, quiet=False, listed_unfinished=True
                    )
                )
            except (RunDrivenElsewhere, _EndedElsewhere):
                continue  # another live supervisor's
            except SupervisorError:
                raise
            except (ReplanError, ValueError) as exc:
                # ValueError: pydantic's ValidationError and JSON errors too.
                _log_unreadable(run_id, exc)
                self._unreadable.add(run_id)
        return handles

    async def _drive_on(self) -> list[RunHandle]:
        """Resume the journal's unfinished runs this supervisor does not drive:
        those it let go of (their journal failed), or that nobody drives.
        Returns the handles of the runs it drove on.

        The daemon calls it periodically: a run whose journal cannot be
        read back is logged once (here or by :meth:`resume_all`) and left
        as it is. A run driven on here that crashes again is not logged (at
        debug only): the caller reports it (see :meth:`_crash`).

        On a store that leases runs one by one, these are the runs it can
        claim: also those of a supervisor whose process died (their leases
        expired).

        Raises:
            ConfigurationError: another supervisor holds the journal's lease
                (field ``store``): the runs may be its own.
            SupervisorError: the supervisor is stopping.
            Exception: the journal cannot be read (a full disk, a lost
                connection).
        """
        # In a worker thread: a lease is a blocking call (a file lock, or a
        # store of the application's own), which must not hold up the event
        # loop. A store with run leases claims each run instead (_take_up).
        if self._leases is None:
            await anyio.to_thread.run_sync(self._hold_lease_alone)
        handles: list[RunHandle] = []
        unreadable = self._unreadable
        for run_id in reversed(await self._runs_to_take_up(unreadable)):
            if run_id in unreadable or self.drives(run_id):
                continue
            try:
                handle = await self._resume(
                    run_id, hold_lease=False, quiet=True, listed_unfinished=True
                )
            except (RunDrivenElsewhere, _EndedElsewhere):
                continue  # another live supervisor's
            except SupervisorError:
                raise
            except (ReplanError, ValueError) as exc:
                _log_unreadable(run_id, exc)
                unreadable.add(run_id)
                continue
            if not handle.status.final:
                handles.append(handle)
        return handles

    def _crash(self, run_id: str) -> Exception | None:
        """Why the run's driver stopped, if this supervisor let go of the run
        unfinished and has not driven it on since."""
        return None if self.drives(run_id) else self._crashes.get(run_id)

    async def _runs_to_take_up(self, unreadable: set[str]) -> list[str]:
        """The journal's unfinished runs, newest first: on a store with run
        leases, only those this supervisor may claim (the others' are not
        tried one by one)."""
        if self._leases is not None:
            return await self._leases.claimable_runs(self._owner)
        return await self._unfinished_runs(unreadable)

    async def _unfinished_runs(self, unreadable: set[str]) -> list[str]:
        """The journal's runs running or waiting for a person, newest first.

        A damaged summary row is logged (once, when its run is not in
        ``unreadable``, to which it is added) and left out.
        """
        unfinished = [RunStatus.RUNNING, RunStatus.WAITING_FOR_HUMAN]
        run_ids: list[str] = []
        offset, page = 0, 500
        while True:
            try:
                rows = await self.store.list_runs(
                    statuses=unfinished, limit=page, offset=offset
                )
                seen = len(rows)
            except JournalCorrupt:
                # A damaged summary row: list the page row by row without it.
                rows, seen = [], 0
                for at in range(offset, offset + page):
                    try:
                        one = await self.store.list_runs(
                            statuses=unfinished, limit=1, offset=at
                        )
                    except JournalCorrupt as exc:
                        if exc.run_id not in unreadable:
                            logger.error(
                                "run %s cannot be resumed: %s", exc.run_id, exc
                            )
                            unreadable.add(exc.run_id)
                        seen += 1
                        continue
                    if not one:
                        break
                    rows += one
                    seen += 1
            run_ids.extend(r.run_id for r in rows)
            offset += seen
            if seen < page:
                break
        return run_ids

    def forget(self, run_id: str) -> None:
        """Drop a finished run from memory (its journal stays in the store).

        Raises:
            ConfigurationError: ``run_id`` is no string (field ``run_id``).
        """
        record = self._records.get(an_id(run_id, "run_id"))
        if record is not None and not self.drives(run_id):
            del self._records[run_id]
            self._crashes.pop(run_id, None)
            self._finished.pop(run_id, None)

    def _handle(self, record: RunRecord) -> RunHandle:
        run_id = record.state.run_id

        async def cancel() -> RunRecord | None:
            driver = self._drivers.get(run_id)
            if driver is not None:
                driver.request_cancel()
                return driver.record
            if not record.state.status.final:
                await self._check_elsewhere(run_id)
            return None

        return RunHandle(record, self.store, cancel)

    async def cancel(self, run_id: str) -> Forwarded | None:
        """Cancel a run, wherever it is driven.

        A run this supervisor drives is cancelled here, and the call returns
        None once its end is journaled (at once for a run that ended). On a
        journal shared by supervisors that lease runs one by one
        (``PostgresStore``), a run another supervisor drives, or that nobody
        drives at the moment, is cancelled there: the cancel is kept in the
        journal until the run's driver applies it, and what was sent on is
        returned (:class:`~replan.supervisor.Forwarded`).

        Raises:
            UnknownRunError: the journal has no such run.
            RunDrivenElsewhere: another supervisor drives the run, and the
                store keeps no requests to send the cancel on with.
            SupervisorError: the run did not end here (see
                :meth:`RunHandle.cancel`).
            ConfigurationError: ``run_id`` is no string (field ``run_id``).
        """
        run_id = an_id(run_id, "run_id")
        while (taken := self._taking_up.get(run_id)) is not None:
            await taken.wait()
        record = self._records.get(run_id)
        if record is not None and (
            run_id in self._drivers or record.state.status.final
        ):
            await self._handle(record).cancel()
            return None
        if self._forwarding is None:
            if record is None:
                await self._check_elsewhere(run_id)
                raise UnknownRunError(run_id)
            await self._handle(record).cancel()
            return None
        return await self._forwarding.cancel(run_id)

    def get(self, run_id: str) -> RunHandle:
        """The handle of a run this supervisor started.

        Raises:
            UnknownRunError: no such run in this supervisor, a finished
                one it has forgotten (see ``keep_finished``), or one another
                supervisor took over from it (a run lease it lost), or one
                it let go of unfinished (see :meth:`handles`).
            ConfigurationError: ``run_id`` is no string (field ``run_id``).
        """
        record = self._records.get(an_id(run_id, "run_id"))
        if record is None or self._let_go_of(run_id):
            raise UnknownRunError(run_id)
        return self._handle(record)

    def _let_go_of(self, run_id: str) -> bool:
        """Whether this supervisor let go of the run unfinished (its driver
        crashed, its journal failed) and has not driven it on since. Such a
        run is nobody's until a resume, here or elsewhere: not listed as
        this supervisor's, whatever the store (on one that leases runs its
        record is dropped as well, see :meth:`_forget_lost`)."""
        if run_id not in self._crashes or run_id in self._drivers:
            return False
        record = self._records.get(run_id)
        return record is None or not record.state.status.final

    def pool_statistics(self) -> list[PoolStatistics]:
        """Each actor role's pool: workers, busy, mailbox depth, restarts."""
        roles = self._roles
        return [] if roles is None else [pool.statistics() for pool in roles.all()]

    def totals(self) -> SupervisorTotals:
        """What this supervisor's runs did since it was made: runs ended by
        status, replan decisions by trigger and outcome, model tokens by role
        and kind. These are the counts of the ``replan.runs``,
        ``replan.replans`` and ``replan.usage.tokens`` metrics, kept whether
        or not a metrics SDK is installed; they are not read back from the
        journal, so a restarted process counts from zero."""
        t = self._telemetry
        return SupervisorTotals(
            runs_ended={str(k[0]): int(v) for k, v in t.runs.totals.items()},
            replans={
                (str(k[0]), str(k[1])): int(v) for k, v in t.replans.totals.items()
            },
            tokens={(str(k[0]), str(k[1])): int(v) for k, v in t.tokens.totals.items()},
        )

    def handles(self) -> list[RunHandle]:
        """Handles of every run started by this supervisor, oldest first.

        A run it no longer drives is left out: one it let go of unfinished
        (its journal failed: a full disk, a PostgreSQL server out of reach
        for longer than the store waits), until :meth:`resume` (or the
        daemon's next look for runs to drive on) takes it up again, and, on
        a store that leases runs one by one (``PostgresStore``), one another
        supervisor took over.
        """
        crashes = self._crashes
        return [
            self._handle(r)
            for run_id, r in self._records.items()
            if not (crashes and self._let_go_of(run_id))
        ]

    async def replay(self, run_id: str) -> RunResult:
        """Rebuild a run's result from its journal alone.

        Raises:
            UnknownRunError: the store has no events for the run.
            ConfigurationError: ``run_id`` is no string (field ``run_id``).
        """
        events = await self.store.read(an_id(run_id, "run_id"))
        if not events:
            raise UnknownRunError(run_id)
        return fold_journal(run_id, events).result()


@dataclass(frozen=True)
class SupervisorTotals:
    """Counts since a supervisor was made (:meth:`Supervisor.totals`)."""

    runs_ended: dict[str, int]
    """Runs that ended, by final status (``completed``, ``failed``...)."""
    replans: dict[tuple[str, str], int]
    """Replan decisions, by (trigger, outcome); trigger ``none`` when the
    decision had none."""
    tokens: dict[tuple[str, str], int]
    """Model tokens, by (role, ``input`` or ``output``)."""


class _EndedElsewhere(Exception):
    """A run listed as unfinished that another supervisor drove to its end
    before this one could claim it."""


def _journal_outage(store: object, exc: BaseException) -> str | None:
    """What the store says is wrong, when a run's failure is its journal's
    outage (a PostgreSQL server out of reach for longer than the store
    waits for it: see ``PostgresStore.outage``); None otherwise."""
    outage = getattr(store, "outage", None)
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if not isinstance(outage, str) or isinstance(exc, ReplanError):
        return None
    return outage


def _log_unreadable(run_id: str, exc: Exception) -> None:
    logger.error(
        "run %s cannot be resumed, its journal could not be read: %s: %s",
        run_id,
        type(exc).__name__,
        " ".join(str(exc).split()),
    )
