from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from .._errors import JournalConflict as JournalConflict
from .._errors import JournalCorrupt as JournalCorrupt
from .._errors import LeaseLost as LeaseLost
from ..messages import (
    Event,
    GateResolution,
    ModelCall,
    ModelFailure,
    RunCompacted,
    RunStatus,
    TaskOutcome,
)
from ..messages._base import Frozen


class RunSummary(Frozen):
    """One row of the ``runs`` table: what a listing needs without replay."""

    run_id: str
    goal: str
    kind: str
    pattern: str
    status: RunStatus
    created_at: datetime
    updated_at: datetime
    last_seq: int
    stop_reason: str | None = None


@runtime_checkable
class Store(Protocol):
    """The run journal: append-only events per run, plus a small runs table.

    ``append`` is atomic: all the events of one call are stored, or none.
    Events of a run are numbered from 1 without gaps (``Event.seq``); a store
    refuses an event whose ``seq`` is not the next one, so two writers can
    never interleave one run's journal.
    """

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        """Append ``events`` to the run's journal and upsert its summary row.

        The supervisor's summaries carry the ``last_seq`` and ``updated_at``
        of the newest event; a store may take those two from the events
        instead of rewriting the row on every append (``SQLiteStore`` does).

        A caller cancelled during the call (or as it makes it) is cancelled
        only once the call is done: the events are journaled, or the call
        raises, and the supervisor counts on it.

        Raises:
            JournalConflict: an event's ``seq`` is not the next in the run.
        """
        ...

    async def read(self, run_id: str, after: int = 0) -> list[Event]:
        """The run's events with ``seq > after``, in order (empty if unknown)."""
        ...

    async def get_run(self, run_id: str) -> RunSummary | None:
        """The run's summary row, or None."""
        ...

    async def list_runs(
        self,
        *,
        statuses: Sequence[RunStatus] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RunSummary]:
        """Summaries, newest first, optionally only those with ``statuses``."""
        ...

    async def aclose(self) -> None:
        """Release the store's resources (idempotent)."""
        ...


@runtime_checkable
class DriverLease(Protocol):
    """A durable store shared by processes: who may drive its runs.

    Every supervisor serving on the store holds the lease shared: it drives
    the runs it starts. Taking over unfinished runs (``resume``) needs it
    alone: a run another live supervisor drives would otherwise be driven
    twice, its tasks and side effects run again.
    """

    def hold_lease(self, holder: object, *, exclusive: bool) -> None:
        """Hold the lease for ``holder`` (a supervisor), or convert the one
        it holds, without waiting.

        Raises:
            ConfigurationError: another supervisor, in this process or
                another, holds it so that this one cannot (field ``store``).
        """
        ...

    def release_lease(self, holder: object) -> None:
        """Let go of ``holder``'s lease (idempotent)."""
        ...


class RunOwner(Frozen):
    """A supervisor as the owner of the runs it drives on a leased store."""

    id: str
    """Unique to one supervisor instance (a new one per supervisor)."""
    holder: str
    """Who it is, for people: ``host:pid``."""


class RunLease(Frozen):
    """Who holds a run's lease, and until when (by the database's clock)."""

    run_id: str
    owner: str
    holder: str
    expires_at: datetime


@runtime_checkable
class RunLeases(Protocol):
    """A store shared by processes that leases its runs one by one.

    A run is driven by the supervisor that holds its lease. The lease is
    taken with the run's first append (``append(..., owner=...)``), or by
    :meth:`claim_run` once nobody holds it or its holder let it expire (its
    process died); its owner renews it (:meth:`renew_leases`) well within
    :attr:`lease_s`; the append of the run's end lets go of it. Every
    append with an ``owner`` checks, in its own transaction, that the owner
    still holds the lease: a supervisor that stalled past the expiry while
    another took the run over gets :class:`~replan.LeaseLost`, so a run
    never has two writers; so does a record of its effect ledger or of a
    side-effect tool call (:meth:`record_effect`, :meth:`record_tool_effect`
    with ``owner``). Times are the database server's, never a
    client's.

    A store with run leases needs no :class:`DriverLease`: supervisors
    sharing it each resume the runs they can claim.
    """

    @property
    def lease_s(self) -> float:
        """How long a lease lasts from its last renewal, in seconds."""
        ...

    async def append(
        self,
        run_id: str,
        events: Sequence[Event],
        summary: RunSummary,
        *,
        owner: RunOwner | None = None,
    ) -> None:
        """:meth:`Store.append`; with ``owner``, only while it holds the
        run's lease (the run's first append takes it, an append of a final
        status lets go of it).

        Raises:
            LeaseLost: another owner holds the run's lease.
            JournalConflict: an event's ``seq`` is not the next in the run.
        """
        ...

    async def record_effect(
        self, run_id: str, record: EffectRecord, *, owner: RunOwner | None = None
    ) -> None:
        """:meth:`EffectLedger.record_effect`; with ``owner``, only while
        it holds the run's lease, checked in the same statement.

        Raises:
            LeaseLost: another owner holds the run's lease, or nobody does.
        """
        ...

    async def record_tool_effect(
        self, run_id: str, record: ToolEffectRecord, *, owner: RunOwner | None = None
    ) -> None:
        """:meth:`ToolEffectLedger.record_tool_effect`; with ``owner``, only
        while it holds the run's lease, checked in the same statement: a
        supervisor that lost the run does not record a tool call as
        started, and so does not run it. A call's result (``content``) is
        also kept once the run has finished (the call was under way as it
        ended): nobody drives a finished run.

        Raises:
            LeaseLost: another owner holds the run's lease, or nobody does.
        """
        ...

    async def claim_run(self, run_id: str, owner: RunOwner) -> RunLease | None:
        """Take the lease of an unfinished run that nobody holds, or whose
        lease expired, or renew ``owner``'s own.

        Returns:
            The lease that holds now: ``owner``'s if it has the run, another
            owner's if that one holds it; None for a run the store does not
            hold unfinished (unknown, or finished).
        """
        ...

    async def renew_leases(self, owner: RunOwner, run_ids: Sequence[str]) -> set[str]:
        """Extend ``owner``'s leases of ``run_ids`` (the runs it drives), in
        one statement; the ids of those it still holds (not those another
        owner took meanwhile). A lease it holds of a run it no longer
        drives (its driver crashed) is left to expire."""
        ...

    async def release_leases(
        self, owner: RunOwner, run_ids: Sequence[str] | None = None
    ) -> None:
        """Let go of ``owner``'s leases of ``run_ids`` (all of them if None),
        so that another supervisor may claim those runs at once."""
        ...

    async def claimable_runs(self, owner: RunOwner) -> list[str]:
        """Ids of the unfinished runs ``owner`` may claim now (nobody holds
        them, their lease expired, or they are its own), newest first."""
        ...

    async def run_lease(self, run_id: str) -> RunLease | None:
        """The run's lease while it holds (not expired), else None."""
        ...


RequestOutcome = Literal["applied", "already_resolved", "refused", "closed"]
"""What became of a forwarded request: ``applied`` (the run journaled the
answer, or ended cancelled), ``already_resolved`` (the gate had another
answer), ``refused`` (the answer no longer fits the gate), ``closed`` (the
gate closed, or the run ended, unanswered)."""


class RunRequest(Frozen):
    """A gate's answer, or a run's cancel, that a supervisor which does not
    drive the run received: kept in the journal until the run's driver
    applies it (see :class:`RunRequests`)."""

    id: int
    run_id: str
    gate_id: str | None = None
    """The gate it answers; None for a cancel."""
    resolution: GateResolution | None = None
    """The answer (None for a cancel)."""
    sender: str
    """Who received it (``host:pid``)."""
    outcome: RequestOutcome | None = None
    """None while it waits for the run's driver."""
    detail: str | None = None
    """Why it was not applied (``already_resolved``, ``refused``, ``closed``)."""


@runtime_checkable
class RunRequests(Protocol):
    """A store with run leases that keeps the requests for runs others drive.

    A gate answer or a cancel that reaches a supervisor which does not hold
    the run's lease is added here; the supervisor that does (or the one that
    takes the run over) finds it among :meth:`waiting_requests`, applies it
    as its own, and settles it (:meth:`settle_request`) once, so the sender
    learns what became of it.
    """

    async def add_request(
        self,
        run_id: str,
        sender: str,
        *,
        gate_id: str | None = None,
        resolution: GateResolution | None = None,
    ) -> tuple[RunRequest, bool]:
        """Keep a gate's answer (``gate_id`` and ``resolution``) or a run's
        cancel (neither).

        Returns:
            The request and True; or, when the gate has an answer here
            already (the first stands) or the run a cancel that waits, that
            one and False.
        """
        ...

    async def get_request(self, request_id: int) -> RunRequest | None:
        """The request, with its outcome once settled (None if gone)."""
        ...

    async def waiting_requests(self, owner: RunOwner) -> list[RunRequest]:
        """The requests that wait for the runs ``owner`` holds the leases
        of, and for runs that ended (or are gone), oldest first."""
        ...

    async def settle_request(
        self, request_id: int, outcome: RequestOutcome, detail: str | None = None
    ) -> bool:
        """Record what became of a request that waits; False if it was
        settled already (the first settlement stands)."""
        ...


class EffectRecord(BaseModel):
    """What one finished task attempt returned, kept until the run is journaled.

    The supervisor writes it the moment the executor returns, before the
    outcome reaches the journal. A run resumed after a crash finds here the
    attempts that finished but were never journaled, and journals them
    instead of running them again.
    """

    model_config = ConfigDict(frozen=True)

    task_id: str
    attempt: int
    outcome: TaskOutcome
    calls: list[ModelCall] = Field(default_factory=list)
    failures: list[ModelFailure] = Field(default_factory=list)
    """The attempt's failed model calls, journaled with its outcome."""
    retry_at: datetime | None = None
    """When a retry may start, as the attempt's transient failure asked (a
    server's ``Retry-After``, counted from the failure): a resumed run waits
    until then, as the run would have. None: no wait was asked (a retry
    backs off as usual). A record written before it was kept has none."""


@runtime_checkable
class EffectLedger(Protocol):
    """A store that keeps finished task attempts apart from the journal."""

    async def record_effect(self, run_id: str, record: EffectRecord) -> None:
        """Keep ``record`` durably (replacing one for the same attempt)."""
        ...

    async def read_effects(self, run_id: str) -> list[EffectRecord]:
        """Every attempt recorded for the run."""
        ...


class ToolEffectRecord(BaseModel):
    """A side-effect tool call: recorded before the tool runs, and again with
    its result once it returns.

    When a task is retried, or its attempt is run again after a crash, and
    the model makes a call that returned before (same tool, same
    arguments), the recorded result is used instead of asking for approval
    and running the tool a second time. A call recorded only as started
    (``content`` None) may or may not have acted; made again, it runs again
    under the same key.
    """

    model_config = ConfigDict(frozen=True)

    key: str
    """The idempotency key the tool ran with: ``RUN:TASK:s<step>c<index>``,
    with ``-2``, ``-3``... appended when a different call had taken that
    key."""
    task_id: str
    tool: str
    arguments: JsonValue
    """The call's validated arguments, as JSON values."""
    content: str | None = None
    """What the tool returned; None while it is not known to have returned."""


@runtime_checkable
class ToolEffectLedger(Protocol):
    """A store that keeps the side-effect tool calls that ran."""

    async def record_tool_effect(self, run_id: str, record: ToolEffectRecord) -> None:
        """Keep ``record`` durably, replacing one with the same task and key
        (the started call's record by the same call's result)."""
        ...

    async def read_tool_effects(
        self, run_id: str, task_id: str | None = None
    ) -> list[ToolEffectRecord]:
        """The calls recorded for the run's task (every task's when
        ``task_id`` is None), in the order they were first recorded."""
        ...


@runtime_checkable
class JournalRetention(Protocol):
    """A store that can fold or drop old finished runs."""

    async def finished_before(
        self, before: datetime, *, include_compacted: bool, limit: int
    ) -> list[str]:
        """Ids of finished runs last updated before ``before``, oldest first."""
        ...

    async def compact_run(self, run_id: str, snapshot: RunCompacted) -> None:
        """Replace the run's events by ``snapshot`` and drop its effect records
        (tool effects included).

        Raises:
            JournalConflict: the journal moved on since ``snapshot`` was made.
        """
        ...

    async def delete_run(self, run_id: str) -> None:
        """Forget the run: its events, summary, effect and tool effect records."""
        ...
