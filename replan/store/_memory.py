from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import Self

import anyio

from ..messages import Event, RunCompacted, RunStatus, event_json, read_event
from ._port import EffectRecord, JournalConflict, RunSummary, ToolEffectRecord
from ._rows import LeaseHolders, check_page, lease_refused


class MemoryStore:
    """A journal in memory, for tests and throwaway runs.

    Events are kept as JSON, exactly as a durable store keeps them, so a test
    against this store also proves every event survives serialization. Once
    closed it refuses every call with ``anyio.ClosedResourceError``, as the
    SQLite store does, so that code written against it fails the same way.
    Supervisors sharing it share its driver lease as they would a SQLite
    journal's: one that resumes runs must have it to itself.
    """

    def __init__(self) -> None:
        self._events: dict[str, list[bytes]] = {}
        self._base: dict[str, int] = {}
        """Seq before a run's first kept event (non-zero once compacted)."""
        self._runs: dict[str, RunSummary] = {}
        self._effects: dict[str, dict[tuple[str, int], EffectRecord]] = {}
        self._tool_effects: dict[str, dict[tuple[str, str], ToolEffectRecord]] = {}
        self._compacted: set[str] = set()
        self._closed = False
        self._holders = LeaseHolders()
        """The supervisors serving on this store."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` ran: every call is then refused."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise anyio.ClosedResourceError(f"{self!r} is closed")

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        self._check_open()
        journal = self._events.setdefault(run_id, [])
        expected = self._base.get(run_id, 0) + len(journal) + 1
        encoded: list[bytes] = []
        for event in events:
            if event.seq != expected:
                raise JournalConflict(
                    f"run {run_id}: expected seq {expected}, got {event.seq}"
                )
            expected += 1
            encoded.append(event_json(event))
        journal.extend(encoded)
        self._runs[run_id] = summary

    async def read(self, run_id: str, after: int = 0) -> list[Event]:
        self._check_open()
        journal = self._events.get(run_id, [])
        start = max(after - self._base.get(run_id, 0), 0)
        return [read_event(raw) for raw in journal[start:]]

    async def get_run(self, run_id: str) -> RunSummary | None:
        self._check_open()
        return self._runs.get(run_id)

    async def list_runs(
        self,
        *,
        statuses: Sequence[RunStatus] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RunSummary]:
        self._check_open()
        check_page(limit, offset)
        rows = [
            r for r in self._runs.values() if statuses is None or r.status in statuses
        ]
        rows.sort(key=lambda r: (r.created_at, r.run_id), reverse=True)
        return rows[offset : offset + limit]

    async def aclose(self) -> None:
        self._closed = True

    # Driver lease -----------------------------------------------------------------

    def hold_lease(self, holder: object, *, exclusive: bool) -> None:
        """Hold the lease shared, or alone to take over runs (see
        :class:`~replan.store.DriverLease`); only supervisors of this process
        can share a store in memory.

        Raises:
            ConfigurationError: another supervisor holds it so that this one
                cannot (field ``store``).
        """
        exclusive = self._holders.admit(
            holder,
            exclusive,
            lambda alone: lease_refused("this MemoryStore", exclusive=alone),
        )
        self._holders.hold(holder, exclusive)

    def release_lease(self, holder: object) -> None:
        self._holders.release(holder)

    # Effect ledger --------------------------------------------------------------

    async def record_effect(self, run_id: str, record: EffectRecord) -> None:
        self._check_open()
        self._effects.setdefault(run_id, {})[record.task_id, record.attempt] = record

    async def read_effects(self, run_id: str) -> list[EffectRecord]:
        self._check_open()
        return list(self._effects.get(run_id, {}).values())

    async def record_tool_effect(self, run_id: str, record: ToolEffectRecord) -> None:
        self._check_open()
        self._tool_effects.setdefault(run_id, {})[record.task_id, record.key] = record

    async def read_tool_effects(
        self, run_id: str, task_id: str | None = None
    ) -> list[ToolEffectRecord]:
        self._check_open()
        records = self._tool_effects.get(run_id, {}).values()
        return [r for r in records if task_id in (None, r.task_id)]

    # Retention ------------------------------------------------------------------

    async def finished_before(
        self, before: datetime, *, include_compacted: bool, limit: int
    ) -> list[str]:
        self._check_open()
        rows = sorted(
            (
                r
                for r in self._runs.values()
                if r.status.final
                and r.updated_at < before
                and (include_compacted or r.run_id not in self._compacted)
            ),
            key=lambda r: (r.updated_at, r.run_id),
        )
        return [r.run_id for r in rows[:limit]]

    async def compact_run(self, run_id: str, snapshot: RunCompacted) -> None:
        self._check_open()
        journal = self._events.get(run_id, [])
        last = self._base.get(run_id, 0) + len(journal)
        if snapshot.seq != last:
            raise JournalConflict(
                f"run {run_id}: the snapshot ends at seq {snapshot.seq}, "
                f"the journal at {last}"
            )
        self._events[run_id] = [event_json(snapshot)]
        self._base[run_id] = last - 1
        self._effects.pop(run_id, None)
        self._tool_effects.pop(run_id, None)
        self._compacted.add(run_id)

    async def delete_run(self, run_id: str) -> None:
        self._check_open()
        for table in (
            self._events,
            self._base,
            self._runs,
            self._effects,
            self._tool_effects,
        ):
            table.pop(run_id, None)
        self._compacted.discard(run_id)
