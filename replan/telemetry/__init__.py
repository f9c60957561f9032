"""Telemetry: trace context that travels in envelopes, and tracer access.

The library only uses the OpenTelemetry API; applications configure the SDK.
"""

from __future__ import annotations

from ._propagation import attached as attached
from ._propagation import current_carrier as current_carrier

__all__ = ("attached", "current_carrier")
