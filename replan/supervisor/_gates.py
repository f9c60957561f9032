"""Pending human gates: where a person finds them and answers them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import ValidationError

from .._errors import (
    ConfigurationError,
    GateAlreadyResolved,
    GateError,
    ResolutionRefused,
)
from ..messages._gate import POLICY_TIMEOUT, GateRequest, GateResolution
from ._arguments import an_id

if TYPE_CHECKING:
    from ._forwarding import Forwarded

GATE_CLOSED = "the gate was closed before a gate worker took it"


ANSWERED_KEPT = 1024
"""How many answered gates a registry remembers, to tell a late second
answer that the gate is resolved rather than unknown."""


def already_resolved(gate_id: str, answer: GateResolution) -> str:
    """What a second answer is told: the gate, and the answer that stands."""
    return f"gate {gate_id} is already resolved ({answer.decision} by {answer.by})"


Validator = Callable[[GateResolution], None]
"""Raises ``ValueError`` when a resolution does not fit the gate (a
``ConfigurationError`` to name the field)."""

Elsewhere = Callable[
    [str, "GateResolution | Mapping[str, Any]", bool], Awaitable["Forwarded | None"]
]
"""Sends an answer to a gate that is not open here on to the supervisor
that drives its run (reading a mapping as the gate's run would, see
:func:`resolution_from`); raises :class:`GateError` when there is no such
gate. The flag says the gate was open here, and its run stopped here
before it journaled the answer: None then when the answer is not sent on
(the run ended here, or nobody else took it over)."""


@dataclass(slots=True)
class _Pending:
    request: GateRequest
    validate: Validator | None
    answered: anyio.Event = field(default_factory=anyio.Event)
    journaled: anyio.Event = field(default_factory=anyio.Event)
    waited_on: anyio.Event = field(default_factory=anyio.Event)
    """The gate's actor has taken the request (or the gate closed)."""
    resolution: GateResolution | None = None
    error: str | None = None


class GateRegistry:
    """The supervisor's open gates (``Supervisor.gates``).

    A run opens a gate and waits; :meth:`resolve` answers it and returns once
    the answer is in the journal, so a caller that saw ``resolve`` return can
    rely on it surviving a crash.
    """

    def __init__(self, elsewhere: Elsewhere | None = None) -> None:
        self._elsewhere = elsewhere
        """Sends an answer on to the supervisor that drives the gate's run,
        for a gate not open here (see :meth:`resolve`)."""
        self._open: dict[str, _Pending] = {}
        self._by_run: dict[str, dict[str, None]] = {}
        """The open gates' ids by run, oldest first: a run's end closes its
        own without looking through every other run's."""
        self._answered: dict[str, GateResolution] = {}
        """Gates closed with their answer journaled, newest last (at most
        :data:`ANSWERED_KEPT`): a second answer to one is told so."""
        self._stopped: str | None = None
        """Why every gate was closed (the supervisor stopped), if it was."""

    def pending(self, run_id: str | None = None) -> list[GateRequest]:
        """The open gates, oldest first (of one run, if ``run_id`` is given).

        Raises:
            ConfigurationError: ``run_id`` is no string (field ``run_id``).
        """
        if run_id is None:
            found = list(self._open.values())
        else:
            run_id = an_id(run_id, "run_id")
            found = [self._open[g] for g in self._by_run.get(run_id, ())]
        return [p.request for p in found if p.resolution is None]

    def get(self, gate_id: str) -> GateRequest | None:
        """The open gate ``gate_id``; None when no such gate is open.

        Raises:
            ConfigurationError: ``gate_id`` is no string (field ``gate_id``).
        """
        pending = self._open.get(an_id(gate_id, "gate_id"))
        return pending.request if pending else None

    async def resolve(
        self, gate_id: str, resolution: GateResolution | Mapping[str, Any]
    ) -> Forwarded | None:
        """Answer a gate and wait until the run has journaled the answer.

        ``resolution`` may also be its fields as a mapping
        (``{"decision": "approve", "by": "alice"}``), as ``submit`` takes a
        spec's.

        On a journal shared by supervisors that lease runs one by one
        (``PostgresStore``), a gate of a run another supervisor drives (or
        that nobody drives at the moment) is answered there: checked here
        against the run's journal as its driver would, the answer is kept
        in the journal until the run's driver applies it, and what was sent
        on is returned (:class:`~replan.supervisor.Forwarded`: whether it
        was applied within a moment, and who drives the run). Otherwise
        None, once the answer is journaled.

        Raises:
            GateAlreadyResolved: the gate has been answered already (two
                people answering at once: the second one).
            ResolutionRefused: the resolution does not fit the gate (an edit
                whose tasks are not a valid plan, say), names no one in ``by``,
                or holds a string the journal cannot store; names the field,
                and the gate stays open.
            GateError: no open gate has this id, or the run ended before it
                journaled the answer (or, sent on, the run's driver found
                the gate closed).
            ConfigurationError: ``gate_id`` is no string (field
                ``gate_id``), before anything is sent or journaled.
        """
        pending = self._open.get(an_id(gate_id, "gate_id"))
        elsewhere = self._elsewhere
        if pending is None and gate_id not in self._answered and elsewhere:
            return await elsewhere(gate_id, resolution, False)
        if not isinstance(resolution, GateResolution):
            review = pending is not None and pending.request.hypotheses is not None
            resolution = resolution_from(gate_id, resolution, review=review)
        try:
            await self.answer_here(gate_id, resolution)
        except GateError as exc:
            if type(exc) is not GateError or pending is None or elsewhere is None:
                raise
            # The run stopped here before it journaled the answer: another
            # supervisor may have taken it over (this one stalled past its
            # lease), and the gate is open there.
            sent = await elsewhere(gate_id, resolution, True)
            if sent is None:
                raise
            return sent
        return None

    async def answer_here(self, gate_id: str, resolution: GateResolution) -> None:
        """:meth:`resolve` for a gate open in this registry (never sent on).

        Raises:
            GateAlreadyResolved, ResolutionRefused, GateError: as
                :meth:`resolve`.
        """
        pending = self._open.get(gate_id)
        if pending is None:
            answered = self._answered.get(gate_id)
            if answered is not None:
                told = already_resolved(gate_id, answered)
                if answered.by == "supervisor" and answered.note:
                    # Closed on the run's behalf (its end, a withdrawal):
                    # the note says why no person's answer counts.
                    told = f"{told}: {answered.note}"
                raise GateAlreadyResolved(told)
            raise self.no_open_gate(gate_id)
        if pending.resolution is not None:
            # The first of two answers at once, not journaled yet: it stands.
            raise GateAlreadyResolved(already_resolved(gate_id, pending.resolution))
        check_answer(gate_id, pending.request, pending.validate, resolution)
        pending.resolution = resolution
        pending.answered.set()
        await pending.journaled.wait()
        if pending.error is not None:
            raise GateError(pending.error)

    def no_open_gate(self, gate_id: str) -> GateError:
        """The error for an answer to a gate not open here: after a stop,
        it says why (the gate may well be open in the journal)."""
        if self._stopped is None:
            return GateError(f"no open gate {gate_id!r}")
        return GateError(
            f"no open gate {gate_id!r}: {self._stopped} (a gate of a run it "
            "let go of unfinished is answered once a supervisor resumes the run)"
        )

    # The run side ---------------------------------------------------------

    def open(
        self,
        request: GateRequest,
        validate: Validator | None = None,
        sent: GateResolution | None = None,
    ) -> None:
        """List a gate the run opened.

        ``sent``: an answer sent from elsewhere while nobody drove the run,
        waiting for the supervisor that takes it over (a gate listed again
        as the run is resumed): taken at once, as the gate's first answer,
        so an answer given here after the takeover cannot come before it.
        One that does not fit the gate is left to the look for requests,
        which refuses it, and the gate stays open.
        """
        pending = _Pending(request, validate)
        if sent is not None:
            try:
                check_answer(request.gate_id, request, validate, sent)
            except ResolutionRefused:
                pass
            else:
                pending.resolution = sent
                pending.answered.set()
        self._open[request.gate_id] = pending
        self._by_run.setdefault(request.run_id, {})[request.gate_id] = None

    async def journaled(self, gate_id: str) -> None:
        """Return once the open gate's answer is journaled (or it closed)."""
        pending = self._open.get(gate_id)
        if pending is not None:
            await pending.journaled.wait()

    def taken(self, gate_id: str) -> GateResolution | None:
        """The answer an open gate took, not journaled yet (None: none)."""
        pending = self._open.get(gate_id)
        return None if pending is None else pending.resolution

    async def wait(self, request: GateRequest) -> GateResolution:
        """Wait for a person, or apply the policy default when the gate expires.

        A gate closed before a gate worker took its request (the run took
        the answer meanwhile, or ended) is no one's to wait for: its
        requester has stopped listening, or is about to, so the answer is a
        rejection on the supervisor's behalf, as for a withdrawn gate, and
        the worker goes on serving.
        """
        pending = self._open.get(request.gate_id)
        if pending is None:
            return GateResolution(decision="reject", by="supervisor", note=GATE_CLOSED)
        pending.waited_on.set()
        return await _settled(pending)

    async def unattended(self, request: GateRequest) -> GateResolution | None:
        """The answer (or the timeout's) of a gate no gate actor has taken.

        A gate queued behind busy actors is answered and expires all the
        same. Returns None, at once or later, when an actor takes the gate
        (it answers then) or the gate is closed.
        """
        pending = self._open.get(request.gate_id)
        if pending is None:
            return None
        resolution: GateResolution | None = None
        async with anyio.create_task_group() as tg:

            async def taken() -> None:
                await pending.waited_on.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(taken)
            resolution = await _settled(pending)
            tg.cancel_scope.cancel()
        return None if pending.waited_on.is_set() else resolution

    def withdraw(self, gate_id: str, note: str) -> None:
        """Answer a gate on the run's behalf (reject) when it no longer matters."""
        pending = self._open.get(gate_id)
        if pending is not None and pending.resolution is None:
            pending.resolution = GateResolution(
                decision="reject", by="supervisor", note=note
            )
            pending.answered.set()

    def close(self, gate_id: str, error: str | None = None) -> None:
        """The run journaled the answer (or gave up, with ``error``)."""
        pending = self._open.pop(gate_id, None)
        if pending is not None:
            run_id = pending.request.run_id
            of_run = self._by_run.get(run_id, {})
            of_run.pop(gate_id, None)
            if not of_run:
                self._by_run.pop(run_id, None)
            pending.error = error
            pending.waited_on.set()
            pending.journaled.set()
            if error is None and pending.resolution is not None:
                self._remember(gate_id, pending.resolution)

    def _remember(self, gate_id: str, answer: GateResolution) -> None:
        self._answered[gate_id] = answer
        if len(self._answered) > ANSWERED_KEPT:
            del self._answered[next(iter(self._answered))]

    async def waited_on(self, gate_id: str) -> None:
        """Return once the gate's actor waits on it (or it is closed): its
        span, if traced, has been recorded then."""
        pending = self._open.get(gate_id)
        if pending is not None:
            await pending.waited_on.wait()

    def close_run(
        self,
        run_id: str,
        error: str,
        stood: Mapping[str, GateResolution | None] | None = None,
    ) -> None:
        """Close every gate of a run that ended (answered or not: an answer
        not journaled by the end is not taken).

        ``stood``: the answers the run's gates have in its final state (the
        end rejects those still open, by ``supervisor``, and the wait on
        one may have closed it already); a later answer to one is told it,
        as :class:`GateAlreadyResolved`. None when the run did not end (the
        supervisor let go of it): its gates are answered after a resume.
        """
        for gate_id in list(self._by_run.get(run_id, ())):
            self.close(gate_id, error)
        for gate_id, answer in (stood or {}).items():
            if answer is not None and gate_id not in self._answered:
                self._remember(gate_id, answer)

    def close_all(self, error: str) -> None:
        self._stopped = error
        for gate_id in list(self._open):
            self.close(gate_id, error)


def check_answer(
    gate_id: str,
    request: GateRequest,
    validate: Validator | None,
    resolution: GateResolution,
) -> None:
    """Check an answer to a gate as the run takes it: storable, naming who
    decides, and fitting the gate (``validate``).

    Raises:
        ResolutionRefused: names the field.
    """
    try:
        resolution.check_storable()
    except ConfigurationError as exc:
        raise ResolutionRefused(exc.field, f"gate {gate_id}: {exc}") from None
    if not any(c.isprintable() and not c.isspace() for c in resolution.by):
        # Blank, or only invisible characters (a zero-width space).
        # The journal keeps who decided each gate (its audit trail).
        raise ResolutionRefused(
            "by", f"gate {gate_id}: by: name who decides (the journal keeps it)"
        )
    if validate is not None:
        try:
            validate(resolution)
        except ValueError as exc:
            field = refused_field(request, resolution, exc)
            raise ResolutionRefused(field, f"gate {gate_id}: {exc}") from None


async def _settled(pending: _Pending) -> GateResolution:
    """Wait for the answer, or apply the policy default when the gate expires."""
    request = pending.request
    timeout = None
    if request.expires_at is not None:
        timeout = max(0.0, (request.expires_at - datetime.now(UTC)).total_seconds())
    with anyio.move_on_after(timeout):
        await pending.answered.wait()
    if pending.resolution is None:
        pending.resolution = GateResolution(
            decision=request.on_timeout,
            by=POLICY_TIMEOUT,
            note="no decision before the gate expired",
        )
    return pending.resolution


def refused_field(
    request: GateRequest, resolution: GateResolution, error: ValueError
) -> str:
    """The field of ``resolution`` a gate's check refused.

    An explore review takes hypotheses, a replan gate edited tasks, and any
    other gate approve or reject only.
    """
    if isinstance(error, ConfigurationError) and error.field:
        return error.field
    if request.hypotheses is not None:
        return "tasks" if resolution.tasks is not None else "hypotheses"
    if request.proposal is not None and resolution.decision == "edit":
        return "hypotheses" if resolution.hypotheses is not None else "tasks"
    return "decision"


def resolution_from(
    gate_id: str, value: object, *, review: bool = False
) -> GateResolution:
    """``value``'s fields as a resolution; ``review``: the gate is an explore
    review, whose edit carries hypotheses (named when an edit has neither)."""
    if not isinstance(value, Mapping):
        raise ResolutionRefused(
            "resolution",
            f"gate {gate_id}: expected a GateResolution or a mapping of its "
            f"fields, got {type(value).__name__}",
        )
    try:
        return GateResolution.model_validate(dict(value))
    except ValidationError as exc:
        problem = ConfigurationError.from_validation(exc)
        field = problem.field
        if review and field == "tasks" and "tasks" not in value:
            field = "hypotheses"
        raise ResolutionRefused(
            field, f"gate {gate_id}: {field}: {problem.problem}"
        ) from None
