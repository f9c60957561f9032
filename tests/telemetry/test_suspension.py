"""No span stays open across an unbounded wait: the trace is suspended."""

from __future__ import annotations

import anyio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode
from scripts import (
    chain,
    first_then_continue,
    replan_verdict,
    scripted,
    spec,
    with_finding,
)
from spans import Tree, attr, until

from replan import (
    GateRequest,
    GateResolution,
    MemoryStore,
    RunStatus,
    ScriptedModel,
    Supervisor,
    Task,
    TaskContext,
    TaskDraft,
    TaskOutcome,
    Trigger,
    replay,
)
from replan.messages import TraceSuspended
from replan.telemetry import Telemetry, journaled_context, resumed_root
from replan.telemetry import _names as n


def scope_shift_model() -> ScriptedModel:
    return scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict(Trigger.SCOPE_SHIFT)),
    )


def points_at(carrier: dict[str, str] | None, span: ReadableSpan) -> bool:
    """The journaled W3C context names ``span``."""
    journaled = journaled_context(carrier)
    assert journaled is not None
    assert span.context is not None
    return (journaled.trace_id, journaled.span_id) == (
        span.context.trace_id,
        span.context.span_id,
    )


async def test_an_untimed_gate_suspends_the_trace_and_the_run_resumes_in_a_linked_one(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    store = MemoryStore()
    async with Supervisor(scope_shift_model(), store, tracer_provider=provider) as sup:
        handle = await sup.submit(spec(chain(3, milestone_at=[1])))
        gates: list[GateRequest] = []

        def journaled() -> bool:
            gates[:] = [
                g for g in sup.gates.pending() if g.gate_id in handle.state.gates
            ]
            return bool(gates) and handle.state.suspended_trace is not None

        await until(journaled)
        # While the person thinks, nothing of the run is left open.
        while_waiting = Tree(exporter.get_finished_spans())
        root = while_waiting.one(n.SPAN_RUN)
        assert attr(root, n.RUN_OUTCOME) == "suspended"
        assert "no timeout" in attr(root, n.SUSPEND_REASON)
        replan = while_waiting.one(n.SPAN_REPLAN)
        assert attr(replan, n.REPLAN_OUTCOME) == "suspended"
        gate = while_waiting.one(n.SPAN_GATE)
        assert while_waiting.parent(gate) is replan
        assert attr(gate, n.GATE_OUTCOME) == "suspended"
        assert attr(gate, n.GATE_ID) == gates[0].gate_id
        assert root.context is not None
        assert points_at(handle.state.suspended_trace, root)

        await sup.gates.resolve(
            gates[0].gate_id, GateResolution(decision="approve", by="alice")
        )
        with anyio.fail_after(5):
            result = await handle.result()
        events = await store.read(handle.run_id)

    (suspended,) = [e for e in events if isinstance(e, TraceSuspended)]
    assert points_at(suspended.carrier, root)
    assert replay(events).suspended_trace == suspended.carrier
    assert await sup.replay(handle.run_id) == result

    tree = Tree(exporter.get_finished_spans())
    assert len(tree.traces()) == 2
    first, second = sorted(tree.named(n.SPAN_RUN), key=lambda s: s.start_time or 0)
    assert first.context is not None
    assert second.context is not None
    assert second.context.trace_id != first.context.trace_id
    (link,) = second.links
    assert link.context.span_id == first.context.span_id
    assert (link.attributes or {})[n.LINK_KIND] == "resumes"
    assert attr(second, n.RUN_OUTCOME) == "completed"
    assert attr(second, n.RUN_SEGMENT) == 2
    assert attr(second, n.GEN_AI_CONVERSATION_ID) == result.run_id
    # The decision ends in the new trace, in a replan span linked to the old.
    old, new = sorted(tree.named(n.SPAN_REPLAN), key=lambda s: s.start_time or 0)
    assert tree.parent(new) is second
    assert new.links[0].context.span_id == old.context.span_id  # type: ignore[union-attr]
    assert attr(new, n.REPLAN_OUTCOME) == "applied"
    assert attr(new, n.REPLAN_APPROVED_BY) == "alice"
    assert attr(new, n.REPLAN_TRIGGER) == "scope_shift"
    assert [e.name for e in new.events] == [n.EVENT_GATE_RESOLVED]
    # Tasks of the new plan run in the new trace.
    later = [
        s
        for s in tree.named("invoke_agent executor")
        if attr(s, n.PURPOSE) == "execute"
    ]
    assert {attr(s, n.TASK_ID) for s in later if tree.parent(s) is second} == {
        "t4",
        "t5",
    }


async def test_a_timed_gate_keeps_its_await_approval_span_open_under_the_replan(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    store = MemoryStore()
    async with Supervisor(scope_shift_model(), store, tracer_provider=provider) as sup:
        handle = await sup.submit(spec(chain(3, milestone_at=[1]), gate_timeout_s=30))
        await until(
            lambda: [g for g in sup.gates.pending() if g.gate_id in handle.state.gates]
        )
        (gate,) = sup.gates.pending()
        assert not Tree(exporter.get_finished_spans()).named(n.SPAN_RUN)
        await anyio.sleep(0.05)
        await sup.gates.resolve(
            gate.gate_id, GateResolution(decision="reject", by="bob")
        )
        with anyio.fail_after(5):
            result = await handle.result()
        events = await store.read(handle.run_id)
    assert not any(isinstance(e, TraceSuspended) for e in events)
    tree = Tree(exporter.get_finished_spans())
    assert len(tree.traces()) == 1
    replan = tree.one(n.SPAN_REPLAN)
    waited = tree.one(n.SPAN_GATE)
    assert tree.parent(waited) is replan
    assert (waited.end_time or 0) - (waited.start_time or 0) >= 40_000_000  # ns
    assert attr(waited, n.GATE_DECISION) == "reject"
    assert attr(waited, n.GATE_DECIDED_BY) == "bob"
    assert attr(waited, n.GATE_TIMEOUT_S) == 30
    assert attr(replan, n.REPLAN_OUTCOME) == "rejected_by_human"
    assert result.replans[0].outcome.value == "rejected_by_human"


async def stopped_mid_task(provider: TracerProvider, store: MemoryStore) -> str:
    """Run a 2-task chain until its first task runs, then stop the supervisor."""
    started = anyio.Event()

    async def forever(task: Task, ctx: TaskContext) -> TaskOutcome:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with Supervisor(
        scope_shift_model(), store, task_runner=forever, tracer_provider=provider
    ) as sup:
        handle = await sup.submit(spec(chain(2)))
        await started.wait()
    return handle.run_id


async def test_a_supervisor_stop_suspends_the_trace_and_a_resumed_root_links_to_it(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    store = MemoryStore()
    with anyio.fail_after(5):
        run_id = await stopped_mid_task(provider, store)
    events = await store.read(run_id)
    (suspended,) = [e for e in events if isinstance(e, TraceSuspended)]
    tree = Tree(exporter.get_finished_spans())
    root = tree.one(n.SPAN_RUN)
    assert attr(root, n.RUN_OUTCOME) == "suspended"
    assert "supervisor stopped" in attr(root, n.SUSPEND_REASON)
    assert root.status.status_code is not StatusCode.ERROR
    (task,) = tree.named("invoke_agent executor")
    assert attr(task, n.ACTOR_OUTCOME) == "cancelled"
    assert task.status.status_code is not StatusCode.ERROR

    # What the daemon does when it takes the run up again from its journal.
    state = replay(events)
    assert state.suspended_trace == suspended.carrier
    again = resumed_root(state, telemetry=Telemetry(provider), segment=2)
    again.end()
    resumed = [
        s
        for s in Tree(exporter.get_finished_spans()).named(n.SPAN_RUN)
        if s is not root
    ]
    (new_root,) = resumed
    assert new_root.context.trace_id != root.context.trace_id  # type: ignore[union-attr]
    assert new_root.links[0].context.span_id == root.context.span_id  # type: ignore[union-attr]
    assert attr(new_root, n.GEN_AI_CONVERSATION_ID) == run_id


async def test_without_a_tracer_provider_nothing_is_journaled_for_traces() -> None:
    store = MemoryStore()
    async with Supervisor(scope_shift_model(), store) as sup:
        handle = await sup.submit(spec(chain(3, milestone_at=[1]), gate_timeout_s=None))
        await until(
            lambda: [g for g in sup.gates.pending() if g.gate_id in handle.state.gates]
        )
        (gate,) = sup.gates.pending()
        await sup.gates.resolve(gate.gate_id, GateResolution(decision="approve"))
        with anyio.fail_after(5):
            await handle.result()
        events = await store.read(handle.run_id)
    assert not any(isinstance(e, TraceSuspended) for e in events)
    assert handle.state.suspended_trace is None


async def test_a_run_left_waiting_only_for_an_untimed_approval_suspends_its_trace(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    side_effect = [
        TaskDraft(key="send", description="email the report", requires_approval=True)
    ]
    store = MemoryStore()
    async with Supervisor(scripted(), store, tracer_provider=provider) as sup:
        handle = await sup.submit(spec(side_effect))

        await until(lambda: handle.state.suspended_trace is not None)
        # The run suspends its trace only once the gate's worker has taken the
        # request: the gate's span is there, inside the run's.
        while_waiting = Tree(exporter.get_finished_spans())
        root = while_waiting.one(n.SPAN_RUN)
        assert attr(root, n.RUN_OUTCOME) == "suspended"
        gate = while_waiting.one(n.SPAN_GATE)
        assert while_waiting.parent(gate) is root
        assert attr(gate, n.GATE_OUTCOME) == "suspended"
        times = [root.start_time, gate.start_time, gate.end_time, root.end_time]
        assert None not in times
        assert times == sorted(times)  # type: ignore[type-var]
        (pending,) = sup.gates.pending()
        await sup.gates.resolve(pending.gate_id, GateResolution(decision="approve"))
        with anyio.fail_after(5):
            result = await handle.result()
    assert result.status.value == "completed"
    tree = Tree(exporter.get_finished_spans())
    first, second = sorted(tree.named(n.SPAN_RUN), key=lambda s: s.start_time or 0)
    assert second.links[0].context.span_id == first.context.span_id  # type: ignore[union-attr]
    (task,) = [
        s
        for s in tree.named("invoke_agent executor")
        if attr(s, n.PURPOSE) == "execute"
    ]
    assert tree.parent(task) is second
    assert attr(second, n.RUN_OUTCOME) == "completed"


async def test_a_run_resumed_by_a_new_supervisor_traces_on_in_a_linked_trace(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async def finish(task: Task, ctx: TaskContext) -> TaskOutcome:
        return TaskOutcome(success=True, summary=f"{task.key} done")

    store = MemoryStore()
    with anyio.fail_after(5):
        run_id = await stopped_mid_task(provider, store)
        (old_root,) = Tree(exporter.get_finished_spans()).named(n.SPAN_RUN)
        async with Supervisor(
            scope_shift_model(),
            store,
            task_runner=finish,
            tracer_provider=provider,
            resume=True,
        ) as sup:
            result = await sup.get(run_id).result()
    assert result.status is RunStatus.COMPLETED
    roots = Tree(exporter.get_finished_spans()).named(n.SPAN_RUN)
    old_id = old_root.context.span_id  # type: ignore[union-attr]
    (new_root,) = [s for s in roots if s.context.span_id != old_id]  # type: ignore[union-attr]
    assert new_root.context.trace_id != old_root.context.trace_id  # type: ignore[union-attr]
    assert [link.context.span_id for link in new_root.links] == [
        old_root.context.span_id  # type: ignore[union-attr]
    ]
    assert attr(new_root, n.GEN_AI_CONVERSATION_ID) == run_id
    assert attr(new_root, n.RUN_OUTCOME) == "completed"
    # The resumed trace carries the rest of the run: the remaining tasks.
    tree = Tree(exporter.get_finished_spans())
    resumed_tasks = [
        s
        for s in tree.named("invoke_agent executor")
        if s.context.trace_id == new_root.context.trace_id  # type: ignore[union-attr]
    ]
    assert resumed_tasks


async def test_a_run_resumed_after_a_crash_links_to_the_trace_the_crash_cut_off(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # A crash journals no suspension: what the journal holds of the cut-off
    # trace is the context its start was journaled with (TraceStarted), so
    # the resumed run's root links to it and takes the next segment.
    from replan.messages import TraceStarted

    async def stuck_at_t2(task: Task, ctx: TaskContext) -> TaskOutcome:
        if task.id != "t1":
            await anyio.sleep_forever()
        return TaskOutcome(success=True, summary=f"{task.id} done")

    async def runs(task: Task, ctx: TaskContext) -> TaskOutcome:
        return TaskOutcome(success=True, summary=f"{task.id} done")

    crashed = MemoryStore()
    async with Supervisor(
        scripted(), crashed, tracer_provider=provider, task_runner=stuck_at_t2
    ) as sup:
        handle = await sup.submit(spec(chain(3)))
        await until(lambda: "t1" in handle.state.completion_order)
        # The journal as a crash would leave it: no suspension in it.
        image = MemoryStore()
        summary = await crashed.get_run(handle.run_id)
        assert summary is not None
        await image.append(handle.run_id, await crashed.read(handle.run_id), summary)
    first_root = Tree(exporter.get_finished_spans()).one(n.SPAN_RUN)
    exporter.clear()

    async with Supervisor(
        scripted(), image, tracer_provider=provider, task_runner=runs, resume=True
    ) as sup:
        with anyio.fail_after(5):
            result = await sup.get(handle.run_id).result()
        events = await image.read(handle.run_id)
    assert result.status is RunStatus.COMPLETED
    started = [e for e in events if isinstance(e, TraceStarted)]
    assert [e.segment for e in started] == [1, 2]
    assert points_at(started[0].carrier, first_root)
    root = Tree(exporter.get_finished_spans()).one(n.SPAN_RUN)
    assert attr(root, n.RUN_SEGMENT) == 2
    assert first_root.context is not None
    [link] = root.links
    assert (link.context.trace_id, link.context.span_id) == (
        first_root.context.trace_id,
        first_root.context.span_id,
    )
    assert link.attributes is not None
    assert link.attributes[n.LINK_KIND] == "resumes"


async def test_an_untraced_run_journals_no_trace_start() -> None:
    from replan.messages import TraceStarted

    store = MemoryStore()
    async with Supervisor(scripted(), store) as sup:
        handle = await sup.submit(spec(chain(2)))
        await handle.result()
        events = await store.read(handle.run_id)
    assert not [e for e in events if isinstance(e, TraceStarted)]
