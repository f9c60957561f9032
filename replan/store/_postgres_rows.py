"""How the PostgreSQL journal keeps a run's row: ``_rows.py``'s columns,
with free text that PostgreSQL's text type could not hold escaped."""

from __future__ import annotations

import json
from typing import Any

from ._port import RunSummary
from ._rows import summary_from_row, to_text


def summary_values(run_id: str, summary: RunSummary) -> dict[str, object]:
    """The run row's columns for ``summary``, as query parameters."""
    stop = summary.stop_reason
    return {
        "run_id": run_id,
        "goal": text_in(summary.goal),
        "kind": text_in(summary.kind),
        "pattern": text_in(summary.pattern),
        "status": str(summary.status),
        "created_at": to_text(summary.created_at),
        "updated_at": to_text(summary.updated_at),
        "last_seq": summary.last_seq,
        "stop_reason": None if stop is None else text_in(stop),
    }


_ESCAPED = "\ufdd0"
"""Starts a text column's value kept as a JSON string (a noncharacter, for
a program's internal use: no text starts with it)."""


def text_in(value: str) -> str:
    """A run's free text (a goal, a stop reason) as a text column holds it.

    PostgreSQL's text holds no NUL character: a value with one (or, so that
    the two cannot be confused, one that starts with the marker) is kept as
    the marker and the value's JSON string.
    """
    if "\x00" in value or value.startswith(_ESCAPED):
        return _ESCAPED + json.dumps(value)
    return value


def text_out(value: str) -> str:
    """The free text that :func:`text_in` kept as ``value``."""
    if value.startswith(_ESCAPED):
        decoded = json.loads(value[len(_ESCAPED) :])
        if not isinstance(decoded, str):
            raise ValueError(f"not an escaped text: {value!r}")
        return decoded
    return value


def summary_of_row(row: Any) -> RunSummary:
    """A summary from the columns of :func:`summary_values`, read back.

    Raises:
        ValueError: a column does not read back.
    """
    run_id, goal, kind, pattern, status, created, updated, last_seq, stop = row
    return summary_from_row(
        (
            run_id,
            text_out(goal),
            text_out(kind),
            text_out(pattern),
            status,
            created,
            updated,
            last_seq,
            None if stop is None else text_out(stop),
        )
    )
