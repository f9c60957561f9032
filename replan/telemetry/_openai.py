"""The OpenAI client's own instrumentation (the optional ``openai-otel`` extra).

When it is active, the OpenAI client's calls get their own ``chat <model>``
CLIENT spans, with ``gen_ai.usage.*``, nested under replan's actor spans (they
start in the actor's context). A model adapter whose client is instrumented
says so with ``otel_instrumented = True``; replan then emits no model-call
span of its own for it, so every call and its tokens are counted once.
"""

from __future__ import annotations

from typing import Any


def openai_instrumented() -> bool:
    """Is the OpenAI instrumentation installed and active in this process?"""
    try:
        from opentelemetry.instrumentation.genai.openai import OpenAIInstrumentor
    except ImportError:
        return False
    return bool(OpenAIInstrumentor().is_instrumented_by_opentelemetry)


def instrument_openai(**providers: Any) -> bool:
    """Activate the OpenAI instrumentation if installed; True if it is active.

    ``providers``: ``tracer_provider`` / ``meter_provider`` for its spans and
    metrics (the global ones when omitted).
    """
    try:
        from opentelemetry.instrumentation.genai.openai import OpenAIInstrumentor
    except ImportError:
        return False
    instrumentor = OpenAIInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(**providers)
    return True
