"""Requests that meet a journal that cannot be used (a PostgreSQL server
out of reach for longer than the store waits, a SQLite file locked or
failing): 503 with Retry-After, naming the problem; not a 500.

In the daemon's own process (an ASGI client, no server).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from in_process import serving

from replan._demo import GOAL, demo_model
from replan.daemon import DaemonSettings, Token
from replan.daemon._service import Daemon

TOKEN = "journal-outage-token-0123"


class Failing:
    """The daemon's journal, whose reads raise ``error``."""

    def __init__(self, store: Any, error: Exception) -> None:
        self._store = store
        self._error = error

    async def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise self._error

    get_run = read = list_runs = read_tool_effects = _fail

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.mark.parametrize("journal", ["sqlite", "postgresql"])
async def test_reads_while_the_journal_cannot_be_used_get_503_with_retry_after(
    tmp_path: Path,
    journal: str,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if journal == "sqlite":
        dsn = None
        error: Exception = sqlite3.OperationalError("disk I/O error")
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        error = psycopg.OperationalError("connection is bad: no server")
    settings = DaemonSettings(data_dir=tmp_path, api_token=TOKEN, journal_dsn=dsn)
    daemon = Daemon(settings=settings, token=Token(TOKEN), model=demo_model())
    async with serving(daemon) as client:
        submitted = await client.post("/v1/runs", json={"goal": GOAL})
        assert submitted.status_code == 202, submitted.text
        run_id = submitted.json()["run_id"]
        store = daemon._store
        daemon._store = Failing(store, error)  # type: ignore[assignment]
        try:
            with caplog.at_level(logging.WARNING, logger="replan.daemon"):
                for path in ("/v1/runs", f"/v1/runs/{run_id}"):
                    answer = await client.get(path)
                    assert answer.status_code == 503, (path, answer.text)
                    assert answer.headers["retry-after"] == "5"
                    detail = answer.json()["detail"]
                    assert detail.startswith("the journal cannot be used for now: ")
                    assert str(error).split(":")[0] in detail
        finally:
            daemon._store = store
        assert (await client.get("/v1/runs")).status_code == 200
    records = [r for r in caplog.records if r.name == "replan.daemon"]
    assert all(r.exc_info is None for r in records)
    assert not any("unexpected error" in r.getMessage() for r in records)
