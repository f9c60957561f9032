"""The journal is the truth: replaying it rebuilds the result exactly."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
import scripts
from scripts import DelegatingStore

import replan
from replan import (
    Alignment,
    GateResolution,
    MemoryStore,
    ModelRequest,
    PlanProposal,
    ReplanOutcome,
    RunHandle,
    RunSpec,
    RunStatus,
    ScriptedModel,
    Store,
    Supervisor,
    Synthesis,
    TaskDraft,
    TaskOutcome,
    TokenUsage,
    Trigger,
    Verdict,
    replay,
)
from replan.messages import (
    EVENT_ADAPTER,
    Event,
    GateOpened,
    GateResolved,
    PlanCreated,
    RunSubmitted,
    TaskFinished,
    TaskStarted,
    UsageRecorded,
)
from replan.store import RunSummary, SQLiteStore
from replan.supervisor import apply, fold_journal
from replan.supervisor._versions import build_version

PLAN = [
    TaskDraft(key="a", description="measure", milestone=True),
    TaskDraft(key="b", description="fit", depends_on=["a"]),
    TaskDraft(key="c", description="report", depends_on=["b"]),
]
REVISED = [
    TaskDraft(key="x", description="measure wider", depends_on=["t1"], milestone=True),
    TaskDraft(key="y", description="report wider", depends_on=["x"]),
]


def eventful(request: ModelRequest) -> Any:
    """A run with a transient retry (t1), a scope shift behind a gate (first
    milestone), and a refused new-critical-path replan (second milestone)."""
    ctx = request.context
    match (request.role, request.purpose):
        case ("executor", "execute"):
            task = ctx["task"]
            if task.key == "a" and task.attempts == 1:
                return TaskOutcome(success=False, transient=True, reason="rate limited")
            findings = [f"{task.key} found something"] if task.key in "ax" else []
            return TaskOutcome(
                success=True, summary=f"did {task.key}", findings=findings
            )
        case ("executor", "synthesize"):
            return Synthesis(output="the report", sources=["t1", "t4"])
        case ("reviewer", "milestone"):
            if ctx["milestone_index"] == 1:
                return Verdict(
                    decision="replan", trigger=Trigger.SCOPE_SHIFT, rationale="wider"
                )
            if ctx["milestone_index"] == 2:
                return Verdict(
                    decision="replan",
                    trigger=Trigger.NEW_CRITICAL_PATH,
                    rationale="a shortcut, maybe",
                    confidence=0.2,
                    corroborating_sources=0,
                )
            return Verdict(decision="continue")
        case ("planner", "replan"):
            return PlanProposal(tasks=REVISED, rationale="measure wider")
        case ("ranker", "alignment"):
            return Alignment(aligned=[True] * len(ctx["proposed"]))
    raise AssertionError(f"unexpected request {request.role}/{request.purpose}")


def scripted() -> ScriptedModel:
    return ScriptedModel(
        eventful, usage=TokenUsage(input_tokens=11, output_tokens=7, calls=1)
    )


@asynccontextmanager
async def approving_every_gate(sup: Supervisor) -> AsyncIterator[None]:
    async def approve_forever() -> None:
        while True:
            for gate in sup.gates.pending():
                await sup.gates.resolve(
                    gate.gate_id, GateResolution(decision="approve", by="gina")
                )
            await anyio.sleep(0.005)

    async with anyio.create_task_group() as tg:
        tg.start_soon(approve_forever)
        yield
        tg.cancel_scope.cancel()


async def run_eventful(store: Store) -> tuple[Supervisor, RunHandle, replan.RunResult]:
    async with Supervisor(scripted(), store) as sup, approving_every_gate(sup):
        handle = await sup.submit(RunSpec(goal="measure and report", tasks=PLAN))
        with anyio.fail_after(10):
            result = await handle.result()
    return sup, handle, result


def assert_eventful(result: replan.RunResult, events: Sequence[Event]) -> None:
    """The run really had what the journal tests claim it had."""
    assert result.status is RunStatus.COMPLETED
    assert [r.outcome for r in result.replans] == [
        ReplanOutcome.APPLIED,
        ReplanOutcome.REFUSED_THRESHOLD,
    ]
    assert result.versions[-1].approved_by == "gina"
    assert any(isinstance(e, GateOpened) for e in events)
    assert any(isinstance(e, GateResolved) for e in events)
    assert any(isinstance(e, TaskFinished) and e.outcome.transient for e in events), (
        "no transient retry"
    )
    assert result.task_executions == 4  # t1 twice, then t4 and t5
    assert result.usage.total.total_tokens > 0
    assert result.output == "the report"


async def test_replaying_the_memory_journal_rebuilds_the_result_exactly() -> None:
    store = MemoryStore()
    sup, handle, result = await run_eventful(store)
    events = await store.read(handle.run_id)

    assert_eventful(result, events)
    assert await sup.replay(handle.run_id) == result
    assert await handle.result() == result
    assert replay(events).result() == result
    assert replay(events) == handle.state


async def test_replaying_the_sqlite_journal_rebuilds_the_result_exactly(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    store = SQLiteStore(path)
    try:
        sup, handle, result = await run_eventful(store)
        assert_eventful(result, await store.read(handle.run_id))
        assert await sup.replay(handle.run_id) == await handle.result()
    finally:
        await store.aclose()

    # A new store on the same file, after the supervisor closed, agrees too.
    async with SQLiteStore(path) as reopened:
        events = await reopened.read(handle.run_id)
        assert replay(events).result() == result
        assert await Supervisor(scripted(), reopened).replay(handle.run_id) == result
        summary = await reopened.get_run(handle.run_id)
    assert summary is not None
    assert summary.status is RunStatus.COMPLETED
    assert summary.last_seq == len(events)


async def test_every_event_of_a_run_round_trips_through_json() -> None:
    store = MemoryStore()
    _, handle, result = await run_eventful(store)
    with anyio.fail_after(10):
        events = [event async for event in handle.events()]

    assert_eventful(result, events)
    kinds = {e.kind for e in events}
    assert kinds >= {
        "run_submitted",
        "plan_created",
        "task_started",
        "task_finished",
        "milestone_reviewed",
        "replan_refused",
        "replan_applied",
        "gate_opened",
        "gate_resolved",
        "usage_recorded",
        "run_finished",
    }
    for event in events:
        raw = EVENT_ADAPTER.dump_json(event)
        again = EVENT_ADAPTER.validate_json(raw)
        assert again == event
        assert type(again) is type(event)
        assert EVENT_ADAPTER.dump_json(again) == raw


class RecordingStore(DelegatingStore):
    """A Store that notes, at every append, how far the live state had got."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.handle: RunHandle | None = None
        self.appends: list[tuple[int, list[int]]] = []
        """(the live ``handle.state.seq``, the seqs being appended)."""

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        if self.handle is not None:
            self.appends.append((self.handle.state.seq, [e.seq for e in events]))
        await self.inner.append(run_id, events, summary)


async def test_events_are_journaled_before_the_state_changes() -> None:
    store = RecordingStore(MemoryStore())
    assert isinstance(store, Store)
    async with Supervisor(scripted(), store) as sup, approving_every_gate(sup):
        handle = await sup.submit(RunSpec(goal="measure and report", tasks=PLAN))
        # No checkpoint between submit returning and this line: only the
        # run_submitted append happened before the proxy could watch.
        store.handle = handle
        with anyio.fail_after(10):
            result = await handle.result()
    events = await store.read(handle.run_id)
    assert_eventful(result, events)

    assert store.appends
    for live_seq, appended in store.appends:
        assert appended, "an empty append"
        assert live_seq < min(appended), (live_seq, appended)
    # Every event but run_submitted went through the watched appends, in order.
    watched = [seq for _, appended in store.appends for seq in appended]
    assert watched == list(range(2, len(events) + 1))


class YieldingStore(DelegatingStore):
    """A Store whose append lets every other task run before it lands.

    A MemoryStore's append never yields, so nothing could run between a
    start being staged and being journaled; a real store's append does.
    """

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        await anyio.wait_all_tasks_blocked()
        await self.inner.append(run_id, events, summary)


async def test_a_task_reaches_the_executor_only_after_its_start_is_journaled() -> None:
    store = YieldingStore(MemoryStore())
    unjournaled: list[tuple[str, int]] = []

    async def execute(request: ModelRequest) -> TaskOutcome:
        task = scripts.task_of(request)
        journal = await store.read(request.run_id or "")
        if not any(
            isinstance(e, TaskStarted)
            and (e.task_id, e.attempt) == (task.id, task.attempts)
            for e in journal
        ):
            unjournaled.append((task.id, task.attempts))
        return scripts.clean(request)

    model = scripts.scripted(execute=execute)
    async with Supervisor(model, store) as sup:
        handle = await sup.submit(
            scripts.spec(scripts.independent(4), max_concurrency=2)
        )
        with anyio.fail_after(10):
            result = await handle.result()

    assert result.status is RunStatus.COMPLETED
    assert len(model.calls_for("executor", "execute")) == 4
    assert unjournaled == []


@pytest.mark.parametrize("cut", [0.25, 0.5, 0.75])
async def test_every_prefix_of_the_journal_replays_to_a_consistent_state(
    cut: float,
) -> None:
    store = MemoryStore()
    _, handle, _ = await run_eventful(store)
    events = await store.read(handle.run_id)
    k = max(1, int(len(events) * cut))
    state = replay(events[:k])
    assert state.seq == k
    # Folding the rest onto the prefix's state ends where the whole run ended.
    for event in events[k:]:
        state = replan.apply(state, event)
    assert state == handle.state


async def test_replaying_an_unknown_run_raises_unknown_run_error() -> None:
    async with Supervisor(scripted()) as sup:
        with pytest.raises(replan.UnknownRunError):
            await sup.replay("no-such-run")


class Gapped(DelegatingStore):
    """A journal with one event lost (deleted by hand, say)."""

    def __init__(self, inner: Store, lost_seq: int) -> None:
        super().__init__(inner)
        self.lost_seq = lost_seq

    async def read(self, run_id: str, after: int = 0) -> list[replan.Event]:
        events = await self.inner.read(run_id, after)
        return [e for e in events if e.seq != self.lost_seq]


async def test_a_journal_missing_an_event_is_reported_corrupt_naming_the_next() -> None:
    store = MemoryStore()
    async with Supervisor(scripted(), store) as sup:
        handle = await sup.submit(RunSpec(goal="g", tasks=scripts.chain(2)))
        with anyio.fail_after(10):
            await handle.result()
    gapped = Gapped(store, lost_seq=4)
    async with Supervisor(scripted(), gapped) as sup:
        with pytest.raises(replan.JournalCorrupt) as caught:
            await sup.replay(handle.run_id)
    assert (caught.value.run_id, caught.value.seq) == (handle.run_id, 5)
    assert "does not follow the events before it" in str(caught.value)
    with pytest.raises(replan.JournalCorrupt):
        fold_journal(handle.run_id, [])


async def test_an_attempts_tokens_ride_on_its_task_finished_event() -> None:
    store = MemoryStore()
    _, handle, result = await run_eventful(store)
    events = await store.read(handle.run_id)
    finished = [e for e in events if isinstance(e, TaskFinished)]
    assert finished
    assert all(e.usage is not None and e.usage.calls == 1 for e in finished)
    executor = [
        e for e in events if isinstance(e, UsageRecorded) and e.role == "executor"
    ]
    # Only the synthesis is journaled on its own; executions are not.
    assert [e.purpose for e in executor] == ["synthesize"]
    counted = sum((e.usage for e in finished), TokenUsage())
    synthesis = executor[0].usage
    assert result.usage.by_role["executor"] == counted + synthesis


def test_a_journal_with_usage_in_separate_events_replays_to_the_same_usage() -> None:
    # Journals written before task_finished carried usage keep working.
    now = datetime.now(UTC)
    spec = RunSpec(goal="one step", tasks=[TaskDraft(key="a", description="do a")])
    state = apply(None, RunSubmitted(seq=1, at=now, run_id="r", spec=spec))
    version = build_version(
        state, spec.tasks, trigger=None, reason="", phase="main", replace_pending=False
    )
    state = apply(state, PlanCreated(seq=2, at=now, version=version))
    state = apply(state, TaskStarted(seq=3, at=now, task_id="t1", attempt=1))
    tokens = TokenUsage(input_tokens=30, output_tokens=9, calls=1)
    done = TaskOutcome(success=True, summary="done")
    folded = apply(
        state,
        TaskFinished(seq=4, at=now, task_id="t1", outcome=done, usage=tokens),
    )
    separate = apply(
        apply(state, TaskFinished(seq=4, at=now, task_id="t1", outcome=done)),
        UsageRecorded(seq=5, at=now, role="executor", purpose="execute", usage=tokens),
    )
    assert folded.usage == separate.usage
    assert folded.usage.by_role["executor"] == tokens
    assert folded.tasks == separate.tasks
