"""The run journal: the protocol, an in-memory store and SQLite."""

from __future__ import annotations

from ._memory import MemoryStore as MemoryStore
from ._port import JournalConflict as JournalConflict
from ._port import RunSummary as RunSummary
from ._port import Store as Store
from ._sqlite import SQLiteStore as SQLiteStore

__all__ = ("JournalConflict", "MemoryStore", "RunSummary", "SQLiteStore", "Store")
