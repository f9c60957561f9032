"""A replan decision cut short: suspended with the trace, or concluded by the
run's end, and what it cost, across a stop and a restart."""

from __future__ import annotations

from typing import Any

import anyio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
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
    GateResolution,
    MemoryStore,
    ModelAuthenticationError,
    ModelRequest,
    RunResult,
    RunStatus,
    ScriptedModel,
    Supervisor,
    TokenUsage,
    Trigger,
)
from replan.supervisor import RunState
from replan.telemetry import _names as n

COST = TokenUsage(input_tokens=10, output_tokens=4, calls=1)


def by_start(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return sorted(spans, key=lambda s: s.start_time or 0)


def links_to(span: ReadableSpan, old: ReadableSpan) -> bool:
    assert old.context is not None
    return [link.context.span_id for link in span.links] == [old.context.span_id]


def model(trigger: Trigger = Trigger.CONTRADICTION, **answers: Any) -> ScriptedModel:
    """Every call costs COST; the first review asks for a replan."""
    return scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict(trigger)),
        usage=COST,
        **answers,
    )


class Hanging:
    """A model call that never answers (until cancelled)."""

    def __init__(self) -> None:
        self.asked = anyio.Event()

    async def __call__(self, request: ModelRequest) -> Any:
        self.asked.set()
        await anyio.sleep_forever()


async def stopped_then_resumed(
    hanging: str, provider: TracerProvider
) -> tuple[RunState, RunResult]:
    """Stop a supervisor while the first replan's ``hanging`` call (a
    scripted answer's name) waits; another resumes the run to its end. The
    run's state as the stop left it, and the result."""
    store = MemoryStore()
    hang = Hanging()
    with anyio.fail_after(10):
        async with Supervisor(
            model(**{hanging: hang}), store, tracer_provider=provider
        ) as first:
            handle = await first.submit(spec(chain(3, milestone_at=[1])))
            await hang.asked.wait()
        async with Supervisor(model(), store, tracer_provider=provider) as second:
            result = await (await second.resume(handle.run_id)).result()
    return handle.state, result


async def test_a_decision_cut_by_a_stop_goes_on_in_a_linked_span_after_it(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    _, result = await stopped_then_resumed("replan", provider)
    assert result.status is RunStatus.COMPLETED
    tree = Tree(exporter.get_finished_spans())
    stopped, resumed = by_start(tree.named(n.SPAN_REPLAN))
    assert attr(stopped, n.REPLAN_OUTCOME) == "suspended"
    assert "supervisor stopped" in attr(stopped, n.SUSPEND_REASON)
    assert attr(resumed, n.REPLAN_OUTCOME) == "applied"
    assert links_to(resumed, stopped)
    roots = by_start(tree.named(n.SPAN_RUN))
    assert [attr(r, n.RUN_SEGMENT) for r in roots] == [1, 2]
    assert tree.parent(resumed) is roots[1]


async def test_a_decision_resumed_after_a_restart_counts_what_it_cost_before(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # The proposal and the drift check (two calls) are made before the
    # scope-shift gate; the supervisor stops there and another one resumes.
    store = MemoryStore()
    with anyio.fail_after(10):
        async with Supervisor(
            model(Trigger.SCOPE_SHIFT), store, tracer_provider=provider
        ) as first:
            handle = await first.submit(spec(chain(3, milestone_at=[1])))
            await until(lambda: handle.state.suspended_trace is not None)
        async with Supervisor(
            model(Trigger.SCOPE_SHIFT), store, tracer_provider=provider
        ) as second:
            resumed = await second.resume(handle.run_id)
            (gate,) = second.gates.pending()
            await second.gates.resolve(gate.gate_id, GateResolution(decision="approve"))
            result = await resumed.result()
    assert result.status is RunStatus.COMPLETED
    tree = Tree(exporter.get_finished_spans())
    # Suspended at the gate in each process, then applied: one chain of links.
    first_wait, second_wait, applied = by_start(tree.named(n.SPAN_REPLAN))
    assert attr(first_wait, n.REPLAN_OUTCOME) == "suspended"
    assert attr(second_wait, n.REPLAN_OUTCOME) == "suspended"
    assert attr(applied, n.REPLAN_OUTCOME) == "applied"
    assert links_to(second_wait, first_wait)
    assert links_to(applied, second_wait)
    assert attr(applied, n.REPLAN_USAGE_INPUT_TOKENS) == 2 * COST.input_tokens
    assert attr(applied, n.REPLAN_USAGE_OUTPUT_TOKENS) == 2 * COST.output_tokens
    # Each trace a segment of its own, counted across the two processes.
    roots = by_start(tree.named(n.SPAN_RUN))
    assert [attr(r, n.RUN_SEGMENT) for r in roots] == [1, 2, 3]


async def test_a_run_cancelled_at_an_untimed_gate_concludes_its_decision(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with anyio.fail_after(10):
        async with Supervisor(
            model(Trigger.SCOPE_SHIFT), MemoryStore(), tracer_provider=provider
        ) as sup:
            handle = await sup.submit(spec(chain(3, milestone_at=[1])))
            await until(lambda: handle.state.suspended_trace is not None)
            await handle.cancel()
            result = await handle.result()
    assert result.status is RunStatus.CANCELLED
    tree = Tree(exporter.get_finished_spans())
    at_gate, concluded = by_start(tree.named(n.SPAN_REPLAN))
    assert attr(at_gate, n.REPLAN_OUTCOME) == "suspended"
    assert attr(concluded, n.REPLAN_OUTCOME) == "interrupted"
    assert attr(concluded, n.REPLAN_REASON) == "the run ended cancelled"
    assert links_to(concluded, at_gate)
    assert attr(concluded, n.REPLAN_USAGE_INPUT_TOKENS) == 2 * COST.input_tokens


async def test_a_cancel_during_a_decision_gives_a_plain_reason(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    hang = Hanging()
    with anyio.fail_after(10):
        async with Supervisor(
            model(replan=hang), MemoryStore(), tracer_provider=provider
        ) as sup:
            handle = await sup.submit(spec(chain(3, milestone_at=[1])))
            await hang.asked.wait()
            await handle.cancel()
    span = Tree(exporter.get_finished_spans()).one(n.SPAN_REPLAN)
    assert attr(span, n.REPLAN_OUTCOME) == "interrupted"
    assert attr(span, n.REPLAN_REASON) == "the run ended cancelled"


async def test_a_decision_cut_by_a_model_error_says_what_it_cost(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # Fatal: the run ends (a failure that is not is a refusal, see
    # test_replan_spans).
    def broken(request: ModelRequest) -> Any:
        raise ModelAuthenticationError("planner broke", usage=COST)

    with anyio.fail_after(10):
        async with Supervisor(
            model(replan=broken), MemoryStore(), tracer_provider=provider
        ) as sup:
            result = await (await sup.submit(spec(chain(3, milestone_at=[1])))).result()
    assert result.status is RunStatus.FAILED
    span = Tree(exporter.get_finished_spans()).one(n.SPAN_REPLAN)
    assert attr(span, n.REPLAN_OUTCOME) == "interrupted"
    assert "planner broke" in attr(span, n.REPLAN_REASON)
    assert attr(span, n.REPLAN_VERSION) == 1
    assert attr(span, n.REPLAN_REPLANS_REMAINING) == 3
    assert attr(span, n.REPLAN_USAGE_INPUT_TOKENS) == COST.input_tokens
    assert attr(span, n.REPLAN_USAGE_OUTPUT_TOKENS) == COST.output_tokens


async def test_a_decision_stopped_after_an_answer_counts_that_answer_after_it(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # The planner has answered (its tokens only staged), the drift check
    # hangs; the stop journals the planner's tokens before the decision's
    # cost, so the resumed decision counts all three answered calls.
    stopped, result = await stopped_then_resumed("alignment", provider)
    spent = stopped.suspended_replan_usage
    assert result.status is RunStatus.COMPLETED
    assert spent is not None
    assert spent.input_tokens == COST.input_tokens
    _, applied = by_start(Tree(exporter.get_finished_spans()).named(n.SPAN_REPLAN))
    assert attr(applied, n.REPLAN_USAGE_INPUT_TOKENS) == 3 * COST.input_tokens
