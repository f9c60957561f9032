"""Submissions a client may send again: the ``Idempotency-Key`` header.

A key stands for one run id (a digest of the key), so the journal itself
remembers which run a key started: across restarts, with no table of keys
to keep or to bound, for as long as the journal keeps the run (retention
compacts it and still answers; once it deletes the run, the key starts a
new one). A submission with a key the journal knows gets the run it
started, if the spec is the same, instead of a second run.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from ..messages import RunSpec

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be an idempotency key, or None if it can."""
    if not 1 <= len(key) <= MAX_KEY_CHARS:
        return f"{HEADER} must have 1 to {MAX_KEY_CHARS} characters"
    if not (key.isascii() and key.isprintable()):
        return f"{HEADER} must be printable ASCII"
    return None


def run_id_of(key: str) -> str:
    """The id of the run ``key`` submits: the same key, the same run."""
    digest = hashlib.sha256(b"replan idempotency key\0" + key.encode())
    return digest.hexdigest()[:32]


def differences(journaled: RunSpec, sent: RunSpec) -> list[str]:
    """The fields in which the spec ``sent`` (as the client sent it, before
    the daemon's default limits) differs from the run's ``journaled`` one.

    The limits the client left to the daemon's defaults are not compared: a
    default changed by a restart between the two does not make them differ.
    """
    theirs = journaled.model_dump(mode="json", exclude={"limits"})
    mine = sent.model_dump(mode="json", exclude={"limits"})
    found = [name for name, value in mine.items() if theirs.get(name) != value]
    if "limits" in sent.model_fields_set:
        limits: dict[str, Any] = journaled.limits.model_dump(mode="json")
        given = sent.limits.model_dump(
            mode="json", include=sent.limits.model_fields_set
        )
        found += [f"limits.{k}" for k, v in given.items() if limits.get(k) != v]
    return found


class KeyedSubmissions:
    """The keyed submissions in progress in this daemon: one at a time per
    key, so two sent at once start one run (only those in progress are
    kept)."""

    def __init__(self) -> None:
        self._busy: dict[str, anyio.Event] = {}

    @asynccontextmanager
    async def holding(self, run_id: str) -> AsyncIterator[None]:
        """Wait until no other submission of ``run_id`` is in progress, then
        hold it until the block ends."""
        while (busy := self._busy.get(run_id)) is not None:
            await busy.wait()
        self._busy[run_id] = done = anyio.Event()
        try:
            yield
        finally:
            del self._busy[run_id]
            done.set()
