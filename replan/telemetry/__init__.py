"""Telemetry: the run's spans and metrics through the OpenTelemetry API.

The library only uses the API; :func:`setup` configures the SDK for
applications, the CLI and the daemon. Names live in ``_names``.
"""

from __future__ import annotations

from ._actors import ActorSpan as ActorSpan
from ._actors import actor_span_suspended as actor_span_suspended
from ._actors import model_call as model_call
from ._actors import model_call_traced as model_call_traced
from ._actors import serving as serving
from ._actors import tool_call as tool_call
from ._openai import instrument_openai as instrument_openai
from ._openai import openai_instrumented as openai_instrumented
from ._propagation import attached as attached
from ._propagation import current_carrier as current_carrier
from ._run import RunTrace as RunTrace
from ._run import journaled_context as journaled_context
from ._run import resumed_root as resumed_root
from ._telemetry import Telemetry as Telemetry
from .setup import TelemetrySetup as TelemetrySetup
from .setup import setup as setup
from .setup import setup_if_asked as setup_if_asked

__all__ = (
    "ActorSpan",
    "RunTrace",
    "Telemetry",
    "TelemetrySetup",
    "actor_span_suspended",
    "attached",
    "current_carrier",
    "instrument_openai",
    "journaled_context",
    "model_call",
    "model_call_traced",
    "openai_instrumented",
    "resumed_root",
    "serving",
    "setup",
    "setup_if_asked",
    "tool_call",
)
