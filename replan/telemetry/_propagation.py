"""The trace context an envelope carries, through the application's propagator.

``opentelemetry.propagate`` reads ``OTEL_PROPAGATORS`` when it is imported,
and raises ValueError when the variable names a propagator that is not
installed. So that no variable can break ``import replan``, it is imported
here, on first use, and nowhere else; :func:`replan.telemetry.setup` reports
such a value as a ``ConfigurationError`` before anything runs.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.propagators.textmap import TextMapPropagator

logger = logging.getLogger("replan.telemetry")

_global_textmap: Callable[[], TextMapPropagator] | None = None
"""``propagate.get_global_textmap`` after the first use (or the fallback):
called each time, since the application may set another one later."""
_first_use_lock = threading.Lock()
_W3C = TraceContextTextMapPropagator()
_TRACEPARENT = "traceparent"
_untraced: weakref.ref[context.Context] | None = None
"""The last context :func:`current_carrier` found carrying no valid span."""


def current_carrier() -> dict[str, str]:
    """The sender's trace context, to put in an envelope.

    Context does not cross an anyio channel by itself, so every envelope
    carries it. Empty when no span is recording (tracing off costs nothing).
    The application's propagators write it (with their baggage, say); an
    envelope never leaves the process, so when they carry no span
    (``OTEL_PROPAGATORS=none``, or ``baggage`` alone: what an application
    sends to other processes) it carries W3C ``traceparent`` as well, and
    the actors' spans stay in the run's trace.
    """
    global _untraced
    current = context.get_current()
    if _untraced is not None and _untraced() is current:
        return {}
    if not trace.get_current_span(current).get_span_context().is_valid:
        # A context never changes: the next envelope sent under this one
        # needs no second look (get_current_span() checks the span against
        # an ABC, which costs more than the rest of sending a request).
        _untraced = weakref.ref(current)
        return {}
    carrier: dict[str, str] = {}
    propagator().inject(carrier)
    if _TRACEPARENT not in carrier:
        _W3C.inject(carrier)
    return carrier


def carried_context(carrier: dict[str, str]) -> context.Context:
    """The context an envelope carried (what ``propagate.extract`` returns,
    with the W3C span :func:`current_carrier` adds when it added one)."""
    carried = propagator().extract(carrier)
    if _TRACEPARENT in carrier:
        span = trace.get_current_span(carried).get_span_context()
        if not span.is_valid:
            carried = _W3C.extract(carrier, context=carried)
    return carried


@contextmanager
def attached(carrier: dict[str, str]) -> Iterator[None]:
    """Run the block under the trace context an envelope carried."""
    if not carrier:
        yield
        return
    token = context.attach(carried_context(carrier))
    try:
        yield
    finally:
        context.detach(token)


def propagator() -> TextMapPropagator:
    """The application's propagator: ``OTEL_PROPAGATORS``, or the one it set
    with ``propagate.set_global_textmap``.

    When ``OTEL_PROPAGATORS`` cannot be used (and ``setup()`` did not run to
    say so), runs still propagate W3C trace context and baggage, with one
    warning on the ``replan.telemetry`` logger.
    """
    get = _global_textmap
    if get is None:
        get = _first_use()
    return get()


def installed_propagators() -> Callable[[], TextMapPropagator]:
    """Import ``opentelemetry.propagate``; return its ``get_global_textmap``.

    Raises:
        ValueError: ``OTEL_PROPAGATORS`` names a propagator that is not
            installed; a propagator that fails to load raises its own error.
    """
    from opentelemetry import propagate

    return propagate.get_global_textmap


def _first_use() -> Callable[[], TextMapPropagator]:
    global _global_textmap
    with _first_use_lock:
        if _global_textmap is None:
            try:
                _global_textmap = installed_propagators()
            except Exception as exc:  # whatever a propagator's loading raised
                _global_textmap = _w3c_fallback(exc)
        return _global_textmap


def _w3c_fallback(exc: Exception) -> Callable[[], TextMapPropagator]:
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )

    logger.warning(
        "OTEL_PROPAGATORS=%r cannot be used (%s): trace context is propagated "
        "as W3C tracecontext and baggage",
        os.environ.get("OTEL_PROPAGATORS", ""),
        exc,
    )
    w3c = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
    return lambda: w3c
