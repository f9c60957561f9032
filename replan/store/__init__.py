"""The run journal: the protocol, an in-memory store, SQLite and PostgreSQL."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr as _lazy_getattr
from ._memory import MemoryStore as MemoryStore
from ._port import DriverLease as DriverLease
from ._port import EffectLedger as EffectLedger
from ._port import EffectRecord as EffectRecord
from ._port import JournalConflict as JournalConflict
from ._port import JournalCorrupt as JournalCorrupt
from ._port import JournalRetention as JournalRetention
from ._port import LeaseLost as LeaseLost
from ._port import RequestOutcome as RequestOutcome
from ._port import RunLease as RunLease
from ._port import RunLeases as RunLeases
from ._port import RunOwner as RunOwner
from ._port import RunRequest as RunRequest
from ._port import RunRequests as RunRequests
from ._port import RunSummary as RunSummary
from ._port import Store as Store
from ._port import ToolEffectLedger as ToolEffectLedger
from ._port import ToolEffectRecord as ToolEffectRecord
from ._sqlite import SQLiteStore as SQLiteStore

if TYPE_CHECKING:
    from ._postgres import PostgresStore as PostgresStore

# PostgresStore loads psycopg (the ``postgres`` extra): only when first used,
# so that replan imports without it.
_LAZY = {"PostgresStore": "._postgres"}


if not TYPE_CHECKING:
    __getattr__ = _lazy_getattr(__name__, _LAZY, globals())


__all__ = (
    "DriverLease",
    "EffectLedger",
    "EffectRecord",
    "JournalConflict",
    "JournalCorrupt",
    "JournalRetention",
    "LeaseLost",
    "MemoryStore",
    "PostgresStore",
    "RequestOutcome",
    "RunLease",
    "RunLeases",
    "RunOwner",
    "RunRequest",
    "RunRequests",
    "RunSummary",
    "SQLiteStore",
    "Store",
    "ToolEffectLedger",
    "ToolEffectRecord",
)
