"""One ``replan`` span per replan decision, applied or refused, saying why."""

from __future__ import annotations

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode
from scripts import (
    chain,
    clean,
    first_then_continue,
    fresh_tasks,
    replan_verdict,
    scripted,
    spec,
    with_finding,
)
from spans import Tree, attr, run_traced

from replan import (
    Alignment,
    MemoryStore,
    ModelRequest,
    ReplanOutcome,
    Supervisor,
    TaskOutcome,
    TokenUsage,
    Trigger,
    Verdict,
)
from replan.telemetry import _names as n


def in_order(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return sorted(spans, key=lambda s: s.start_time or 0)


def always_replan(request: ModelRequest) -> Verdict:
    return replan_verdict(rationale="a finding contradicts the plan", confidence=0.95)


@pytest.mark.parametrize("max_replans", [0, 2])
async def test_a_run_with_ceiling_n_has_one_replan_span_per_decision_and_n_applied(
    max_replans: int, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = scripted(execute=with_finding, milestone=always_replan)
    result = await run_traced(
        model, spec(chain(6), milestone_every=1, max_replans=max_replans), provider
    )
    tree = Tree(exporter.get_finished_spans())
    spans = in_order(tree.named(n.SPAN_REPLAN))
    assert len(result.replans) == 6
    assert len(spans) == len(result.replans)
    assert [attr(s, n.REPLAN_OUTCOME) for s in spans] == [
        r.outcome.value for r in result.replans
    ]
    applied = [s for s in spans if attr(s, n.REPLAN_OUTCOME) == "applied"]
    assert len(applied) == max_replans
    assert [attr(s, n.REPLAN_REPLANS_REMAINING) for s in applied] == list(
        range(max_replans - 1, -1, -1)
    )
    for span in spans[max_replans:]:
        assert attr(span, n.REPLAN_OUTCOME) == "refused_ceiling"
        assert str(max_replans) in str(attr(span, n.REPLAN_REASON))
        assert attr(span, n.REPLAN_REPLANS_REMAINING) == 0
        assert attr(span, n.REPLAN_VERSION) == max_replans + 1
        # Refused by the guard: no planner was asked, no tokens were spent.
        assert tree.children(span) == []
        assert attr(span, n.REPLAN_USAGE_INPUT_TOKENS) == 0


async def test_a_refused_threshold_replan_span_says_why(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    shortcut = replan_verdict(
        Trigger.NEW_CRITICAL_PATH,
        rationale="a shortcut, maybe",
        confidence=0.4,
        corroborating_sources=0,
    )
    model = scripted(execute=with_finding, milestone=first_then_continue(shortcut))
    result = await run_traced(model, spec(chain(3, milestone_at=[1])), provider)
    (span,) = Tree(exporter.get_finished_spans()).named(n.SPAN_REPLAN)
    (record,) = result.replans
    assert record.outcome is ReplanOutcome.REFUSED_THRESHOLD
    assert attr(span, n.REPLAN_OUTCOME) == "refused_threshold"
    assert attr(span, n.REPLAN_REASON) == record.reason
    assert "0.4" in record.reason
    assert attr(span, n.REPLAN_TRIGGER) == "new_critical_path"
    assert attr(span, n.REPLAN_CONFIDENCE) == 0.4
    assert attr(span, n.REPLAN_RATIONALE) == "a shortcut, maybe"
    assert attr(span, n.REPLAN_VERSION) == 1


async def test_a_drifting_replan_span_shows_the_refused_diff(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    def mostly_off_goal(request: ModelRequest) -> Alignment:
        return Alignment(aligned=[True, False, False], rationale="two are off goal")

    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        replan=lambda request: fresh_tasks(3),
        alignment=mostly_off_goal,
    )
    result = await run_traced(model, spec(chain(3, milestone_at=[1])), provider)
    tree = Tree(exporter.get_finished_spans())
    (span,) = tree.named(n.SPAN_REPLAN)
    (record,) = result.replans
    assert record.outcome is ReplanOutcome.REFUSED_DRIFT
    assert attr(span, n.REPLAN_OUTCOME) == "refused_drift"
    assert attr(span, n.REPLAN_REASON) == record.reason
    assert list(attr(span, n.REPLAN_TASKS_ADDED)) == ["t4", "t5", "t6"]
    assert attr(span, n.REPLAN_VERSION) == 1
    (ranker,) = tree.children(span, "invoke_agent ranker")
    (check,) = ranker.events
    assert (check.attributes or {})[n.GEN_AI_EVALUATION_SCORE_LABEL] == "1/3 aligned"


async def test_a_replan_whose_planner_answers_malformed_is_refused_on_its_span(
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    meter_provider: MeterProvider,
    metric_reader: InMemoryMetricReader,
) -> None:
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        replan=lambda request: {"tasks": "none"},
        usage=TokenUsage(input_tokens=10, output_tokens=4, calls=1),
    )
    result = await run_traced(
        model, spec(chain(3, milestone_at=[1])), provider, meter_provider
    )
    tree = Tree(exporter.get_finished_spans())
    (span,) = tree.named(n.SPAN_REPLAN)
    (record,) = result.replans
    assert record.outcome is ReplanOutcome.REFUSED_ERROR
    assert attr(span, n.REPLAN_OUTCOME) == "refused_error"
    assert attr(span, n.REPLAN_REASON) == record.reason
    assert "the planner could not answer (ModelOutputError)" in record.reason
    assert attr(span, n.REPLAN_VERSION) == 1
    assert attr(span, n.REPLAN_TRIGGER) == "contradiction"
    assert attr(span, n.REPLAN_REPLANS_REMAINING) == 3
    # What the failed answers cost (the first and its re-ask) is the
    # decision's.
    assert attr(span, n.REPLAN_USAGE_INPUT_TOKENS) == 2 * 10
    assert attr(span, n.REPLAN_USAGE_OUTPUT_TOKENS) == 2 * 4
    # A refusal is a normal outcome: the error is the planner's span's.
    assert span.status.status_code is not StatusCode.ERROR
    (planner,) = tree.children(span, n.SPAN_PLAN)
    assert planner.status.status_code is StatusCode.ERROR
    root = tree.one("invoke_workflow replan")
    assert attr(root, n.RUN_OUTCOME) == "completed"
    data = metric_reader.get_metrics_data()
    assert data is not None
    replans = [
        dict(point.attributes or {})
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == n.METRIC_REPLANS
        for point in metric.data.data_points
    ]
    assert replans == [
        {n.REPLAN_TRIGGER: "contradiction", n.REPLAN_OUTCOME: "refused_error"}
    ]


async def test_a_review_without_a_verdict_shows_its_decision_on_the_run_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = scripted(execute=with_finding, milestone=lambda request: {"x": 1})
    result = await run_traced(model, spec(chain(3, milestone_at=[1])), provider)
    assert result.status.value == "completed"
    tree = Tree(exporter.get_finished_spans())
    root = tree.one("invoke_workflow replan")
    decisions = [e for e in root.events if e.name == n.EVENT_DECISION]
    assert [dict(e.attributes or {}) for e in decisions] == [
        {
            n.MILESTONE_INDEX: index,
            n.REPLAN_DECISION: "continue",
            n.REPLAN_DECIDED_BY: "error",
        }
        for index in (1, 2)
    ]
    assert tree.named(n.SPAN_REPLAN) == []


async def test_reviews_the_cheap_checks_or_the_patterns_rules_decided_are_root_events(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    def execute(request: ModelRequest) -> TaskOutcome:
        # t1's finding goes to the reviewer; the other tasks pass the checks.
        if request.context["task"].id == "t1":
            return with_finding(request)
        return clean(request)

    model = scripted(
        execute=execute, milestone=lambda request: Verdict(decision="complete")
    )
    contract = spec(chain(3), milestone_every=1).model_copy(
        update={"pattern": "contract"}
    )
    result = await run_traced(model, contract, provider)
    assert result.status.value == "completed"
    root = Tree(exporter.get_finished_spans()).one(n.SPAN_RUN)
    decisions = [
        dict(e.attributes or {}) for e in root.events if e.name == n.EVENT_DECISION
    ]
    # The reviewer's "complete" a fixed plan runs past: the rules decided.
    assert decisions[0] == {
        n.MILESTONE_INDEX: 1,
        n.REPLAN_DECISION: "continue",
        n.REPLAN_DECIDED_BY: "policy",
    }
    assert decisions[1:]
    assert {d[n.REPLAN_DECIDED_BY] for d in decisions[1:]} == {"heuristic"}


async def test_with_candidates_the_critique_tournament_and_evolver_nest_in_the_replan(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = scripted(
        execute=with_finding, milestone=first_then_continue(replan_verdict())
    )
    await run_traced(
        model, spec(chain(3, milestone_at=[1]), replan_candidates=3), provider
    )
    tree = Tree(exporter.get_finished_spans())
    (replan,) = tree.named(n.SPAN_REPLAN)
    assert attr(replan, n.REPLAN_OUTCOME) == "applied"
    children = sorted(s.name for s in tree.children(replan))
    assert children == [
        "invoke_agent evolver",
        "invoke_agent ranker",  # the tournament
        "invoke_agent ranker",  # the alignment check
        "invoke_agent reviewer",  # the critiques
        "plan planner",
    ]
    (critic,) = tree.children(replan, "invoke_agent reviewer")
    scores = [e for e in critic.events if e.name == n.EVENT_EVALUATION]
    assert sorted(int((e.attributes or {})[n.CANDIDATE_INDEX]) for e in scores) == [
        0,
        1,
        2,
    ]
    assert {(e.attributes or {})[n.GEN_AI_EVALUATION_NAME] for e in scores} == {
        "feasibility"
    }
    (planner,) = tree.children(replan, n.SPAN_PLAN)
    assert len(tree.children(planner)) == 3  # one model call per candidate


async def test_concurrent_runs_never_mix_parents(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict()),
        latency_s=0.002,
    )
    with anyio.fail_after(20):
        async with Supervisor(model, MemoryStore(), tracer_provider=provider) as sup:
            handles = [
                await sup.submit(spec(chain(4, milestone_at=[1]), max_concurrency=2))
                for _ in range(8)
            ]
            results = [await h.result() for h in handles]
    tree = Tree(exporter.get_finished_spans())
    assert len(tree.traces()) == 8
    for result in results:
        run = tree.of_run(result.run_id)
        assert len(run.traces()) == 1
        (root,) = run.named(n.SPAN_RUN)
        assert len(run.named(n.SPAN_REPLAN)) == len(result.replans) == 1
        for span in run.spans:
            if span is root:
                continue
            parent = tree.parent(span)
            assert parent is not None, span.name
            assert attr(parent, n.GEN_AI_CONVERSATION_ID) == result.run_id
    # Every span belongs to some run.
    assert sum(len(tree.of_run(r.run_id).spans) for r in results) == len(tree.spans)
