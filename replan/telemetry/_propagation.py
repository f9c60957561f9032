from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import context, propagate, trace


def current_carrier() -> dict[str, str]:
    """The sender's W3C trace context, to put in an envelope.

    Context does not cross an anyio channel by itself, so every envelope
    carries it. Empty when no span is recording (tracing off costs nothing).
    """
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextmanager
def attached(carrier: dict[str, str]) -> Iterator[None]:
    """Run the block under the trace context an envelope carried."""
    if not carrier:
        yield
        return
    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)
