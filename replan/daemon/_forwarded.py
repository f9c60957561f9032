"""The answers to a gate answer or a cancel sent on to the daemon that drives
the run (a shared PostgreSQL journal: see ``supervisor/_forwarding``)."""

from __future__ import annotations

from typing import Literal

from ..messages import GateResolution
from ..supervisor import Forwarded
from ._schemas import Cancelled, GateAnswered


class GateForwarded(GateAnswered):
    """``202``: the answer went to the daemon that drives the gate's run."""

    state: Literal["applied", "forwarded"]
    """``applied``: that daemon journaled it already; ``forwarded``: it
    waits in the journal for that daemon's next look (or, when no daemon
    drives the run at the moment, for the one that takes it over)."""
    driven_by: str | None = None
    """The daemon that drives the run (``host:pid``); null when none does."""
    request_id: int
    detail: str


class CancelForwarded(Cancelled):
    """``202``: the cancel went to the daemon that drives the run."""

    state: Literal["applied", "forwarded"]
    """As :attr:`GateForwarded.state`; ``status`` is the run's as known."""
    driven_by: str | None = None
    request_id: int
    detail: str


def _where(sent: Forwarded, run_id: str) -> str:
    """What became of the request, after its subject."""
    if sent.applied and sent.driven_by is None:
        # The run's driver took it over and ended it (a cancel) before the
        # sender could tell which daemon that was.
        return f"was applied by the daemon that took run {run_id} over"
    if sent.applied:
        return f"was applied by daemon {sent.driven_by}, which drives run {run_id}"
    if sent.driven_by is None:
        return (
            f"waits in the journal: run {run_id} is driven by no daemon at the "
            "moment, and the daemon that takes it over applies it"
        )
    return (
        f"is forwarded to daemon {sent.driven_by}, which drives run {run_id} "
        "and applies it at its next look"
    )


def gate_forwarded(
    sent: Forwarded, gate_id: str, resolution: GateResolution
) -> GateForwarded:
    what = f"gate {gate_id}: {resolution.decision} by {resolution.by}"
    return GateForwarded(
        gate_id=gate_id,
        run_id=sent.run_id,
        decision=resolution.decision,
        state="applied" if sent.applied else "forwarded",
        driven_by=sent.driven_by,
        request_id=sent.request_id,
        detail=f"{what} {_where(sent, sent.run_id)}",
    )


def cancel_forwarded(
    sent: Forwarded, cancelled: Cancelled, *, applied: bool
) -> CancelForwarded:
    sent = sent.model_copy(update={"applied": applied})
    return CancelForwarded(
        **cancelled.model_dump(),
        state="applied" if applied else "forwarded",
        driven_by=sent.driven_by,
        request_id=sent.request_id,
        detail=f"run {sent.run_id}: the cancel {_where(sent, sent.run_id)}",
    )
