"""A supervisor's run leases, on a store that leases runs one by one.

On such a store (:class:`~replan.store.RunLeases`: ``PostgresStore``) every
supervisor drives the runs whose leases it holds: those it submits (the
first append takes the lease) and those it claims on resuming (nobody held
them, or their holder's lease expired: its process died). A background
task renews them every third of the lease's duration; a run another
supervisor took over meanwhile (this one stalled past the expiry) is let
go of here. The driver's appends, and its records of finished attempts and
side-effect tool calls, go through :class:`OwnedJournal`, which names the
owner, so the store refuses those of a run that is no longer this
supervisor's (:class:`~replan.LeaseLost`).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Sequence

import anyio

from .._errors import LeaseLost, RunDrivenElsewhere
from ..messages import Event, RunStatus
from ..store import (
    EffectLedger,
    EffectRecord,
    RunLease,
    RunLeases,
    RunOwner,
    RunSummary,
    Store,
    ToolEffectLedger,
    ToolEffectRecord,
)

logger = logging.getLogger("replan.supervisor")


def new_owner() -> RunOwner:
    """An owner unique to one supervisor, named ``host:pid`` for people."""
    return RunOwner(id=uuid.uuid4().hex, holder=f"{socket.gethostname()}:{os.getpid()}")


class OwnedJournal:
    """The store as one owner's runs' drivers append to it."""

    def __init__(self, store: RunLeases, owner: RunOwner) -> None:
        self._store = store
        self._owner = owner

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        await self._store.append(run_id, events, summary, owner=self._owner)

    async def read(self, run_id: str, after: int = 0) -> list[Event]:
        return await self._as_store().read(run_id, after)

    async def get_run(self, run_id: str) -> RunSummary | None:
        return await self._as_store().get_run(run_id)

    async def list_runs(
        self,
        *,
        statuses: Sequence[RunStatus] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RunSummary]:
        return await self._as_store().list_runs(
            statuses=statuses, limit=limit, offset=offset
        )

    async def aclose(self) -> None:
        """The store is its opener's to close."""

    def _as_store(self) -> Store:
        store = self._store
        assert isinstance(store, Store)
        return store


class OwnedLedgerJournal(OwnedJournal):
    """:class:`OwnedJournal` of a store with an effect ledger and tool
    effects, whose records are fenced by the run's lease as its appends
    are: a driver that lost the run records no task's outcome there, and
    no side-effect tool call as started (so it does not run it)."""

    async def record_effect(self, run_id: str, record: EffectRecord) -> None:
        await self._store.record_effect(run_id, record, owner=self._owner)

    async def read_effects(self, run_id: str) -> list[EffectRecord]:
        store = self._store
        assert isinstance(store, EffectLedger)
        return await store.read_effects(run_id)

    async def record_tool_effect(self, run_id: str, record: ToolEffectRecord) -> None:
        await self._store.record_tool_effect(run_id, record, owner=self._owner)

    async def read_tool_effects(
        self, run_id: str, task_id: str | None = None
    ) -> list[ToolEffectRecord]:
        store = self._store
        assert isinstance(store, ToolEffectLedger)
        return await store.read_tool_effects(run_id, task_id)


def owned_journal(store: RunLeases, owner: RunOwner) -> Store:
    """What a driver appends through (and its executor records tool calls
    in): the store, naming ``owner``."""
    if isinstance(store, EffectLedger) and isinstance(store, ToolEffectLedger):
        return OwnedLedgerJournal(store, owner)
    return OwnedJournal(store, owner)


async def claim(leases: RunLeases, owner: RunOwner, run_id: str) -> bool:
    """Take the run's lease for ``owner``.

    Returns:
        True once it holds it; False for a run the store does not hold
        unfinished (the journal says whether it is finished or unknown).

    Raises:
        RunDrivenElsewhere: another supervisor holds it.
    """
    lease = await leases.claim_run(run_id, owner)
    if lease is None:
        return False
    if lease.owner != owner.id:
        raise RunDrivenElsewhere(run_id, lease.holder)
    return True


async def release(
    leases: RunLeases,
    owner: RunOwner,
    run_ids: Sequence[str] | None,
    *,
    quiet: bool = False,
) -> None:
    """Let go of the leases of ``run_ids`` (all of ``owner``'s if None),
    never failing nor cancelled: an unreachable journal lets them expire
    instead (logged unless ``quiet``: the caller says so)."""
    with anyio.CancelScope(shield=True):
        try:
            await leases.release_leases(owner, run_ids)
        except Exception as exc:
            if quiet:
                return
            logger.warning(
                "could not let go of the leases of %s; they expire: %s: %s",
                "every run" if run_ids is None else ", ".join(run_ids),
                type(exc).__name__,
                " ".join(str(exc).split()),
            )


async def keep_leases(
    leases: RunLeases,
    owner: RunOwner,
    driven: Callable[[], list[str]],
    still_driving: Callable[[str], bool],
    let_go: Callable[[str, RunLease | None], None],
) -> None:
    """Renew ``owner``'s leases of the runs ``driven()`` lists (those it
    drives, or is taking up) every third of their duration, until cancelled.

    A run ``driven()`` lists that the renewal no longer finds ``owner``'s
    (another owner holds it now, or nobody) is handed to ``let_go`` with
    its lease, unless it ended meanwhile (``still_driving`` is False). A
    renewal that fails (the server is down) is logged once per streak and
    tried again: the journal's fencing keeps a run that expired meanwhile
    from two writers.
    """
    interval = leases.lease_s / 3
    failing = False
    while True:
        await anyio.sleep(interval)
        runs = driven()
        if not runs:
            # Nothing to renew, nothing learned: a streak of failures is
            # not said to end before a renewal reaches the journal.
            continue
        try:
            held = await leases.renew_leases(owner, runs)
            lost = [r for r in runs if r not in held and still_driving(r)]
            taken = [(r, await leases.run_lease(r)) for r in lost]
        except Exception as exc:
            if not failing:
                logger.warning(
                    "could not renew the run leases (tried again every "
                    "%gs; another supervisor takes over the runs once they "
                    "expire): %s: %s",
                    interval,
                    type(exc).__name__,
                    " ".join(str(exc).split()),
                )
            failing = True
            continue
        if failing:
            logger.warning("the run leases are renewed again")
            failing = False
        for run_id, lease in taken:
            # Checked again: a run that ended meanwhile let go of its lease.
            if still_driving(run_id) and (lease is None or lease.owner != owner.id):
                let_go(run_id, lease)


def lease_lost(exc: BaseException) -> LeaseLost | None:
    """The :class:`~replan.LeaseLost` a driver's failure is, if it is one
    (it may come out of the driver's task groups wrapped)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, LeaseLost):
        return exc
    cause = exc.__cause__ or exc.__context__
    return None if cause is None or cause is exc else _direct(cause)


def _direct(exc: BaseException) -> LeaseLost | None:
    return exc if isinstance(exc, LeaseLost) else None
