"""Pages of ``GET /v1/gates``: by offset, or after a cursor that does not move.

The open gates are listed oldest first, by when each opened and then by id.
A gate answered between two reads by offset moves every later gate a place
up, so the next page starts one gate too far and skips one. A cursor names
the last gate of a page by that order's key, which no answer changes: the
next page starts after it, whether or not that gate (or any before it) is
still open.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ..messages import GateRequest

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def oldest_first(gates: list[GateRequest]) -> list[GateRequest]:
    """``gates`` in the order the pages take: when each opened, then id."""
    return sorted(gates, key=_key)


def _key(gate: GateRequest) -> tuple[datetime, str]:
    return (_utc(gate.created_at), gate.gate_id)


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at


def cursor_of(gate: GateRequest) -> str:
    """The cursor of the page that starts after ``gate``:
    ``MICROSECONDS.GATE_ID`` (microseconds since 1970 in UTC)."""
    micros = (_utc(gate.created_at) - _EPOCH) // timedelta(microseconds=1)
    return f"{micros}.{gate.gate_id}"


def _read_cursor(cursor: str) -> tuple[datetime, str]:
    """The key a cursor names.

    Raises:
        ValueError: not a cursor a page gave.
    """
    micros, dot, gate_id = cursor.partition(".")
    if not dot or not gate_id or not micros.isascii() or not micros.isdigit():
        raise ValueError("not a cursor a page gave (its next_cursor)")
    try:
        return (_EPOCH + timedelta(microseconds=int(micros)), gate_id)
    except OverflowError:
        raise ValueError("not a cursor a page gave (its next_cursor)") from None


@dataclass(frozen=True)
class GatePage:
    gates: list[GateRequest]
    next_offset: int | None
    next_cursor: str | None


def gate_page(
    gates: list[GateRequest], limit: int, offset: int, cursor: str | None
) -> GatePage:
    """One page of ``gates`` (ordered by :func:`oldest_first`).

    Raises:
        ValueError: ``cursor`` is not one a page gave.
    """
    start = offset
    if cursor is not None:
        after = _read_cursor(cursor)
        start = bisect.bisect_right(gates, after, key=_key)
    page = gates[start : start + limit]
    more = len(gates) > start + limit
    return GatePage(
        gates=page,
        next_offset=start + limit if more else None,
        next_cursor=cursor_of(page[-1]) if more and page else None,
    )
