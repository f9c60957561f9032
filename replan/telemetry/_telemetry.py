"""A supervisor's tracer and metric instruments, from the OpenTelemetry API.

The library never configures the SDK: it asks the providers it was given, or
the global ones, which are no-ops until an application (or
:func:`replan.telemetry.setup`) installs real ones.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Protocol

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import TracerProvider

from .._version import __version__
from . import _names as n

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
CONTENT_LIMIT = 4096
"""Characters kept of a captured prompt or completion."""

_CAPTURE_VALUES = frozenset({"true", "1", "yes", "span_only", "span_and_event"})


def capture_content_from_env() -> bool:
    """Whether the capture-content variable asks for prompts and completions."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in _CAPTURE_VALUES


class _Mailbox(Protocol):
    """What the mailbox gauge reads from an actor pool."""

    role: str

    def statistics(self) -> _MailboxStatistics: ...


class _MailboxStatistics(Protocol):
    @property
    def mailbox_depth(self) -> int: ...


class Telemetry:
    """The tracer and instruments one supervisor records with.

    Args:
        tracer_provider: where spans go; the global provider when omitted.
        meter_provider: where metrics go; the global provider when omitted.
        capture_content: record prompts and completions on model-call spans
            (truncated); read from
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` when omitted.
        provider_name: the model's provider, set on agent spans as
            ``gen_ai.provider.name`` (the conventions require it there).
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        *,
        capture_content: bool | None = None,
        provider_name: str = "unknown",
    ) -> None:
        self.tracer = trace.get_tracer(n.LIBRARY, __version__, tracer_provider)
        self.provider_name = provider_name
        """The model's provider (``openai``, ``vllm``...), on agent spans."""
        self.capture_content = (
            capture_content_from_env() if capture_content is None else capture_content
        )
        meter = metrics.get_meter(n.LIBRARY, __version__, meter_provider)
        self.runs = meter.create_counter(
            n.METRIC_RUNS, unit="{run}", description="Runs that ended, by status"
        )
        self.replans = meter.create_counter(
            n.METRIC_REPLANS,
            unit="{replan}",
            description="Replan decisions, by trigger and outcome",
        )
        self.tokens = meter.create_counter(
            n.METRIC_TOKENS, unit="{token}", description="Model tokens, by role"
        )
        self.task_duration = meter.create_histogram(
            n.METRIC_TASK_DURATION,
            unit="s",
            description="Duration of task attempts, by outcome",
        )
        self.gate_wait = meter.create_histogram(
            n.METRIC_GATE_WAIT,
            unit="s",
            description="How long human gates waited for an answer",
        )
        self._mailboxes: list[_Mailbox] = []
        self._lock = threading.Lock()
        meter.create_observable_gauge(
            n.METRIC_MAILBOX_DEPTH,
            callbacks=[self._observe_mailboxes],
            unit="{request}",
            description="Requests waiting in each role's mailbox",
        )

    def watch(self, pools: Iterable[_Mailbox]) -> None:
        """Report the mailbox depth of ``pools`` until :meth:`unwatch`."""
        with self._lock:
            self._mailboxes = list(pools)

    def unwatch(self) -> None:
        with self._lock:
            self._mailboxes = []

    def _observe_mailboxes(self, options: CallbackOptions) -> Iterable[Observation]:
        # Collection runs on the SDK's reader thread: read a snapshot only.
        with self._lock:
            pools = list(self._mailboxes)
        return [
            Observation(pool.statistics().mailbox_depth, {n.ACTOR_ROLE: pool.role})
            for pool in pools
        ]


def truncate(text: str, limit: int = CONTENT_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
