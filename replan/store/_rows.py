"""What the SQL journals share: the rows they write and how they read back.

``SQLiteStore`` and ``PostgresStore`` keep the same rows: events as the JSON
of :data:`~replan.messages.EVENT_ADAPTER`, times as ISO-8601 text that sorts
in time order, so a journal reads back the same from either.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from .._errors import ConfigurationError
from ..messages import Event, RunStatus, event_json
from ._port import JournalConflict, JournalCorrupt, RunSummary


def event_row(run_id: str, event: Event) -> tuple[object, ...]:
    """An event's row of the ``events`` table, in column order:
    run_id, seq, type, payload, at."""
    return (
        run_id,
        event.seq,
        event.kind,
        event_json(event).decode(),
        to_text(event.at),
    )


def check_follows(run_id: str, events: Sequence[Event], last: int) -> None:
    """Raise JournalConflict unless ``events`` are numbered on from ``last``."""
    for expected, event in enumerate(events, start=last + 1):
        if event.seq != expected:
            raise JournalConflict(
                f"run {run_id}: expected seq {expected}, got {event.seq}"
            )


_SECOND: tuple[tuple[int, ...], str] = ((), "")
"""The last second :func:`to_text` wrote (its fields, seconds first) and
its text up to the seconds; replaced whole, so threads may share it."""


def to_text(moment: datetime) -> str:
    """ISO-8601 that sorts as text: aware moments in UTC, always microseconds."""
    global _SECOND
    if moment.tzinfo is UTC:  # what replan itself writes: nothing to convert
        # One per event row: the text up to the seconds changes once a
        # second, and isoformat() (C's formatting) costs twice the rest.
        key = (
            moment.second,
            moment.minute,
            moment.hour,
            moment.day,
            moment.month,
            moment.year,
        )
        second = _SECOND
        if second[0] != key:
            # "YYYY-MM-DDTHH:MM:SS", then "+00:00" (no microseconds at 0).
            text = moment.replace(microsecond=0).isoformat()[:19]
            second = _SECOND = (key, text)
        return f"{second[1]}.{moment.microsecond:06d}+00:00"
    if moment.utcoffset() is not None:
        # Within a day of year 1 or 9999 there is no UTC equivalent: keep the
        # offset and give up text sorting for such a moment.
        with contextlib.suppress(OverflowError):
            moment = moment.astimezone(UTC)
    return moment.isoformat(timespec="microseconds")


def summary_from_row(row: Any) -> RunSummary:
    """A summary from the columns run_id, goal, kind, pattern, status,
    created_at, updated_at, last_seq, stop_reason.

    Raises:
        ValueError: a column does not read back (a status that does not
            exist, a time that is no ISO-8601).
    """
    run_id, goal, kind, pattern, status, created, updated, last_seq, stop = row
    return RunSummary(
        run_id=run_id,
        goal=goal,
        kind=kind,
        pattern=pattern,
        status=RunStatus(status),
        created_at=datetime.fromisoformat(created),
        updated_at=datetime.fromisoformat(updated),
        last_seq=last_seq,
        stop_reason=stop,
    )


def corrupt(
    journal: object, run_id: str, what: str, exc: Exception, *, seq: int | None = None
) -> JournalCorrupt:
    """The error for a row of ``journal`` that does not read back, in one line."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        problem = f"{where}: {first['msg']}" if where else first["msg"]
    else:
        problem = str(exc)
    problem = " ".join(problem.split())
    return JournalCorrupt(
        f"{journal}: run {run_id}: {what} cannot be read ({problem})",
        run_id=run_id,
        seq=seq,
    )


class LeaseHolders:
    """The supervisors of this process serving on one store, told apart by
    ``id()``: each holds the drivers' lease shared, or alone (see
    :class:`~replan.store.DriverLease`)."""

    def __init__(self) -> None:
        self._held: dict[int, bool] = {}  # id(holder) -> holds it alone

    def admit(
        self, holder: object, exclusive: bool, refused: Callable[[bool], Exception]
    ) -> bool:
        """How ``holder`` may hold the lease: alone if asked, or if it holds
        it alone already (True), else shared.

        Raises:
            Exception: ``refused(exclusive)``, when another holder of this
                store holds it so that ``holder`` cannot.
        """
        key = id(holder)
        exclusive = exclusive or self._held.get(key, False)
        others = [alone for other, alone in self._held.items() if other != key]
        if others and (exclusive or any(others)):
            raise refused(exclusive)
        return exclusive

    def hold(self, holder: object, exclusive: bool) -> None:
        self._held[id(holder)] = exclusive

    def release(self, holder: object) -> bool:
        """Forget ``holder``; True when no holder is left."""
        self._held.pop(id(holder), None)
        return not self._held

    def clear(self) -> None:
        self._held.clear()


def check_page(limit: int, offset: int) -> None:
    """Refuse a page no journal could give alike (SQLite reads a negative
    limit as none, PostgreSQL refuses it, a list slices from its end).

    Raises:
        ConfigurationError: ``limit`` or ``offset`` below 0 (names it).
    """
    for name, value in (("limit", limit), ("offset", offset)):
        if value < 0:
            raise ConfigurationError(name, f"must be at least 0, not {value}")


def lease_refused(journal: object, *, exclusive: bool) -> ConfigurationError:
    """The error for a drivers' lease another supervisor holds (see
    :class:`~replan.store.DriverLease`)."""
    if exclusive:
        problem = (
            f"another supervisor drives runs in {journal}: resuming runs needs "
            "the journal to itself"
        )
    else:
        problem = (
            f"another supervisor is resuming runs in {journal} and needs the "
            "journal to itself"
        )
    return ConfigurationError("store", problem)
