"""An explore run in a process of its own, to be killed in its review.

``python explore_killed.py DB NTH ANSWERED``: starts the run of
``test_explore_resume.two_cycles`` on the SQLite journal ``DB``; the
``NTH`` critique never returns. Once ``ANSWERED`` critiques are journaled it
prints the run's id and waits to be killed.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
from explore_scripts import explore_spec
from test_explore_resume import two_cycles

from replan import ModelRequest, ScriptedModel, Supervisor
from replan.store import SQLiteStore


async def main(path: str, nth: int, answered: int) -> None:
    script = two_cycles()
    critiques = 0

    async def answer(request: ModelRequest) -> Any:
        nonlocal critiques
        if request.purpose == "critique":
            critiques += 1
            if critiques == nth:
                await anyio.sleep_forever()
        return script(request)

    async with (
        SQLiteStore(path) as store,
        Supervisor(ScriptedModel(answer), store) as sup,
    ):
        run_id = (await sup.submit(explore_spec())).run_id
        while True:
            journal = await store.read(run_id)
            if sum(e.kind == "hypothesis_critiqued" for e in journal) >= answered:
                break
            await anyio.sleep(0.01)
        sys.stdout.write(run_id + "\n")
        sys.stdout.flush()
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
