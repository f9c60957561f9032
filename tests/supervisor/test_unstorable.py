"""A run whose results cannot be journaled fails; its driver does not crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from scripts import chain, clean, scripted, spec, task_of

from replan import (
    MemoryStore,
    ModelRequest,
    RunStatus,
    Supervisor,
    Synthesis,
    TaskOutcome,
    TaskStatus,
)
from replan.messages import RunFinished, TaskFinished, TaskStarted
from replan.store import SQLiteStore, Store

UNSTORABLE = "half a character: \udfff"
"""A lone UTF-16 surrogate: a str in Python, no text in UTF-8 or JSON."""


def unstorable_at(key: str) -> Any:
    def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).key == key:
            return TaskOutcome(success=True, summary=UNSTORABLE)
        return clean(request)

    return execute


@pytest.mark.parametrize("milestone", [False, True], ids=["plain", "milestone"])
@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
async def test_a_task_result_no_journal_can_store_fails_the_run(
    tmp_path: Path, store_kind: str, milestone: bool
) -> None:
    # At a milestone the finish is journaled at once, before the review; the
    # SQLite store's effect ledger cannot keep the result either.
    store: Store = (
        MemoryStore() if store_kind == "memory" else SQLiteStore(tmp_path / "j.db")
    )
    model = scripted(execute=unstorable_at("s2"))
    with anyio.fail_after(10):
        async with Supervisor(model, store) as sup:
            tasks = chain(3, milestone_at=[2] if milestone else [])
            handle = await sup.submit(spec(tasks))
            result = await handle.result()
            events = await store.read(handle.run_id)
            replayed = await sup.replay(handle.run_id)
    await store.aclose()

    assert result.status is RunStatus.FAILED
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("an event could not be journaled: ")
    assert "surrogates not allowed" in result.stop_reason
    # What came before is kept; nothing of t2's result was, and t3 never ran.
    assert [t.status for t in result.tasks] == [
        TaskStatus.COMPLETED,
        TaskStatus.PENDING,
        TaskStatus.PENDING,
    ]
    assert [e.task_id for e in events if isinstance(e, TaskStarted)] == ["t1", "t2"]
    assert [e.task_id for e in events if isinstance(e, TaskFinished)] == ["t1"]
    assert isinstance(events[-1], RunFinished)
    assert replayed == result


async def test_a_synthesis_no_journal_can_store_fails_the_run_without_it() -> None:
    def synthesis(request: ModelRequest) -> Synthesis:
        return Synthesis(output=UNSTORABLE)

    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(scripted(synthesis=synthesis), store) as sup:
            handle = await sup.submit(spec(chain(2)))
            result = await handle.result()

    assert result.status is RunStatus.FAILED
    assert result.output is None
    assert all(t.status is TaskStatus.COMPLETED for t in result.tasks)
    assert (await sup.replay(handle.run_id)) == result
