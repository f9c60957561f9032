"""Telemetry never fails a run.

The OpenTelemetry SDK calls an application's span processors as a span
starts and ends, and its exemplar filter as a measurement is recorded,
without catching what they raise: a buggy exporter or processor on the
application's providers would raise out of replan's ``span.end()`` in the
middle of a run or an actor's request. Every call replan makes that the SDK
passes on to such code goes through here: what it raises is logged once per
kind of call and error, and the run goes on without that span or
measurement.

The checks cost a ``try`` block, which is free while nothing raises.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from opentelemetry import context as context_api
from opentelemetry import metrics, trace
from opentelemetry.trace import Link, Span, SpanKind
from opentelemetry.util.types import AttributeValue

logger = logging.getLogger("replan.telemetry")

_logged: set[tuple[str, type[BaseException]]] = set()
"""What was logged already: the call that failed, and the error's type."""

Attributes = Mapping[str, AttributeValue] | None


def failed(call: str, exc: Exception) -> None:
    """Log that the SDK raised out of ``call``, once per call and error type.

    A processor that raises on every span would otherwise log as many errors
    as the runs have spans.
    """
    key = (call, type(exc))
    if key in _logged:
        logger.debug("OpenTelemetry %s failed again", call, exc_info=exc)
        return
    _logged.add(key)
    logger.error(
        "OpenTelemetry %s failed (%s: %s), likely in a span processor, exporter "
        "or exemplar filter the application installed; runs go on without that "
        "telemetry, and this error is not logged again",
        call,
        type(exc).__name__,
        exc,
        exc_info=exc,
    )


def end(span: Span) -> None:
    """End ``span``; a processor's error is logged, not raised."""
    try:
        span.end()
    except Exception as exc:
        failed("span end", exc)


class GuardedTracer:
    """A tracer whose spans start (and, as current spans, end) without raising.

    A span whose start fails is replaced by ``INVALID_SPAN``: what would have
    been its children is not traced, and the run goes on.
    """

    __slots__ = ("_tracer",)

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def start_span(
        self,
        name: str,
        context: context_api.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> Span:
        try:
            return self._tracer.start_span(
                name,
                context,
                kind,
                attributes,
                links,
                start_time,
                record_exception,
                set_status_on_exception,
            )
        except Exception as exc:
            failed("span start", exc)
            return trace.INVALID_SPAN

    @contextmanager
    def start_as_current_span(
        self,
        name: str,
        context: context_api.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[Span]:
        span = self.start_span(
            name,
            context,
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
        )
        try:
            with trace.use_span(
                span,
                end_on_exit=False,
                record_exception=record_exception,
                set_status_on_exception=set_status_on_exception,
            ) as current:
                yield current
        finally:
            if end_on_exit:
                end(span)


class GuardedCounter:
    """A counter whose ``add`` logs what the SDK raises instead of raising it.

    It also keeps its own totals, by the values of the attributes added with
    (in the order given), whatever the meter provider does with the counts:
    the daemon's ``/metrics`` reads them with no metrics SDK installed.
    """

    __slots__ = ("_counter", "totals")

    def __init__(self, counter: metrics.Counter) -> None:
        self._counter = counter
        self.totals: dict[tuple[AttributeValue, ...], int | float] = {}
        """Sum of the amounts added, by the attributes' values."""

    def add(self, amount: int | float, attributes: Attributes = None) -> None:
        key = tuple(attributes.values()) if attributes else ()
        totals = self.totals
        totals[key] = totals.get(key, 0) + amount
        try:
            self._counter.add(amount, attributes)
        except Exception as exc:
            failed("counter add", exc)


class GuardedHistogram:
    """A histogram whose ``record`` logs what the SDK raises instead of raising it."""

    __slots__ = ("_histogram",)

    def __init__(self, histogram: metrics.Histogram) -> None:
        self._histogram = histogram

    def record(self, amount: int | float, attributes: Attributes = None) -> None:
        try:
            self._histogram.record(amount, attributes)
        except Exception as exc:
            failed("histogram record", exc)
