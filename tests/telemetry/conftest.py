from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

# The scripted models and plans of the run-rule tests.
sys.path.insert(0, str(Path(__file__).parent.parent / "supervisor"))


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Spans finished by ``provider``, kept in memory (no global provider)."""
    memory = InMemorySpanExporter()
    yield memory
    memory.clear()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield tracer_provider
    tracer_provider.shutdown()


@pytest.fixture
def metric_reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def meter_provider(metric_reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    meters = MeterProvider(metric_readers=[metric_reader])
    yield meters
    meters.shutdown()
