"""The run journal: the protocol, an in-memory store and SQLite."""

from __future__ import annotations

from ._memory import MemoryStore as MemoryStore
from ._port import DriverLease as DriverLease
from ._port import EffectLedger as EffectLedger
from ._port import EffectRecord as EffectRecord
from ._port import JournalConflict as JournalConflict
from ._port import JournalCorrupt as JournalCorrupt
from ._port import JournalRetention as JournalRetention
from ._port import RunSummary as RunSummary
from ._port import Store as Store
from ._port import ToolEffectLedger as ToolEffectLedger
from ._port import ToolEffectRecord as ToolEffectRecord
from ._sqlite import SQLiteStore as SQLiteStore

__all__ = (
    "DriverLease",
    "EffectLedger",
    "EffectRecord",
    "JournalConflict",
    "JournalCorrupt",
    "JournalRetention",
    "MemoryStore",
    "RunSummary",
    "SQLiteStore",
    "Store",
    "ToolEffectLedger",
    "ToolEffectRecord",
)
