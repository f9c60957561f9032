"""A second process on a PostgreSQL journal, for the tests that need one.

``python postgres_child.py append DSN RUN NAME COUNT``: once a line arrives
on stdin, try to append seq 1 to COUNT to RUN (task ids NAME), one call
each, and print which seqs this process won and which it lost.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import anyio

from replan.messages import RunStatus, TaskStarted
from replan.store import JournalConflict, PostgresStore, RunSummary


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def append(dsn: str, run_id: str, name: str, count: int) -> None:
    won: list[int] = []
    lost: list[int] = []
    async with PostgresStore(dsn) as store:
        say("ready")
        await anyio.to_thread.run_sync(sys.stdin.readline)
        for seq in range(1, count + 1):
            now = datetime.now(UTC)
            event = TaskStarted(seq=seq, at=now, task_id=name, attempt=1)
            summary = RunSummary(
                run_id=run_id,
                goal="two writers",
                kind="plan",
                pattern="discovery",
                status=RunStatus.RUNNING,
                created_at=now,
                updated_at=now,
                last_seq=seq,
            )
            try:
                await store.append(run_id, [event], summary)
            except JournalConflict:
                lost.append(seq)
            else:
                won.append(seq)
    say(json.dumps({"won": won, "lost": lost}))


if __name__ == "__main__":
    match sys.argv[1:]:
        case ["append", dsn, run_id, name, count]:
            anyio.run(append, dsn, run_id, name, int(count))
        case _:
            sys.exit(__doc__)
