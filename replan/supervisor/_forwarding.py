"""Gate answers and cancels for runs another supervisor drives.

On a store that leases runs one by one and keeps requests
(:class:`~replan.store.RunRequests`: ``PostgresStore``), a supervisor that
receives an answer to a gate of a run it does not drive, or a cancel of
such a run, checks it against the run's journal as its driver would (the
gate is open, the answer fits it, it names who decides) and adds it to the
journal's requests. The supervisor that holds the run's lease finds it at
its next look (every :data:`REQUEST_POLL_S`), applies it as an answer or a
cancel of its own (journaled, the run goes on) and settles it; one that
takes the run over after its driver died applies those left waiting. The
sender waits up to :data:`FORWARD_WAIT_S` to tell its caller what became
of the request.

A request is applied at most once: the gate's answer in the run's journal
is the proof (a driver that died after journaling it, before settling the
request, leaves the next one to find it there), and a cancel ends the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import (
    GateAlreadyResolved,
    GateError,
    ResolutionRefused,
    UnknownRunError,
)
from ..messages import GateRequest, GateResolution, RunStatus, TaskStatus
from ..messages._base import Frozen
from ..messages._spec import check_drafts
from ..store import RequestOutcome, RunLeases, RunOwner, RunRequest, RunRequests, Store
from ._gates import (
    GateRegistry,
    Validator,
    already_resolved,
    check_answer,
    refused_field,
    resolution_from,
)
from ._state import RUN_ENDED_NOTE, RunState, fold_journal

if TYPE_CHECKING:
    from ._run import RunDriver

logger = logging.getLogger("replan.supervisor")

REQUEST_POLL_S = 0.5
"""How often a supervisor looks for requests for the runs it drives."""
FORWARD_WAIT_S = 2.0
"""How long a sender waits for the run's driver to apply a request before
it says the request is on its way."""
_SETTLED_POLL_S = 0.1


class Forwarded(Frozen):
    """A gate answer or a cancel sent on to the supervisor that drives the run."""

    request_id: int
    """The request's row in the journal's ``requests`` table (the same
    answer, or a cancel, sent again while it waits gets the same one)."""
    run_id: str
    gate_id: str | None = None
    """The gate answered; None for a cancel."""
    applied: bool
    """The run's driver applied it already (the answer is journaled, the
    run ended cancelled); else it waits in the journal for it."""
    driven_by: str | None
    """Who drives the run (``host:pid``): the supervisor that took it over
    while the sender waited, for a run nobody drove as it was sent; None
    when nobody does at the moment (the supervisor that takes the run over
    applies it), or when the run ended before its driver could be told."""


def gate_of(gate_id: str) -> str | None:
    """The run of a gate id (``RUN_ID-gN``), if it names one."""
    run_id, sep, _ = gate_id.rpartition("-g")
    return run_id if sep and run_id else None


def answer_check(state: RunState, request: GateRequest) -> Validator:
    """The check the run's driver applies to an answer to ``request``, from
    the run's journal (as a resumed run lists its gates again)."""
    from ._explore import review_check
    from ._run import approval_check

    if request.task_id is not None:
        return approval_check
    if state.spec.kind == "explore":
        return review_check
    if request.proposal is None:
        return _no_edit
    known = frozenset(
        t.id
        for t in state.tasks.values()
        if t.status in (TaskStatus.COMPLETED, TaskStatus.IN_PROGRESS)
    )

    def valid_edit(resolution: GateResolution) -> None:
        if resolution.hypotheses is not None:
            raise ValueError("a replan gate takes edited tasks, not hypotheses")
        if resolution.tasks is not None:
            check_drafts(resolution.tasks, known=known)

    return valid_edit


def _no_edit(resolution: GateResolution) -> None:
    if resolution.decision == "edit":
        raise ValueError("a fixed plan cannot be edited: approve or reject")


class Forwarding:
    """One supervisor's side of the requests: those it sends on, and those
    it applies to the runs it drives."""

    def __init__(
        self,
        requests: RunRequests,
        leases: RunLeases,
        store: Store,
        owner: RunOwner,
        gates: GateRegistry,
        drivers: Mapping[str, RunDriver],
    ) -> None:
        self._requests = requests
        self._leases = leases
        self._store = store
        self._owner = owner
        self._gates = gates
        self._drivers = drivers
        self._applying: set[int] = set()

    # Sending ------------------------------------------------------------------

    async def answer(
        self, gate_id: str, answer: GateResolution | Mapping[str, Any]
    ) -> Forwarded:
        """Send an answer to a gate of a run this supervisor does not drive
        (its fields as a mapping are read as the run reads them).

        The same answer sent again while the first waits (a retry) is
        not kept twice: the call waits for the first, and says what became
        of it.

        Raises:
            GateAlreadyResolved: the gate has an answer (in the journal, or
                another one sent on already, which stands).
            ResolutionRefused: the answer does not fit the gate (names the
                field).
            GateError: no such gate is open (none, or its run ended).
        """
        run_id = gate_of(gate_id)
        state = None if run_id is None else await self._state(run_id)
        info = None if state is None else state.gates.get(gate_id)
        if isinstance(answer, GateResolution):
            resolution = answer
        else:
            review = info is not None and info.request.hypotheses is not None
            resolution = resolution_from(gate_id, answer, review=review)
        if state is None or info is None:
            raise GateError(f"no open gate {gate_id!r}")
        if info.resolution is not None and not _ended_by_run(info.resolution):
            raise GateAlreadyResolved(already_resolved(gate_id, info.resolution))
        if state.status.final or info.resolution is not None:
            raise GateError(
                f"gate {gate_id} is closed: its run ended {state.status.value}"
            )
        check_answer(
            gate_id, info.request, answer_check(state, info.request), resolution
        )
        if info.request.tool_call is not None and (
            await self._leases.run_lease(state.run_id) is None
        ):
            # Withdrawn by whoever takes the run over: the attempt that
            # asked was cut short, and the one run again asks again.
            raise GateError(
                f"gate {gate_id} asks for a tool call of run {state.run_id}, "
                "which no supervisor drives at the moment: the attempt runs "
                "again once one takes the run over, and asks again"
            )
        request, added = await self._requests.add_request(
            state.run_id, self._owner.holder, gate_id=gate_id, resolution=resolution
        )
        if not added and not _same_waiting(request, resolution):
            raise _refusal(gate_id, request)
        # The same answer sent again (a retry) waits for the one kept, and
        # says what became of it, as a cancel sent again does.
        return await self._sent(request, info.request)

    async def cancel(self, run_id: str) -> Forwarded | None:
        """Send a cancel of a run this supervisor does not drive; None for a
        run that ended already.

        Raises:
            UnknownRunError: the journal has no such run.
        """
        state = await self._state(run_id)
        if state is None:
            raise UnknownRunError(run_id)
        if state.status.final:
            return None
        request, _ = await self._requests.add_request(run_id, self._owner.holder)
        return await self._sent(request)

    async def _state(self, run_id: str) -> RunState | None:
        events = await self._store.read(run_id)
        return fold_journal(run_id, events) if events else None

    async def _sent(
        self, request: RunRequest, gate: GateRequest | None = None
    ) -> Forwarded:
        """Wait a little for the run's driver to settle ``request`` (an
        answer to ``gate``).

        Raises:
            ResolutionRefused: the driver refused the answer (names the
                field; the gate stays open).
            GateError: an answer was not applied (the error says why); a
                cancel that was not (the run ended otherwise) is left to
                the run's journal to tell.
        """
        deadline = time.monotonic() + FORWARD_WAIT_S
        # Who drives the run as it is sent (its lease is let go of as it ends).
        lease = await self._leases.run_lease(request.run_id)
        current: RunRequest | None = request
        while current is not None and current.outcome is None:
            if time.monotonic() >= deadline:
                break
            await anyio.sleep(_SETTLED_POLL_S)
            if lease is None:
                # Nobody drove the run as it was sent: the supervisor that
                # takes it over meanwhile is the one that applies it.
                lease = await self._leases.run_lease(request.run_id)
            current = await self._requests.get_request(request.id)
        if current is None:
            # Gone with its run (retention compacted or deleted it once it
            # ended): the run's journal tells what became of it.
            current = await self._judged(request)
        refused = current is not None and current.outcome not in (None, "applied")
        if refused and current is not None and request.gate_id is not None:
            raise _refusal(request.gate_id, current, gate)
        return Forwarded(
            request_id=request.id,
            run_id=request.run_id,
            gate_id=request.gate_id,
            applied=current is not None and current.outcome == "applied",
            driven_by=None if lease is None else lease.holder,
        )

    async def _judged(self, request: RunRequest) -> RunRequest | None:
        """``request`` settled by its run's journal, once its row is gone
        (None while the run is unfinished: the row is left to tell).

        Raises:
            UnknownRunError: a cancel's run is gone from the journal.
            GateError: so is an answer's.
        """
        state = await self._state(request.run_id)
        if state is None:
            if request.gate_id is None:
                raise UnknownRunError(request.run_id)
            raise GateError(
                f"gate {request.gate_id} is closed: run {request.run_id} is "
                "gone from the journal (deleted once it ended)"
            )
        if not state.status.final:
            return None
        outcome, detail = _settled(request, state)
        return request.model_copy(update={"outcome": outcome, "detail": detail})

    # Applying -----------------------------------------------------------------

    async def waiting_for(
        self, run_id: str
    ) -> tuple[dict[str, GateResolution], bool, list[RunRequest]]:
        """What waits for a run this supervisor just took over: the answers
        sent to its gates, by gate id (each taken as the run is taken up: in
        place of the withdrawal of a tool call's gate, as the first answer
        of any other), whether a cancel was sent (the run is cancelled
        before any of its work starts again), and the answers' requests
        (for :meth:`taken_over`)."""
        waiting = [
            r
            for r in await self._requests.waiting_requests(self._owner)
            if r.run_id == run_id
        ]
        answers = [r for r in waiting if r.gate_id is not None and r.resolution]
        found = {
            r.gate_id: r.resolution
            for r in answers
            if r.gate_id is not None and r.resolution is not None
        }
        return found, any(r.gate_id is None for r in waiting), answers

    async def taken_over(self, requests: list[RunRequest]) -> None:
        """Settle the answers a run took as it was taken over here, each
        once journaled, rather than at the next look for requests."""
        for request in requests:
            if request.id not in self._applying:
                self._applying.add(request.id)
                await self._apply(request)

    async def withdrawal(
        self, run_id: str, gate_id: str, withdrawal: GateResolution
    ) -> GateResolution:
        """The answer that stands for a tool call's gate of a run this
        supervisor is taking over: ``withdrawal``, kept in the journal's
        requests as the gate's one answer before it is journaled, or the
        answer a sender kept there first.

        One transaction with the senders' (a gate keeps one answer there),
        so an answer sent after the waiting ones were read and before the
        gate is withdrawn is not lost to the withdrawal: it stands; one
        sent after this call is told the gate is resolved (the request
        kept here is settled at the next look for requests).
        """
        request, added = await self._requests.add_request(
            run_id, self._owner.holder, gate_id=gate_id, resolution=withdrawal
        )
        if added or request.resolution is None:
            return withdrawal
        return request.resolution

    async def take(self) -> None:
        """Apply the requests for the runs this supervisor drives (and settle
        those of runs that ended), every :data:`REQUEST_POLL_S`, until
        cancelled."""
        failing = False
        async with anyio.create_task_group() as tg:
            while True:
                await anyio.sleep(REQUEST_POLL_S)
                try:
                    waiting = await self._requests.waiting_requests(self._owner)
                except Exception as exc:
                    if not failing:
                        logger.warning(
                            "could not look for gate answers and cancels sent "
                            "from elsewhere (tried again every %gs): %s: %s",
                            REQUEST_POLL_S,
                            type(exc).__name__,
                            " ".join(str(exc).split()),
                        )
                    failing = True
                    continue
                failing = False
                for request in waiting:
                    if request.id not in self._applying:
                        self._applying.add(request.id)
                        tg.start_soon(self._apply, request)

    async def _apply(self, request: RunRequest) -> None:
        try:
            settled = await self._outcome(request)
            if settled is not None:
                await self._requests.settle_request(request.id, *settled)
        except Exception:
            # Left waiting: the next look tries it again.
            logger.debug("request %d was not applied", request.id, exc_info=True)
        finally:
            self._applying.discard(request.id)

    async def _outcome(
        self, request: RunRequest
    ) -> tuple[RequestOutcome, str | None] | None:
        """Apply ``request``; what became of it, or None to leave it waiting
        (the run is not driven here yet, or any more)."""
        driver = self._drivers.get(request.run_id)
        if driver is None or driver.state.status.final:
            state = await self._state(request.run_id)
            if state is None:
                return "closed", f"run {request.run_id} is gone from the journal"
            if not state.status.final:
                return None  # being taken up here, or lost to another
            return _settled(request, state)
        if request.gate_id is None:
            driver.request_cancel()
            await driver.record.done.wait()
            state = driver.record.state
            return _settled(request, state) if state.status.final else None
        info = driver.state.gates.get(request.gate_id)
        if info is not None and info.resolution is not None:
            # Journaled already: by this request (its last driver died
            # before settling it), or by another answer.
            return _settled(request, driver.state)
        assert request.resolution is not None
        if self._gates.taken(request.gate_id) == request.resolution:
            # Taken as the run was taken over: settled once journaled.
            await self._gates.journaled(request.gate_id)
            state = driver.record.state
            info = state.gates.get(request.gate_id)
            if state.status.final or (info is not None and info.resolution):
                return _settled(request, state)
            return None
        try:
            await self._gates.answer_here(request.gate_id, request.resolution)
        except GateAlreadyResolved as exc:
            return "already_resolved", str(exc)
        except ResolutionRefused as exc:
            return "refused", str(exc)
        except GateError:
            state = driver.record.state
            info = state.gates.get(request.gate_id)
            if state.status.final or (info is not None and info.resolution):
                return _settled(request, state)
            return None  # not listed yet: the next look
        return "applied", None


def _settled(request: RunRequest, state: RunState) -> tuple[RequestOutcome, str | None]:
    """What became of ``request`` by the run's journal."""
    ended = f"its run ended {state.status.value}"
    if request.gate_id is None:
        if state.status is RunStatus.CANCELLED:
            return "applied", None
        return "closed", f"run {state.run_id} already ended {state.status.value}"
    info = state.gates.get(request.gate_id)
    answer = None if info is None else info.resolution
    if answer is None or _ended_by_run(answer):
        return "closed", f"gate {request.gate_id} is closed: {ended}"
    if answer == request.resolution:
        return "applied", None
    return "already_resolved", already_resolved(request.gate_id, answer)


def _same_waiting(request: RunRequest, resolution: GateResolution) -> bool:
    """Whether ``request`` is the answer ``resolution``, still waiting for
    the run's driver (or applied by it)."""
    return request.outcome in (None, "applied") and request.resolution == resolution


def _ended_by_run(answer: GateResolution) -> bool:
    """An answer the run gave its gate as it ended (no one's decision)."""
    return answer.by == "supervisor" and (answer.note or "").startswith(RUN_ENDED_NOTE)


def _refusal(
    gate_id: str, request: RunRequest, gate: GateRequest | None = None
) -> GateError:
    """The error for a request that was not applied, or an answer that came
    second to one sent on before."""
    if request.outcome is None or request.outcome == "applied":
        assert request.resolution is not None
        return GateAlreadyResolved(already_resolved(gate_id, request.resolution))
    detail = request.detail or f"gate {gate_id} was not answered"
    if request.outcome == "refused" and gate is not None and request.resolution:
        # The driver's check refused it: the gate stays open, as for an
        # answer refused here.
        field = refused_field(gate, request.resolution, ValueError(detail))
        return ResolutionRefused(field, detail)
    if request.outcome == "already_resolved":
        return GateAlreadyResolved(detail)
    return GateError(detail)
