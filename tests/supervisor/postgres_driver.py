"""A supervisor in a process of its own on a PostgreSQL journal, to be killed.

``python postgres_driver.py DSN LEASE_S``: submit a run of four chained
tasks whose third never returns, print the run's id once the third has
started, and wait (until the process is killed).
"""

from __future__ import annotations

import sys

import anyio
from scripts import chain, clean, scripted, spec, task_of

from replan import ModelRequest, Supervisor
from replan.store import PostgresStore


async def main(dsn: str, lease_s: float) -> None:
    reached = anyio.Event()

    async def execute(request: ModelRequest) -> object:
        if task_of(request).key == "s3":
            reached.set()
            await anyio.sleep_forever()
        return clean(request)

    async with (
        PostgresStore(dsn, lease_s=lease_s) as store,
        Supervisor(scripted(execute=execute), store) as sup,
    ):
        handle = await sup.submit(spec(chain(4), milestone_every=100))
        await reached.wait()
        sys.stdout.write(handle.run_id + "\n")
        sys.stdout.flush()
        await anyio.sleep_forever()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    anyio.run(main, sys.argv[1], float(sys.argv[2]))
