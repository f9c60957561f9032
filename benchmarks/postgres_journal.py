"""The PostgreSQL journal against the SQLite one: appends and W1.

What is measured, for ``PostgresStore`` and ``SQLiteStore`` alike:

* **appends per second**: one run's events appended one per call, each
  call awaited before the next (as a run's steps are), 2,000 of them on a
  fresh journal; the median of the repetitions;
* **W1** (``w1_replan_loop``'s run: a 20-task chain with two replans, the
  model answering at once): microseconds per executed task from ``submit``
  to ``result``, the median of the repetitions, each on a fresh journal.

Each PostgreSQL repetition gets a schema of its own in the database the DSN
names (dropped afterwards); each SQLite one a fresh file (``synchronous``
as ``--synchronous`` says). The server is whatever the DSN reaches: a
server on this machine over a unix socket gives the journal's own cost,
one across a network adds its round trips (about four per append).

Run: ``python benchmarks/postgres_journal.py --dsn 'host=... dbname=...'
[--backend trio] [--repetitions N]`` (``--dsn`` defaults to
``REPLAN_BENCH_DSN``).
"""

from __future__ import annotations

import argparse
import itertools
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta

import anyio
from _common import (
    JOURNAL,
    BenchModel,
    add_options,
    check_repetitions,
    check_replan_loop,
    median,
    now,
    replan_loop_model,
    replan_loop_spec,
    settle,
    sqlite_journal,
)

from replan import RunSpec, RunStatus, Supervisor
from replan.messages import TaskStarted
from replan.store import PostgresStore, RunSummary, Store

REPETITIONS = 7
APPENDS = 2_000
T0 = datetime(2026, 1, 5, 8, 30, tzinfo=UTC)

_schemas = itertools.count()


@asynccontextmanager
async def postgres_journal(dsn: str) -> AsyncIterator[PostgresStore]:
    """A fresh journal in a schema of its own, dropped on exit."""
    import psycopg
    from psycopg import sql

    schema = f"replan_bench_{os.getpid()}_{next(_schemas)}"
    store = PostgresStore(dsn, schema=schema)
    try:
        yield store
    finally:
        await store.aclose()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema))
            )


async def appends_per_s(journal: AbstractAsyncContextManager[Store]) -> float:
    """One run's ``APPENDS`` events, one per awaited append."""
    async with journal as store:
        settle()
        started = now()
        for seq in range(1, APPENDS + 1):
            at = T0 + timedelta(microseconds=seq)
            event = TaskStarted(seq=seq, at=at, task_id=f"t{seq}", attempt=1)
            summary = RunSummary(
                run_id="run-1",
                goal="append",
                kind="plan",
                pattern="discovery",
                status=RunStatus.RUNNING,
                created_at=T0,
                updated_at=at,
                last_seq=seq,
            )
            await store.append("run-1", [event], summary)
        return APPENDS / (now() - started)


async def w1_us_per_step(
    journal: AbstractAsyncContextManager[Store], spec: RunSpec
) -> float:
    """W1 once on a fresh supervisor and journal."""
    model = BenchModel(replan_loop_model)
    async with journal as store, Supervisor(model=model, store=store) as sup:
        settle()
        started = now()
        handle = await sup.submit(spec)
        result = await handle.result()
        elapsed = now() - started
    check_replan_loop(result)
    return elapsed / result.task_executions * 1e6


async def measure(dsn: str, repetitions: int) -> dict[str, float]:
    journals: dict[str, Callable[[], AbstractAsyncContextManager[Store]]] = {
        "sqlite": sqlite_journal,
        "postgres": lambda: postgres_journal(dsn),
    }
    spec = replan_loop_spec()
    samples: dict[str, list[float]] = {}
    for journal in journals.values():
        await w1_us_per_step(journal(), spec)  # warm-up
    # Alternated, so that the shared machine's changing speed weighs on both.
    for _ in range(repetitions):
        for name, journal in journals.items():
            rate = await appends_per_s(journal())
            samples.setdefault(f"{name}_appends_per_s", []).append(rate)
            step = await w1_us_per_step(journal(), spec)
            samples.setdefault(f"{name}_w1_us_per_step", []).append(step)
    return {key: median(values) for key, values in samples.items()}


def main(
    dsn: str, backend: str = "asyncio", repetitions: int | None = None
) -> dict[str, float]:
    """Measure both journals on ``backend``; print and return the figures."""
    repetitions = check_repetitions(REPETITIONS if repetitions is None else repetitions)
    figures = anyio.run(measure, dsn, repetitions, backend=backend)
    print(
        f"PostgreSQL vs SQLite journal ({backend}, median of {repetitions}; "
        f"SQLite synchronous={JOURNAL['synchronous']})"
    )
    for key, value in figures.items():
        print(f"  {key:<28} {value:>10,.0f}")
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="The PostgreSQL journal against the SQLite one"
    )
    add_options(parser)
    parser.add_argument(
        "--dsn",
        default=os.environ.get("REPLAN_BENCH_DSN"),
        help="a libpq connection string (default: REPLAN_BENCH_DSN)",
    )
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn (or REPLAN_BENCH_DSN) names the PostgreSQL database")
    JOURNAL["synchronous"] = args.synchronous
    main(args.dsn, backend=args.backend, repetitions=args.repetitions)
