"""Each tool call the executor makes is an ``execute_tool`` span."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode
from scripts import (
    chain,
    first_then_continue,
    independent,
    replan_verdict,
    scripted,
    spec,
)
from spans import Tree, attr, until

from replan import (
    GateResolution,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    RunStatus,
    Supervisor,
    Task,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    Trigger,
    tool,
)
from replan.messages import GateOpened, ToolCall, TraceSuspended
from replan.telemetry import _names as n

APPROVAL_DELAY_S = 0.3


@tool
def search(query: str) -> str:
    """Search the trade press."""
    return f"two makers ship ({query})"


@tool(side_effect=True)
def send_email(to: str, idempotency_key: str) -> str:
    """Email someone."""
    if to == "nobody":
        raise ConnectionError("no such mailbox")
    return f"sent to {to}"


def calls(*names_and_args: tuple[str, str]) -> ModelResponse:
    return ModelResponse(
        tool_calls=[
            ToolCall(id=f"c{i}", name=name, arguments=args)
            for i, (name, args) in enumerate(names_and_args)
        ]
    )


def execute(request: ModelRequest) -> Any:
    """Attempt 1: search, email ana and nobody, then a transient failure;
    attempt 2: email ana again (its recorded result), then success."""
    attempt, step = request.context["attempt"], len(request.transcript) + 1
    match attempt, step:
        case 1, 1:
            return calls(
                ("search", '{"query": "solid-state"}'),
                ("send_email", '{"to": "ana"}'),
                ("send_email", '{"to": "nobody"}'),
            )
        case 1, _:
            return TaskOutcome(success=False, transient=True, reason="flaky")
        case 2, 1:
            return calls(("send_email", '{"to": "ana"}'))
    return TaskOutcome(success=True, summary="emailed")


async def traced_run(provider: TracerProvider) -> RunStatus:
    """Run the script, approving each gate after a pause."""
    with anyio.fail_after(10):
        async with Supervisor(
            scripted(execute=execute),
            MemoryStore(),
            tools=[search, send_email],
            tracer_provider=provider,
        ) as sup:
            handle = await sup.submit(spec(chain(1), max_task_attempts=2))
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    await anyio.sleep(APPROVAL_DELAY_S)
                    await sup.gates.resolve(
                        event.request.gate_id, GateResolution(decision="approve")
                    )
            result = await handle.result()
    return result.status


def tool_spans(exporter: InMemorySpanExporter) -> tuple[Tree, list[Any]]:
    tree = Tree(exporter.get_finished_spans())
    spans = [s for s in tree.spans if s.name.startswith(n.SPAN_TOOL_PREFIX)]
    return tree, sorted(spans, key=lambda s: s.start_time or 0)


async def test_every_tool_call_is_a_span_under_its_executor_span(
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert await traced_run(provider) is RunStatus.COMPLETED
    # The approvals (no timeout) suspended the run's trace from an executor
    # worker's task: no context is left attached to the wrong task.
    assert not [r for r in caplog.records if r.name == "opentelemetry.context"]
    tree, spans = tool_spans(exporter)
    gates = tree.named(n.SPAN_GATE)
    assert len(gates) == 2  # one per gate: ana's and nobody's emails
    for gate in gates:
        parent = tree.parent(gate)
        assert parent is not None
        assert parent.name == "invoke_agent executor"
    for chat in tree.named("chat scripted"):
        parent = tree.parent(chat)
        assert parent is not None
        assert parent.name.startswith("invoke_agent ")
    assert [(s.name, attr(s, n.TOOL_OUTCOME)) for s in spans] == [
        ("execute_tool search", "ran"),
        ("execute_tool send_email", "ran"),
        ("execute_tool send_email", "failed"),
        ("execute_tool send_email", "reused"),
    ]
    searched, sent, failed, reused = spans
    for span in spans:
        assert span.kind is SpanKind.INTERNAL
        assert attr(span, n.GEN_AI_OPERATION_NAME) == "execute_tool"
        assert attr(span, n.GEN_AI_TOOL_TYPE) == "function"
        executor = tree.parent(span)
        assert executor is not None
        assert executor.name == "invoke_agent executor"
        # Found by the run's id, as every span of the run is.
        run_id = attr(executor, n.GEN_AI_CONVERSATION_ID)
        assert attr(span, n.GEN_AI_CONVERSATION_ID) == run_id
        # Arguments and results are content: not recorded unless asked for.
        assert n.GEN_AI_TOOL_CALL_ARGUMENTS not in (span.attributes or {})
        assert n.GEN_AI_TOOL_CALL_RESULT not in (span.attributes or {})
    assert attr(searched, n.GEN_AI_TOOL_NAME) == "search"
    assert attr(searched, n.GEN_AI_TOOL_CALL_ID) == "c0"
    assert attr(searched, n.GEN_AI_TOOL_DESCRIPTION) == "Search the trade press."
    assert attr(searched, n.TOOL_SIDE_EFFECT) is False
    assert attr(sent, n.TOOL_SIDE_EFFECT) is True
    assert attr(sent, n.TOOL_IDEMPOTENCY_KEY).endswith(":t1:s1c1")
    assert attr(reused, n.TOOL_IDEMPOTENCY_KEY) == attr(sent, n.TOOL_IDEMPOTENCY_KEY)
    assert failed.status.status_code is StatusCode.ERROR
    assert attr(failed, n.ERROR_TYPE) == "ConnectionError"
    assert sent.status.status_code is StatusCode.UNSET
    # A span covers the tool's run, never the wait for a person's approval.
    assert sent.end_time is not None
    assert sent.start_time is not None
    assert (sent.end_time - sent.start_time) / 1e9 < APPROVAL_DELAY_S


async def test_a_tool_call_cut_short_by_a_cancel_ends_cancelled(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    started = anyio.Event()

    @tool
    async def wait_forever(query: str) -> str:
        """Wait for an answer that never comes."""
        started.set()
        await anyio.sleep_forever()
        return query

    def ask(request: ModelRequest) -> Any:
        return calls(("wait_forever", '{"query": "q"}'))

    with anyio.fail_after(10):
        async with Supervisor(
            scripted(execute=ask),
            MemoryStore(),
            tools=[wait_forever],
            tracer_provider=provider,
        ) as sup:
            handle = await sup.submit(spec(chain(1)))
            await started.wait()
            await handle.cancel()
            assert (await handle.result()).status is RunStatus.CANCELLED
    _, [span] = tool_spans(exporter)
    assert span.name == "execute_tool wait_forever"
    assert attr(span, n.TOOL_OUTCOME) == "cancelled"
    assert span.end_time is not None


async def test_with_content_capture_a_tool_span_holds_its_arguments_and_result(
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    started = time.monotonic()
    assert await traced_run(provider) is RunStatus.COMPLETED
    assert time.monotonic() - started >= 2 * APPROVAL_DELAY_S
    _, [searched, sent, failed, reused] = tool_spans(exporter)
    assert attr(searched, n.GEN_AI_TOOL_CALL_ARGUMENTS) == '{"query": "solid-state"}'
    assert attr(searched, n.GEN_AI_TOOL_CALL_RESULT) == "two makers ship (solid-state)"
    assert attr(sent, n.GEN_AI_TOOL_CALL_RESULT) == "sent to ana"
    assert attr(failed, n.GEN_AI_TOOL_CALL_RESULT) == (
        "ConnectionError: no such mailbox"
    )
    assert attr(reused, n.GEN_AI_TOOL_CALL_RESULT) == "sent to ana"


async def test_a_tool_calls_gate_suspends_the_trace_only_once_nothing_else_runs(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # t1 waits at its email's gate (no timeout) while t2 runs: t2's spans are
    # in the run's trace, which is suspended only once t2 is done and only
    # a person can move the run on.
    store = MemoryStore()
    gate_open = anyio.Event()

    async def two_tasks(request: ModelRequest) -> Any:
        task = request.context["task"]
        if task.id == "t1" and not request.transcript:
            return calls(("send_email", '{"to": "ana"}'))
        if task.id == "t2":
            await gate_open.wait()
        return TaskOutcome(success=True, summary="done")

    with anyio.fail_after(10):
        async with Supervisor(
            scripted(execute=two_tasks),
            store,
            tools=[send_email],
            tracer_provider=provider,
        ) as sup:
            handle = await sup.submit(spec(independent(2), max_concurrency=2))
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    gate_id = event.request.gate_id
                    break
            gate_open.set()
            await until(lambda: handle.state.suspended_trace is not None)
            assert handle.state.tasks["t2"].status is TaskStatus.COMPLETED
            while_waiting = Tree(exporter.get_finished_spans())
            await sup.gates.resolve(gate_id, GateResolution(decision="approve"))
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED
    root = while_waiting.one(n.SPAN_RUN)
    assert attr(root, n.RUN_OUTCOME) == "suspended"
    t2 = [
        s
        for s in while_waiting.named("invoke_agent executor")
        if attr(s, n.TASK_ID) == "t2"
    ]
    assert len(t2) == 1
    assert while_waiting.parent(t2[0]) is root
    tree = Tree(exporter.get_finished_spans())
    first, second = sorted(tree.named(n.SPAN_RUN), key=lambda s: s.start_time or 0)
    assert second.links[0].context.span_id == first.context.span_id  # type: ignore[union-attr]
    assert attr(second, n.RUN_OUTCOME) == "completed"


async def test_the_run_resumes_tracing_as_soon_as_a_tool_calls_gate_is_answered(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async def slow_after_the_email(request: ModelRequest) -> Any:
        if not request.transcript:
            return calls(("send_email", '{"to": "ana"}'))
        await anyio.sleep(0.3)  # the attempt works on after the answer
        return TaskOutcome(success=True, summary="emailed")

    with anyio.fail_after(10):
        async with Supervisor(
            scripted(execute=slow_after_the_email),
            MemoryStore(),
            tools=[send_email],
            tracer_provider=provider,
        ) as sup:
            handle = await sup.submit(spec(chain(1)))
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    await until(lambda: handle.state.suspended_trace is not None)
                    await sup.gates.resolve(
                        event.request.gate_id, GateResolution(decision="approve")
                    )
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED
    tree = Tree(exporter.get_finished_spans())
    first, second = sorted(tree.named(n.SPAN_RUN), key=lambda s: s.start_time or 0)
    assert attr(first, n.RUN_OUTCOME) == "suspended"
    assert attr(second, n.RUN_OUTCOME) == "completed"
    # The run's trace went on while the attempt worked, not only after it.
    assert second.start_time is not None
    assert second.end_time is not None
    assert (second.end_time - second.start_time) / 1e9 >= 0.25
    # The answer, journaled while the trace was suspended, is on the new root.
    assert [e.name for e in second.events if e.name == n.EVENT_GATE_RESOLVED] == [
        n.EVENT_GATE_RESOLVED
    ]


async def test_an_attempt_timed_out_at_its_tool_gate_is_no_longer_counted_as_waiting(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # t1 waits at its gate and passes task_timeout_s; t3 waits at another
    # gate: once t1 is out, only a person can move the run on again, and the
    # run's trace is suspended again (it resumed when t1's report came).
    async def three_tasks(request: ModelRequest) -> Any:
        task = request.context["task"]
        if request.transcript:
            return TaskOutcome(success=True, summary="emailed")
        if task.id == "t2":
            await anyio.sleep(0.5)
            return TaskOutcome(success=True, summary="done")
        return calls(("send_email", f'{{"to": "{task.id}"}}'))

    def t1_failed(tasks: Mapping[str, Task]) -> bool:
        return "t1" in tasks and tasks["t1"].status is TaskStatus.FAILED

    def suspended_roots() -> int:
        return sum(
            attr(s, n.RUN_OUTCOME) == "suspended"
            for s in exporter.get_finished_spans()
            if s.name == n.SPAN_RUN
        )

    drafts = [
        TaskDraft(key="s1", description="one"),
        TaskDraft(key="s2", description="two"),
        TaskDraft(key="s3", description="three", depends_on=["s2"]),
    ]
    limits = {"max_concurrency": 3, "task_timeout_s": 0.8, "max_task_attempts": 1}
    with anyio.fail_after(10):
        async with Supervisor(
            scripted(execute=three_tasks),
            MemoryStore(),
            tools=[send_email],
            tracer_provider=provider,
        ) as sup:
            handle = await sup.submit(spec(drafts, **limits))
            await until(lambda: t1_failed(handle.state.tasks))
            # Suspended once t1 and t3 both waited at their gates, then again
            # once t1's timeout had resumed the trace (t3's gate, opened at
            # ~0.5 s, passes its own timeout only at ~1.3 s).
            await until(lambda: suspended_roots() >= 2)
            approve = GateResolution(decision="approve")
            for gate in sup.gates.pending():
                await sup.gates.resolve(gate.gate_id, approve)
            await handle.result()
            events = await sup.store.read(handle.run_id)
    reasons = {e.reason for e in events if isinstance(e, TraceSuspended)}
    assert reasons == {"waiting for people, no timeout"}


def email_then_done(request: ModelRequest) -> Any:
    if not request.transcript:
        return calls(("send_email", '{"to": "ana"}'))
    return TaskOutcome(success=True, summary="emailed")


def emailing(execute: Any, provider: TracerProvider) -> Supervisor:
    """A supervisor whose executor has ``send_email`` and answers ``execute``."""
    return Supervisor(
        scripted(execute=execute),
        MemoryStore(),
        tools=[send_email],
        tracer_provider=provider,
    )


def executor_spans(tree: Tree, task_id: str) -> list[Any]:
    spans = [
        s
        for s in tree.named("invoke_agent executor")
        if (s.attributes or {}).get(n.TASK_ID) == task_id
    ]
    return sorted(spans, key=lambda s: s.start_time or 0)


async def test_an_attempt_at_an_untimed_tool_gate_holds_no_span_open(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # The attempt's executor span ends `suspended` as its gate opens; once a
    # person answers, the attempt goes on in a new executor span in the run's
    # resumed trace, linked to the one that waited.
    with anyio.fail_after(10):
        async with emailing(email_then_done, provider) as sup:
            handle = await sup.submit(spec(chain(1)))
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    gate_id = event.request.gate_id
                    break
            await until(lambda: handle.state.suspended_trace is not None)
            # The gate's span, once a gate worker has taken the request.
            await until(lambda: Tree(exporter.get_finished_spans()).named(n.SPAN_GATE))
            while_waiting = Tree(exporter.get_finished_spans())
            await sup.gates.resolve(gate_id, GateResolution(decision="approve"))
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED
    # While the person had not answered, every span of the attempt had ended.
    [waited] = executor_spans(while_waiting, "t1")
    assert attr(waited, n.ACTOR_OUTCOME) == "suspended"
    assert gate_id in attr(waited, n.SUSPEND_REASON)
    assert n.TASK_OUTCOME not in (waited.attributes or {})
    [gate] = while_waiting.named(n.SPAN_GATE)
    assert while_waiting.parent(gate) is waited
    tree = Tree(exporter.get_finished_spans())
    first_root, second_root = sorted(
        tree.named(n.SPAN_RUN), key=lambda s: s.start_time or 0
    )
    assert tree.parent(waited) is first_root
    _, went_on = executor_spans(tree, "t1")
    assert tree.parent(went_on) is second_root
    assert went_on.context is not None
    assert waited.context is not None
    assert went_on.context.trace_id != waited.context.trace_id
    [link] = went_on.links
    assert link.context.span_id == waited.context.span_id
    assert attr(went_on, n.TASK_ATTEMPT) == 1
    assert attr(went_on, n.TASK_OUTCOME) == "completed"
    assert n.ACTOR_OUTCOME not in (went_on.attributes or {})
    # The tool's run and the model's next answer are spans of the new one.
    [sent] = tree.named("execute_tool send_email")
    assert tree.parent(sent) is went_on
    chats = [tree.parent(s) for s in tree.named("chat scripted")]
    assert waited in chats
    assert went_on in chats


async def test_an_attempt_answered_while_the_run_moves_goes_on_in_the_same_trace(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # t2 still runs when t1's gate is answered: the run's trace was never
    # suspended, and t1 goes on in a new executor span under the same root.
    answered = anyio.Event()

    async def two_tasks(request: ModelRequest) -> Any:
        task = request.context["task"]
        if task.id == "t1" and not request.transcript:
            return calls(("send_email", '{"to": "ana"}'))
        if task.id == "t2":
            await answered.wait()
        return TaskOutcome(success=True, summary="done")

    with anyio.fail_after(10):
        async with emailing(two_tasks, provider) as sup:
            handle = await sup.submit(spec(independent(2), max_concurrency=2))
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    await sup.gates.resolve(
                        event.request.gate_id, GateResolution(decision="reject")
                    )
                    break
            await until(
                lambda: (
                    len(executor_spans(Tree(exporter.get_finished_spans()), "t1")) == 2
                )
            )
            answered.set()
            result = await handle.result()
            events = await sup.store.read(handle.run_id)
    assert result.status is RunStatus.COMPLETED
    assert not [e for e in events if isinstance(e, TraceSuspended)]
    tree = Tree(exporter.get_finished_spans())
    root = tree.one(n.SPAN_RUN)
    waited, went_on = executor_spans(tree, "t1")
    assert attr(waited, n.ACTOR_OUTCOME) == "suspended"
    assert tree.parent(waited) is root
    assert tree.parent(went_on) is root
    assert attr(went_on, n.TASK_OUTCOME) == "completed"
    [t2] = executor_spans(tree, "t2")
    assert tree.parent(t2) is root


async def test_an_attempt_answered_while_the_run_waits_at_a_gate_stays_in_its_trace(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # The run's trace is suspended at a scope-shift gate (no timeout) when
    # t1's tool call is answered: the answer does not resume the run's
    # trace (the run still waits for a person), and t1 goes on under the
    # suspended root, as attempts in flight there do.
    async def execute(request: ModelRequest) -> Any:
        task = request.context["task"]
        if task.id == "t1" and not request.transcript:
            return calls(("send_email", '{"to": "ana"}'))
        summary = "the market moved" if task.id == "t2" else "done"
        return TaskOutcome(success=True, summary=summary, findings=[summary])

    drafts = [
        TaskDraft(key="s1", description="email"),
        TaskDraft(key="s2", description="survey", milestone=True),
        TaskDraft(key="s3", description="report", depends_on=["s2"]),
    ]
    shift = first_then_continue(replan_verdict(Trigger.SCOPE_SHIFT))
    with anyio.fail_after(10):
        async with Supervisor(
            scripted(execute=execute, milestone=shift),
            MemoryStore(),
            tools=[send_email],
            tracer_provider=provider,
        ) as sup:
            handle = await sup.submit(spec(drafts, max_concurrency=2))
            await until(lambda: len(sup.gates.pending()) == 2)
            await until(lambda: handle.state.suspended_trace is not None)
            [tool_gate] = [g for g in sup.gates.pending() if g.tool_call is not None]
            [replan_gate] = [g for g in sup.gates.pending() if g.tool_call is None]
            await sup.gates.resolve(
                tool_gate.gate_id, GateResolution(decision="approve")
            )

            def t1_done() -> bool:
                return (
                    len(executor_spans(Tree(exporter.get_finished_spans()), "t1")) == 2
                )

            await until(t1_done)
            # Its report waits for the driver, which waits for the person.
            during = Tree(exporter.get_finished_spans())
            await sup.gates.resolve(
                replan_gate.gate_id, GateResolution(decision="approve")
            )
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED
    [suspended_root] = during.named(n.SPAN_RUN)
    assert attr(suspended_root, n.RUN_OUTCOME) == "suspended"
    waited, went_on = executor_spans(during, "t1")
    assert during.parent(waited) is suspended_root
    assert during.parent(went_on) is suspended_root
    assert attr(went_on, n.TASK_OUTCOME) == "completed"
    tree = Tree(exporter.get_finished_spans())
    assert len(tree.named(n.SPAN_RUN)) == 2


async def test_a_tool_gate_with_a_timeout_keeps_the_attempt_in_one_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # A bounded wait: the executor span covers it, with the gate's span.
    with anyio.fail_after(10):
        async with emailing(email_then_done, provider) as sup:
            handle = await sup.submit(spec(chain(1), gate_timeout_s=30))
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    await anyio.sleep(0.1)
                    await sup.gates.resolve(
                        event.request.gate_id, GateResolution(decision="approve")
                    )
                    break
            result = await handle.result()
    assert result.status is RunStatus.COMPLETED
    tree = Tree(exporter.get_finished_spans())
    [executor] = executor_spans(tree, "t1")
    assert n.ACTOR_OUTCOME not in (executor.attributes or {})
    assert attr(executor, n.TASK_OUTCOME) == "completed"
    [gate] = tree.named(n.SPAN_GATE)
    assert tree.parent(gate) is executor
    assert attr(gate, n.GATE_DECISION) == "approve"
    assert tree.parent(tree.one("execute_tool send_email")) is executor


async def test_an_attempt_cut_short_at_its_tool_gate_ends_with_its_suspended_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async def email(request: ModelRequest) -> Any:
        return calls(("send_email", '{"to": "ana"}'))

    limits = {"task_timeout_s": 0.3, "max_task_attempts": 1}
    with anyio.fail_after(10):
        async with emailing(email, provider) as sup:
            handle = await sup.submit(spec(chain(1), **limits))
            result = await handle.result()
    [task] = result.tasks
    assert task.status is TaskStatus.FAILED
    assert "task_timeout_s" in (task.result.reason if task.result else "")
    tree = Tree(exporter.get_finished_spans())
    [waited] = executor_spans(tree, "t1")
    assert attr(waited, n.ACTOR_OUTCOME) == "suspended"
    assert not tree.named("execute_tool send_email")
