"""The span tree of a run, asserted on spans from an injected SDK provider."""

from __future__ import annotations

from opentelemetry import baggage, context
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode
from scripts import (
    chain,
    first_then_continue,
    replan_verdict,
    scripted,
    spec,
    with_finding,
)
from spans import Tree, attr, run_traced

from replan import (
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    TokenUsage,
)
from replan._errors import ModelOutputError
from replan.telemetry import _names as n

USAGE = TokenUsage(input_tokens=10, output_tokens=4, calls=1)


def replanning_model() -> ScriptedModel:
    """t1 finds something, the first review asks for a contradiction replan."""
    return scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        usage=USAGE,
    )


async def test_a_run_is_one_trace_under_an_invoke_workflow_root(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    result = await run_traced(
        replanning_model(), spec(chain(3, milestone_at=[1])), provider
    )
    tree = Tree(exporter.get_finished_spans())
    assert len(tree.traces()) == 1
    root = tree.one(n.SPAN_RUN)
    assert root.parent is None
    assert root.kind is SpanKind.INTERNAL
    assert attr(root, n.GEN_AI_OPERATION_NAME) == "invoke_workflow"
    assert attr(root, n.RUN_KIND) == "plan"
    assert attr(root, n.RUN_PATTERN) == "discovery"
    assert attr(root, n.RUN_OUTCOME) == "completed"
    assert attr(root, n.RUN_REPLANS_APPLIED) == 1
    assert attr(root, n.LIMIT_PREFIX + "max_replans") == 3
    total = result.usage.total
    assert attr(root, n.RUN_USAGE_INPUT_TOKENS) == total.input_tokens
    assert attr(root, n.RUN_USAGE_OUTPUT_TOKENS) == total.output_tokens
    for span in tree.spans:
        assert attr(span, n.GEN_AI_CONVERSATION_ID) == result.run_id, span.name


class BaggageOnSpans(SpanProcessor):
    """Copies the baggage of the context a span starts in onto the span, as
    an application's baggage span processor does."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        span.set_attributes(
            {k: str(v) for k, v in baggage.get_all(parent_context).items()}
        )


async def test_the_baggage_current_at_submit_is_on_every_span_of_the_run(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    provider.add_span_processor(BaggageOnSpans())
    token = context.attach(baggage.set_baggage("tenant.id", "acme"))
    try:
        await run_traced(replanning_model(), spec(chain(3, milestone_at=[1])), provider)
    finally:
        context.detach(token)
    tree = Tree(exporter.get_finished_spans())
    assert len(tree.traces()) == 1
    assert tree.one(n.SPAN_RUN).parent is None  # still a trace of its own
    assert {s.name for s in tree.spans} >= {n.SPAN_RUN, n.SPAN_REPLAN}
    assert [s.name for s in tree.spans if attr(s, "tenant.id") != "acme"] == []


async def test_a_run_submitted_under_a_span_starts_a_trace_of_its_own(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    provider.add_span_processor(BaggageOnSpans())
    token = context.attach(baggage.set_baggage("tenant.id", "acme"))
    try:
        with provider.get_tracer("app").start_as_current_span("handle request"):
            result = await run_traced(scripted(), spec(chain(2)), provider)
    finally:
        context.detach(token)
    tree = Tree(exporter.get_finished_spans())
    request = tree.one("handle request")
    run = tree.of_run(result.run_id)
    root = run.one(n.SPAN_RUN)
    assert root.parent is None
    assert root.context is not None
    assert run.traces() == {root.context.trace_id}
    assert request.context is not None
    assert request.context.trace_id not in run.traces()
    # The submitter's span is linked to, never a parent.
    [link] = root.links
    assert link.context.span_id == request.context.span_id
    assert (link.attributes or {})[n.LINK_KIND] == "submitted_by"
    assert [s.name for s in run.spans if attr(s, "tenant.id") != "acme"] == []


async def test_each_task_execution_is_an_executor_span_under_the_root(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    result = await run_traced(
        replanning_model(), spec(chain(3, milestone_at=[1])), provider
    )
    tree = Tree(exporter.get_finished_spans())
    root = tree.one(n.SPAN_RUN)
    executor = tree.named("invoke_agent executor")
    executions = [s for s in executor if attr(s, n.PURPOSE) == "execute"]
    assert len(executions) == result.task_executions == 3
    assert sorted(str(attr(s, n.TASK_ID)) for s in executions) == ["t1", "t4", "t5"]
    for span in executions:
        assert tree.parent(span) is root
        assert span.kind is SpanKind.INTERNAL
        assert attr(span, n.GEN_AI_AGENT_NAME) == "executor"
        assert attr(span, n.GEN_AI_OPERATION_NAME) == "invoke_agent"
        assert attr(span, n.TASK_ATTEMPT) == 1
        assert attr(span, n.TASK_OUTCOME) == "completed"
        assert attr(span, n.GEN_AI_PROVIDER_NAME) == "scripted"
    (synthesis,) = [s for s in executor if attr(s, n.PURPOSE) == "synthesize"]
    assert tree.parent(synthesis) is root


async def test_model_calls_are_client_spans_under_the_actor_that_made_them(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = replanning_model()
    result = await run_traced(model, spec(chain(3, milestone_at=[1])), provider)
    tree = Tree(exporter.get_finished_spans())
    chats = [s for s in tree.spans if s.name.startswith(n.SPAN_CHAT_PREFIX)]
    assert len(chats) == len(model.calls)
    for chat in chats:
        assert chat.name == "chat scripted"
        assert chat.kind is SpanKind.CLIENT
        assert attr(chat, n.GEN_AI_OPERATION_NAME) == "chat"
        assert attr(chat, n.GEN_AI_REQUEST_MODEL) == "scripted"
        assert isinstance(attr(chat, n.GEN_AI_PROVIDER_NAME), str)
        assert attr(chat, n.GEN_AI_USAGE_INPUT_TOKENS) == 10
        assert attr(chat, n.GEN_AI_USAGE_OUTPUT_TOKENS) == 4
        actor = tree.parent(chat)
        assert actor is not None
        assert attr(actor, n.GEN_AI_AGENT_NAME) == attr(chat, n.GEN_AI_AGENT_NAME)
    # Tokens are on the model-call spans only: summed once, they are the run's.
    counted = sum(
        int((s.attributes or {}).get(n.GEN_AI_USAGE_INPUT_TOKENS, 0))
        for s in tree.spans
    )
    assert counted == result.usage.total.input_tokens == 10 * len(model.calls)
    # Prompts and completions are captured only when asked for.
    assert not any(n.GEN_AI_INPUT_MESSAGES in (s.attributes or {}) for s in chats)
    assert not any(n.GEN_AI_OUTPUT_MESSAGES in (s.attributes or {}) for s in chats)


class CostlyFailure:
    """The scripted model, except that the first execution fails after
    spending tokens (an answer still invalid after its re-ask), and that it
    sets the executor's temperature itself, as OpenAIModel does."""

    provider_name = "scripted"

    def __init__(self) -> None:
        self.inner = scripted(usage=USAGE)
        self.failed = False

    def model_for(self, role: str) -> str:
        return "scripted"

    def temperature_for(self, request: ModelRequest) -> float:
        return 0.9 if request.role == "executor" else 0.0

    async def generate(self, request: ModelRequest) -> ModelResponse:
        if request.purpose == "execute" and not self.failed:
            self.failed = True
            raise ModelOutputError(
                "not a TaskOutcome, even after a re-ask",
                usage=TokenUsage(input_tokens=30, output_tokens=7, calls=2),
            )
        return await self.inner.generate(request)


async def test_a_failed_model_call_span_carries_its_tokens_and_error_type(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    result = await run_traced(
        CostlyFailure(),  # type: ignore[arg-type]
        spec(chain(2), max_task_attempts=2),
        provider,
    )
    tree = Tree(exporter.get_finished_spans())
    chats = [s for s in tree.spans if s.name.startswith(n.SPAN_CHAT_PREFIX)]
    [failed] = [s for s in chats if s.status.status_code is StatusCode.ERROR]
    assert attr(failed, n.ERROR_TYPE) == "ModelOutputError"
    assert attr(failed, n.GEN_AI_USAGE_INPUT_TOKENS) == 30
    assert attr(failed, n.GEN_AI_USAGE_OUTPUT_TOKENS) == 7
    # Summed once over the model-call spans, tokens are still the run's.
    counted = sum(int(attr(s, n.GEN_AI_USAGE_INPUT_TOKENS) or 0) for s in chats)
    assert counted == result.usage.total.input_tokens
    # The temperature reported is the one the model sends.
    for chat in chats:
        expected = 0.9 if attr(chat, n.GEN_AI_AGENT_NAME) == "executor" else 0.0
        assert attr(chat, n.GEN_AI_REQUEST_TEMPERATURE) == expected


async def test_the_reviewer_span_carries_its_evaluation_and_decision_events(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    await run_traced(replanning_model(), spec(chain(3, milestone_at=[1])), provider)
    tree = Tree(exporter.get_finished_spans())
    reviews = tree.named("invoke_agent reviewer")
    first = min(reviews, key=lambda s: s.start_time or 0)
    assert tree.parent(first) is tree.one(n.SPAN_RUN)
    events = {e.name: e for e in first.events}
    evaluation = events[n.EVENT_EVALUATION].attributes or {}
    assert evaluation[n.GEN_AI_EVALUATION_NAME] == "milestone"
    assert evaluation[n.GEN_AI_EVALUATION_SCORE_LABEL] == "replan"
    assert evaluation[n.GEN_AI_EVALUATION_SCORE_VALUE] == 1.0
    decision = events[n.EVENT_DECISION].attributes or {}
    assert decision[n.REPLAN_DECISION] == "replan"
    assert decision[n.REPLAN_TRIGGER] == "contradiction"


async def test_the_replan_span_holds_the_revised_plan_and_the_alignment_check(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    result = await run_traced(
        replanning_model(), spec(chain(3, milestone_at=[1])), provider
    )
    tree = Tree(exporter.get_finished_spans())
    replan = tree.one(n.SPAN_REPLAN)
    assert tree.parent(replan) is tree.one(n.SPAN_RUN)
    (planner,) = tree.children(replan, n.SPAN_PLAN)
    assert attr(planner, n.PURPOSE) == "replan"
    assert attr(planner, n.GEN_AI_OPERATION_NAME) == "plan"
    assert attr(planner, n.GEN_AI_PROVIDER_NAME) == "scripted"
    (ranker,) = tree.children(replan, "invoke_agent ranker")
    (alignment,) = [e for e in ranker.events if e.name == n.EVENT_EVALUATION]
    assert (alignment.attributes or {})[n.GEN_AI_EVALUATION_NAME] == "goal_alignment"
    assert (alignment.attributes or {})[n.GEN_AI_EVALUATION_SCORE_VALUE] == 1.0
    version = result.versions[-1]
    assert attr(replan, n.REPLAN_OUTCOME) == "applied"
    assert attr(replan, n.REPLAN_TRIGGER) == "contradiction"
    assert attr(replan, n.REPLAN_VERSION) == version.version == 2
    assert attr(replan, n.REPLAN_CONFIDENCE) == 1.0
    assert attr(replan, n.REPLAN_RATIONALE) == "a finding contradicts the plan"
    assert list(attr(replan, n.REPLAN_TASKS_REMOVED)) == version.removed == ["t2", "t3"]
    assert list(attr(replan, n.REPLAN_TASKS_ADDED)) == version.added == ["t4", "t5"]
    assert list(attr(replan, n.REPLAN_TASKS_PRESERVED)) == version.preserved
    assert attr(replan, n.REPLAN_REPLANS_REMAINING) == 2
    # Its cost: the planner's revision and the ranker's alignment check.
    assert attr(replan, n.REPLAN_USAGE_INPUT_TOKENS) == 2 * USAGE.input_tokens
    assert attr(replan, n.REPLAN_USAGE_OUTPUT_TOKENS) == 2 * USAGE.output_tokens


async def test_a_root_that_hit_a_limit_says_which_and_counts_refused_replans(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = scripted(execute=with_finding, milestone=lambda request: replan_verdict())
    result = await run_traced(
        model,
        spec(chain(5), milestone_every=1, max_iterations=2, max_replans=0),
        provider,
    )
    assert result.status.value == "limit_reached"
    assert result.stop_reason is not None
    refused = len(result.replans)
    assert refused >= 1
    root = Tree(exporter.get_finished_spans()).one(n.SPAN_RUN)
    assert attr(root, n.RUN_OUTCOME) == "limit_reached"
    assert attr(root, n.RUN_REPLANS_APPLIED) == 0
    assert attr(root, n.RUN_REPLANS_REFUSED) == refused
    events = {e.name: e.attributes or {} for e in root.events}
    assert events[n.EVENT_LIMIT_REACHED][n.LIMIT_NAME] == "max_iterations"
    stopped = events[n.EVENT_STOPPED]
    assert stopped[n.RUN_OUTCOME] == "limit_reached"
    assert stopped[n.RUN_STOP_REASON] == result.stop_reason
