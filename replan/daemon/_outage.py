"""Requests that meet a journal that cannot be used: 503, not 500.

A PostgreSQL server out of reach for longer than the store waits for it
(``reconnect_s``), or a SQLite file that is locked too long or fails,
makes a read or a write raise the driver's ``OperationalError``. Left to
the catch-all handler, the answer was a 500 "internal error" with two
tracebacks in the log (the handler's and the server's, which also closed
the client's connection). It is the journal's outage, not the request's
fault: the answer is 503 with ``Retry-After``, naming the journal's
problem, which the command line and load balancers wait through.
"""

from __future__ import annotations

import logging
import sqlite3

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ._schemas import Problem
from ._service import Daemon

logger = logging.getLogger("replan.daemon")

RETRY_AFTER_S = 5


def handle_journal_outages(app: FastAPI, daemon: Daemon) -> None:
    """Answer a journal's ``OperationalError`` with 503 and ``Retry-After``."""

    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        why = daemon.journal_outage or " ".join(str(exc).split())
        logger.warning("%s: the journal cannot be used: %s", request.url.path, why)
        problem = Problem(detail=f"the journal cannot be used for now: {why}")
        return JSONResponse(
            problem.model_dump(),
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    app.add_exception_handler(sqlite3.OperationalError, unavailable)
    if daemon.settings.journal_dsn is not None:
        import psycopg  # the PostgreSQL journal's driver, there already

        app.add_exception_handler(psycopg.OperationalError, unavailable)
