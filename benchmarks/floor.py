"""The floor under W1: its actor round trips and journal commits, bare.

A W1 run makes 29 actor round trips (20 executions, 4 reviews, 2 replans,
2 alignment checks, 1 synthesis) and 31 journal appends. This script does
exactly those, with nothing of replan around them:

* **round trips**: 29 request/reply pairs between two bare anyio tasks over
  a pair of bounded memory object streams, each sent without waiting
  (``send_nowait``: one pass of the event loop each way, as replan's pools
  do; ``await send()`` costs one more), with no envelope, reply slot,
  supervision or pydantic message;
* **journal**: the events a real W1 run journals (taken from one, run
  first with a ``MemoryStore``), in the same 31 groups, made into rows and
  committed by ``SQLiteStore``'s own functions for them: one
  multi-row ``INSERT`` per append, WAL, ``synchronous=NORMAL``, a fresh
  file per repetition (W1 starts each repetition on a fresh file too).

No state is folded, no decision made, no model answer built or checked.
The figures are in W1's unit, microseconds per executed task (20 per run),
medians of 21 repetitions:

* ``floor_hops``: the round trips alone;
* ``floor_commits``: the commits alone (rows serialized beforehand);
* ``floor_journal``: serialization and commits;
* ``floor_total``: round trips, serialization and commits, interleaved as a
  run interleaves them;
* ``w1``: W1 itself (``w1_replan_loop.one_run``), for comparison.

Each repetition takes every variant and W1 in turn, so that the shared
machine's changing speed weighs on all of them alike.

``120 - floor_total`` is what W1's target leaves for everything else a run
does: the events' construction and folding into the run's state, the
decisions, the actor runtime's supervision and the messages between roles.

Run: ``python benchmarks/floor.py [--backend trio] [--repetitions N]``
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Sequence
from typing import Any

import anyio
from _common import (
    W1_TASKS,
    BenchModel,
    check_repetitions,
    check_replan_loop,
    median,
    now,
    replan_loop_model,
    replan_loop_spec,
    run_script,
    settle,
)
from w1_replan_loop import one_run as w1_run

from replan import Supervisor
from replan.messages import Event
from replan.store import MemoryStore, RunSummary
from replan.store._sqlite import _SCHEMA_V1, _event_row, _flat, _insert_rows

EVENTS_TABLE = _SCHEMA_V1[0]
"""The journal's own ``events`` table."""

REPETITIONS = 21
ROUND_TRIPS = 29
"""Model-backed actor calls in a W1 run."""
W1_TARGET_US = 120.0


class _Recording(MemoryStore):
    """A ``MemoryStore`` that keeps each append's events, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[list[Event]] = []

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        await super().append(run_id, events, summary)
        self.appends.append(list(events))


async def w1_appends() -> tuple[str, list[list[Event]]]:
    """The run id and the appends of one real W1 run."""
    store = _Recording()
    async with Supervisor(model=BenchModel(replan_loop_model), store=store) as sup:
        handle = await sup.submit(replan_loop_spec())
        result = await handle.result()
    check_replan_loop(result)
    return result.run_id, store.appends


def rows_of(run_id: str, events: Sequence[Event]) -> list[object]:
    """The parameters of one append's multi-row INSERT, as the store builds
    them."""
    return _flat([_event_row(run_id, event) for event in events])


class Journal:
    """A fresh WAL journal file with W1's table, committed as replan does."""

    def __init__(self, directory: str) -> None:
        self.conn = sqlite3.connect(
            os.path.join(directory, "journal.db"), isolation_level=None
        )
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute("PRAGMA wal_autocheckpoint = 0")
        self.conn.execute(EVENTS_TABLE)

    def commit(self, sql: str, values: list[object]) -> None:
        # One statement outside a transaction: committed when it returns.
        self.conn.execute(sql, values)

    def close(self) -> None:
        self.conn.close()


async def one_run(
    run_id: str,
    appends: list[list[Event]],
    *,
    hops: bool,
    journal: bool,
    serialize: bool,
) -> float:
    """One W1-shaped run of the chosen parts; wall microseconds per task."""
    sqls = [_insert_rows(len(events)) for events in appends]
    ready = [rows_of(run_id, events) for events in appends]
    request_send, request_receive = anyio.create_memory_object_stream[int](1)
    reply_send, reply_receive = anyio.create_memory_object_stream[int](1)

    async def worker() -> None:
        async with request_receive, reply_send:
            async for request in request_receive:
                reply_send.send_nowait(request)

    with tempfile.TemporaryDirectory(prefix="replan-floor-") as directory:
        store = Journal(directory) if journal else None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker)
                settle()
                started = now()
                for index, events in enumerate(appends):
                    if store is not None:
                        values = rows_of(run_id, events) if serialize else ready[index]
                        store.commit(sqls[index], values)
                    if hops and index < ROUND_TRIPS:
                        request_send.send_nowait(index)
                        await reply_receive.receive()
                elapsed = now() - started
                await request_send.aclose()
        finally:
            if store is not None:
                store.close()
            await reply_receive.aclose()
    return elapsed / W1_TASKS * 1e6


async def measure(repetitions: int) -> dict[str, float]:
    """Every variant and W1 itself, taken in turn within each repetition so
    that the machine's changing speed weighs on all of them alike."""
    run_id, appends = await w1_appends()
    variants: dict[str, dict[str, Any]] = {
        "floor_hops": {"hops": True, "journal": False, "serialize": False},
        "floor_commits": {"hops": False, "journal": True, "serialize": False},
        "floor_journal": {"hops": False, "journal": True, "serialize": True},
        "floor_total": {"hops": True, "journal": True, "serialize": True},
    }
    spec = replan_loop_spec()
    samples: dict[str, list[float]] = {key: [] for key in [*variants, "w1"]}
    for repetition in range(repetitions + 1):  # the first is a warm-up
        for key, parts in variants.items():
            sample = await one_run(run_id, appends, **parts)
            if repetition:
                samples[key].append(sample)
        wall, _ = await w1_run(spec)
        if repetition:
            samples["w1"].append(wall)
    return {key: median(values) for key, values in samples.items()}


LABELS = {
    "floor_hops": f"{ROUND_TRIPS} bare round trips",
    "floor_commits": "31 commits (rows ready)",
    "floor_journal": "serialize + 31 commits",
    "floor_total": "all of the above",
    "w1": "W1 itself (same minutes)",
}


def main(backend: str = "asyncio", repetitions: int | None = None) -> dict[str, float]:
    """Measure the floor on ``backend``; print and return the figures."""
    repetitions = check_repetitions(REPETITIONS if repetitions is None else repetitions)
    figures = anyio.run(measure, repetitions, backend=backend)
    print(f"W1's floor ({backend}, median of {repetitions}; us per executed task)")
    for key, value in figures.items():
        print(f"  {LABELS[key]:<28} {value:8.1f} us/step")
    left = W1_TARGET_US - figures["floor_total"]
    print(f"  {'left of the 120 us target':<28} {left:8.1f} us/step")
    return figures


if __name__ == "__main__":
    run_script(main, "The floor under W1: its round trips and commits, bare")
