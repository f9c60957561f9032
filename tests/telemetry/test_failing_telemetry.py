"""An application's span processor or exemplar filter that raises fails no run."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from explore_scripts import ExploreScript, Idea, explore_spec, run_explore
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import ExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
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
from spans import Tree, attr, run_traced

from replan import RunStatus
from replan.telemetry import _guard
from replan.telemetry import _names as n


class Raising(SpanProcessor):
    """A buggy processor: raises as every span starts, or as it ends."""

    def __init__(self, when: str) -> None:
        self.when = when

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self.when == "start":
            raise RuntimeError("exporter bug on start")

    def on_end(self, span: ReadableSpan) -> None:
        if self.when == "end":
            raise RuntimeError("exporter bug on end")


class RaisingFilter(ExemplarFilter):
    def should_sample(self, *args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("exemplar filter bug")


@pytest.fixture(autouse=True)
def nothing_logged_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the first error of its own (logged once per process)."""
    monkeypatch.setattr(_guard, "_logged", set())


@pytest.fixture(params=["start", "end"])
def when(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def broken_provider(
    when: str, exporter: InMemorySpanExporter
) -> Iterator[TracerProvider]:
    """Spans reach the in-memory exporter, then a processor that raises."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(Raising(when))
    yield provider
    provider.shutdown()


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "replan.telemetry" and r.levelno >= logging.ERROR
    ]


async def test_a_plan_run_whose_span_processor_raises_completes_and_logs_it_once(
    when: str,
    broken_provider: TracerProvider,
    exporter: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = scripted(
        execute=with_finding, milestone=first_then_continue(replan_verdict())
    )
    with caplog.at_level(logging.ERROR, logger="replan.telemetry"):
        result = await run_traced(
            model, spec(chain(3, milestone_at=[1])), broken_provider
        )
    assert result.status is RunStatus.COMPLETED
    assert result.replans_applied == 1
    [logged] = errors(caplog)
    assert "exporter bug" in logged.getMessage()
    tree = Tree(exporter.get_finished_spans())
    if when == "start":  # no span started: the run went on untraced
        assert not tree.spans
    else:  # each span ended, reached the exporter, then the processor raised
        root = tree.one(n.SPAN_RUN)
        assert attr(root, n.RUN_OUTCOME) == "completed"
        assert attr(tree.one(n.SPAN_REPLAN), n.REPLAN_OUTCOME) == "applied"


async def test_an_explore_run_whose_span_processor_raises_issues_its_brief(
    when: str,
    broken_provider: TracerProvider,
    exporter: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = ExploreScript(
        generated=[
            Idea("Solo cooks leave because recipes serve four", strength=0.9),
            Idea("Leftovers make the weekly plan feel wasteful", strength=0.5),
        ]
    )
    with caplog.at_level(logging.ERROR, logger="replan.telemetry"):
        outcome = await run_explore(
            explore_spec(select=1), script, tracer_provider=broken_provider
        )
    result = outcome.result
    assert result.status is RunStatus.COMPLETED
    assert result.brief is not None
    assert len(result.brief.selected) == 1
    assert len(errors(caplog)) == 1
    names = {s.name for s in exporter.get_finished_spans()}
    if when == "start":
        assert not names
    else:
        assert {n.SPAN_RUN, n.SPAN_EXPLORE_CYCLE} <= names


async def test_a_run_whose_exemplar_filter_raises_completes() -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader], exemplar_filter=RaisingFilter())
    try:
        result = await run_traced(
            scripted(execute=with_finding),
            spec(chain(3), milestone_every=1),
            TracerProvider(),
            meters,
        )
    finally:
        meters.shutdown()
    assert result.status is RunStatus.COMPLETED
