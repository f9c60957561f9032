"""A supervisor on a SQLite journal that holds, to be killed, around a
side-effect tool call a person answered.

Run as ``python approval_process.py JOURNAL OUTBOX MOMENT``. The run has one
task, whose model asks to email ``ana``; the process answers the gate itself
(``reject`` for the moment ``rejected``, ``approve`` otherwise) and holds,
printing the run id on a line first, at ``MOMENT``:

* ``approved``: the approval is journaled; the call has not started (its
  record in the tool effect ledger is about to be written);
* ``rejected``: the rejection is journaled; the model has not yet read it;
* ``started``: the tool is sending the email (it has not returned);
* ``sent``: the email went and its result is recorded; the task has not
  answered yet.

Every email sent appends ``to key`` to ``OUTBOX``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
from scripts import chain, scripted, spec

from replan import (
    GateResolution,
    ModelRequest,
    ModelResponse,
    Supervisor,
    TaskOutcome,
    tool,
)
from replan.messages import GateOpened, ToolCall
from replan.store import SQLiteStore, ToolEffectRecord

EMAIL = ToolCall(id="c1", name="send_email", arguments='{"to": "ana"}')


async def main(journal: Path, outbox: Path, moment: str) -> None:
    run_id = ""

    async def hold() -> None:
        sys.stdout.write(f"{run_id}\n")
        sys.stdout.flush()
        await anyio.sleep_forever()

    @tool(side_effect=True)
    async def send_email(to: str, idempotency_key: str) -> str:
        """Email someone."""
        with outbox.open("a") as sent:
            sent.write(f"{to} {idempotency_key}\n")
        if moment == "started":
            await hold()
        return f"sent to {to}"

    async def execute(request: ModelRequest) -> Any:
        if not request.transcript:
            return ModelResponse(tool_calls=[EMAIL])
        if moment in ("rejected", "sent"):
            await hold()
        return TaskOutcome(success=True, summary="emailed")

    class Ledger(SQLiteStore):
        async def record_tool_effect(
            self, run_id: str, record: ToolEffectRecord
        ) -> None:
            if moment == "approved" and record.content is None:
                await hold()
            await super().record_tool_effect(run_id, record)

    decision = "reject" if moment == "rejected" else "approve"
    async with (
        Ledger(journal) as store,
        Supervisor(scripted(execute=execute), store, tools=[send_email]) as sup,
    ):
        handle = await sup.submit(spec(chain(1)))
        run_id = handle.run_id
        async for event in handle.events():
            if isinstance(event, GateOpened):
                answer = GateResolution(decision=decision, by="ana")
                await sup.gates.resolve(event.request.gate_id, answer)
        await anyio.sleep_forever()  # pragma: no cover - killed before


if __name__ == "__main__":
    journal, outbox, moment = sys.argv[1:]
    anyio.run(main, Path(journal), Path(outbox), moment)
