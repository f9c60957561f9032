"""A run whose results cannot be journaled fails; its driver does not crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from scripts import chain, clean, scripted, spec, task_of, with_finding
from stores import STORE_KINDS, open_store

from replan import (
    GateError,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    RunStatus,
    Supervisor,
    Synthesis,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    ToolCall,
    TransientModelError,
    Verdict,
    tool,
)
from replan.messages import RunFinished, TaskFinished, TaskStarted
from replan.store import Store

UNSTORABLE = "half a character: \udfff"
"""A lone UTF-16 surrogate: a str in Python, no text in UTF-8 or JSON."""


def unstorable_at(key: str) -> Any:
    def execute(request: ModelRequest) -> TaskOutcome:
        if task_of(request).key == key:
            return TaskOutcome(success=True, summary=UNSTORABLE)
        return clean(request)

    return execute


@pytest.mark.parametrize("milestone", [False, True], ids=["plain", "milestone"])
@pytest.mark.parametrize("store_kind", STORE_KINDS)
async def test_a_task_result_no_journal_can_store_fails_the_run(
    tmp_path: Path, store_kind: str, milestone: bool, request: pytest.FixtureRequest
) -> None:
    # At a milestone the finish is journaled at once, before the review; the
    # durable stores' effect ledgers cannot keep the result either.
    store: Store = open_store(store_kind, request, tmp_path)
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


async def test_a_side_effect_call_that_cannot_be_journaled_is_refused_not_run() -> None:
    # A model of one's own may hand over a call whose id no journal can
    # store: it cannot wait at a gate, so it is refused and never runs.
    ran: list[str] = []

    @tool(side_effect=True)
    def send_email(to: str) -> str:
        """Email someone."""
        ran.append(to)
        return "sent"

    def execute(request: ModelRequest) -> Any:
        if not request.transcript:
            call = ToolCall(id="\udfff", name="send_email", arguments='{"to": "a"}')
            return ModelResponse(tool_calls=[call])
        [result] = request.transcript[-1].results
        return TaskOutcome(success=False, reason=result.content)

    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(
            scripted(execute=execute), store, tools=[send_email]
        ) as sup:
            handle = await sup.submit(spec(chain(1)))
            result = await handle.result()

    assert ran == []
    assert sup.gates.pending() == []
    assert "the tool call cannot be journaled" in (result.tasks[0].result.reason or "")


async def test_an_approval_that_carries_unstorable_staged_events_fails_the_run() -> (
    None
):
    # The reviewer's first call fails with raw output no journal can store;
    # the driver stages that failure and retries. Meanwhile a person approves
    # a side effect: that answer's append carries the staged failure with it,
    # on the approval's own task, which must end the run, not crash it.
    retried = anyio.Event()
    release = anyio.Event()
    reviews = 0

    async def milestone(request: ModelRequest) -> Verdict:
        nonlocal reviews
        reviews += 1
        if reviews == 1:
            raise TransientModelError("rate limited", raw_output=UNSTORABLE)
        retried.set()
        await release.wait()
        return Verdict(decision="continue")

    tasks = [
        TaskDraft(key="send", description="send the email", requires_approval=True),
        TaskDraft(key="read", description="read the sources", milestone=True),
    ]
    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(
            scripted(execute=with_finding, milestone=milestone), store
        ) as sup:
            handle = await sup.submit(spec(tasks))
            await retried.wait()
            [gate] = sup.gates.pending()

            async def release_the_reviewer() -> None:
                # The approval's task has journaled by now, or failed to.
                await anyio.sleep(0.05)
                release.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(release_the_reviewer)
                with pytest.raises(GateError, match="the run ended"):
                    await sup.gates.resolve(gate.gate_id, {"decision": "approve"})
            result = await handle.result()
            replayed = await sup.replay(handle.run_id)

    assert result.status is RunStatus.FAILED
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("an event could not be journaled: ")
    assert [t.status for t in result.tasks] == [
        TaskStatus.PENDING,
        TaskStatus.COMPLETED,
    ]
    assert replayed == result
