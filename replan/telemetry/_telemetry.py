"""A supervisor's tracer and metric instruments, from the OpenTelemetry API.

The library never configures the SDK: it asks the providers it was given, or
the global ones, which are no-ops until an application (or
:func:`replan.telemetry.setup`) installs real ones.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import Counter
from collections.abc import Iterable
from typing import Protocol

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import TracerProvider

from .._version import __version__
from . import _names as n
from ._guard import GuardedCounter, GuardedHistogram, GuardedTracer

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
CONTENT_LIMIT = 4096
"""Characters kept of a captured prompt or completion."""

_CAPTURE_VALUES = frozenset({"true", "1", "yes", "span_only", "span_and_event"})

TASK_DURATION_BUCKETS: tuple[float, ...] = tuple(0.01 * 2**i for i in range(17))
"""Bucket bounds of ``replan.task.duration``, in seconds: 0.01 doubling to
about 11 minutes. The SDK's default bounds (0, 5, 10, 25... made for
milliseconds) would put every attempt shorter than 5 s in one bucket."""
GATE_WAIT_BUCKETS: tuple[float, ...] = (
    1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600,
    7200, 14400, 28800, 86400, 172800, 604800,
)  # fmt: skip
"""Bucket bounds of ``replan.gate.wait``, in seconds: from a second to a
week, as a person may answer at once, after lunch or after the weekend."""


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
        # Guarded: what an application's span processors or exemplar filter
        # raise through the SDK is logged, never raised into a run.
        self.tracer = GuardedTracer(
            trace.get_tracer(n.LIBRARY, __version__, tracer_provider)
        )
        self.provider_name = provider_name
        """The model's provider (``openai``, ``vllm``...), on agent spans."""
        self.capture_content = (
            capture_content_from_env() if capture_content is None else capture_content
        )
        meter = metrics.get_meter(n.LIBRARY, __version__, meter_provider)
        self.runs = GuardedCounter(
            meter.create_counter(
                n.METRIC_RUNS, unit="{run}", description="Runs that ended, by status"
            )
        )
        self.replans = GuardedCounter(
            meter.create_counter(
                n.METRIC_REPLANS,
                unit="{replan}",
                description="Replan decisions, by trigger and outcome",
            )
        )
        self.tokens = GuardedCounter(
            meter.create_counter(
                n.METRIC_TOKENS, unit="{token}", description="Model tokens, by role"
            )
        )
        self.task_duration = GuardedHistogram(
            meter.create_histogram(
                n.METRIC_TASK_DURATION,
                unit="s",
                description="Duration of task attempts, by outcome",
                explicit_bucket_boundaries_advisory=TASK_DURATION_BUCKETS,
            )
        )
        self.gate_wait = GuardedHistogram(
            meter.create_histogram(
                n.METRIC_GATE_WAIT,
                unit="s",
                description="How long human gates waited for an answer",
                explicit_bucket_boundaries_advisory=GATE_WAIT_BUCKETS,
            )
        )
        self._mailboxes = _mailbox_gauge(
            meter_provider or metrics.get_meter_provider(), meter
        )

    def watch(self, pools: Iterable[_Mailbox]) -> None:
        """Report the mailbox depth of ``pools`` until :meth:`unwatch`."""
        self._mailboxes.watch(self, pools)

    def unwatch(self) -> None:
        self._mailboxes.unwatch(self)


class _MailboxGauge:
    """The mailbox depth gauge of one meter provider, for every supervisor
    that records with it.

    A meter makes an instrument once per name: a second gauge of the same
    name would be the first one, with the first one's callback alone, and
    a later supervisor's mailboxes would never be reported. So there is one
    gauge (and one callback) per provider; it sums the depths of each role
    over the supervisors watched at the moment.
    """

    def __init__(self, meter: metrics.Meter) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, list[_Mailbox]] = {}
        meter.create_observable_gauge(
            n.METRIC_MAILBOX_DEPTH,
            callbacks=[self._observe],
            unit="{request}",
            description="Requests waiting in each role's mailbox",
        )

    def watch(self, owner: object, pools: Iterable[_Mailbox]) -> None:
        with self._lock:
            self._watched[id(owner)] = list(pools)

    def unwatch(self, owner: object) -> None:
        with self._lock:
            self._watched.pop(id(owner), None)

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        # Collection runs on the SDK's reader thread: read a snapshot only.
        with self._lock:
            pools = [pool for watched in self._watched.values() for pool in watched]
        depths: Counter[str] = Counter()
        for pool in pools:
            depths[pool.role] += pool.statistics().mailbox_depth
        return [
            Observation(depth, {n.ACTOR_ROLE: role}) for role, depth in depths.items()
        ]


_GAUGES: weakref.WeakKeyDictionary[object, _MailboxGauge] = weakref.WeakKeyDictionary()
_GAUGES_LOCK = threading.Lock()


def _mailbox_gauge(provider: object, meter: metrics.Meter) -> _MailboxGauge:
    """The mailbox gauge of ``provider``, made with ``meter`` the first time."""
    with _GAUGES_LOCK:
        gauge = _GAUGES.get(provider)
        if gauge is None:
            gauge = _GAUGES[provider] = _MailboxGauge(meter)
        return gauge


def truncate(text: str, limit: int = CONTENT_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
