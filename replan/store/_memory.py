from __future__ import annotations

from collections.abc import Sequence

from ..messages import EVENT_ADAPTER, Event, RunStatus
from ._port import JournalConflict, RunSummary


class MemoryStore:
    """A journal in memory, for tests and throwaway runs.

    Events are kept as JSON, exactly as a durable store keeps them, so a test
    against this store also proves every event survives serialization.
    """

    def __init__(self) -> None:
        self._events: dict[str, list[bytes]] = {}
        self._runs: dict[str, RunSummary] = {}

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        journal = self._events.setdefault(run_id, [])
        expected = len(journal) + 1
        encoded: list[bytes] = []
        for event in events:
            if event.seq != expected:
                raise JournalConflict(
                    f"run {run_id}: expected seq {expected}, got {event.seq}"
                )
            expected += 1
            encoded.append(EVENT_ADAPTER.dump_json(event))
        journal.extend(encoded)
        self._runs[run_id] = summary

    async def read(self, run_id: str, after: int = 0) -> list[Event]:
        journal = self._events.get(run_id, [])
        return [EVENT_ADAPTER.validate_json(raw) for raw in journal[max(after, 0) :]]

    async def get_run(self, run_id: str) -> RunSummary | None:
        return self._runs.get(run_id)

    async def list_runs(
        self,
        *,
        statuses: Sequence[RunStatus] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RunSummary]:
        rows = [
            r for r in self._runs.values() if statuses is None or r.status in statuses
        ]
        rows.sort(key=lambda r: (r.created_at, r.run_id), reverse=True)
        return rows[offset : offset + limit]

    async def aclose(self) -> None:
        return None
