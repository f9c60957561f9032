"""The journals the store-generic tests run against, by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from replan.store import MemoryStore, SQLiteStore, Store

STORE_KINDS = ["memory", "sqlite", "postgres"]
"""Every store of the package; ``postgres`` needs the test server."""


def open_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A new, empty journal of ``kind``: in memory, in a file under
    ``tmp_path``, or in a fresh database of the test PostgreSQL server."""
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SQLiteStore(tmp_path / "j.db")
    from replan.store import PostgresStore

    return PostgresStore(request.getfixturevalue("postgres_dsn"))
