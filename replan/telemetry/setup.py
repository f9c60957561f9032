"""Configure the OpenTelemetry SDK from the standard ``OTEL_*`` variables.

For applications, the CLI and the daemon; the library itself never calls it.
The SDK is imported only when :func:`setup` runs::

    from replan.telemetry import setup

    with setup():  # flushes and shuts the providers down on exit
        async with Supervisor(model) as sup: ...

Variables read (besides those the SDK and the exporters read themselves:
``OTEL_TRACES_SAMPLER``/``_ARG``, ``OTEL_SPAN_*_LIMIT``, ``OTEL_BSP_*``,
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``_HEADERS``, ``_TIMEOUT``...; the values
the SDK would refuse, or drop for its default with a logged error, are
checked first, and are a ``ConfigurationError`` naming the variable):

* ``OTEL_SDK_DISABLED=true``: configure nothing.
* ``OTEL_SERVICE_NAME``: default ``replan`` (``OTEL_RESOURCE_ATTRIBUTES`` too).
* ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``: ``otlp``, ``console``
  or ``none`` (a comma-separated list is allowed).
* ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or the ``_TRACES_`` / ``_METRICS_``
  variants): ``http/protobuf`` (default, port 4318) or ``grpc`` (port 4317).
* ``OTEL_PROPAGATORS``: checked even when nothing is exported, as runs
  propagate their context with it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Self, TextIO

from opentelemetry import metrics, trace

from .._errors import ConfigurationError
from ._environment import (
    Environ,
    check_sdk_variables,
    propagator_problem,
    protocol,
    refused_by_sdk,
)
from ._propagation import installed_propagators

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

DEFAULT_SERVICE_NAME = "replan"
EXPORTERS = ("otlp", "console", "none")


@dataclass
class TelemetrySetup:
    """What :func:`setup` configured; :meth:`shutdown` flushes and stops it.

    ``configured`` is False when nothing was done (the SDK is disabled, or
    the application had set its own providers); the providers are then None
    and the supervisor uses the global ones.
    """

    configured: bool
    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    exporters: dict[str, list[str]] = field(default_factory=dict)
    """The exporters chosen per signal, e.g. ``{"traces": ["otlp"]}``."""

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Flush what is buffered and stop the providers (idempotent).

        Args:
            timeout_s: stop waiting after this many seconds. A collector that
                does not answer makes the SDK retry each signal's export for
                up to ``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s by default); past
                ``timeout_s`` the flush goes on in a daemon thread, which the
                process's exit does not wait for.

        Returns:
            False when it stopped waiting before the flush was done.
        """
        atexit.unregister(self.shutdown)
        providers = [
            p for p in (self.tracer_provider, self.meter_provider) if p is not None
        ]
        self.tracer_provider = self.meter_provider = None
        if timeout_s is None:
            for provider in providers:
                provider.shutdown()
            return True
        # One thread per provider: traces and metrics retry side by side.
        flushes = [
            threading.Thread(
                target=provider.shutdown, name="replan-telemetry-flush", daemon=True
            )
            for provider in providers
        ]
        for flush in flushes:
            flush.start()
        deadline = time.monotonic() + timeout_s
        for flush in flushes:
            flush.join(max(0.0, deadline - time.monotonic()))
        return not any(flush.is_alive() for flush in flushes)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()


def setup(
    *,
    set_global: bool = True,
    default_exporter: str = "otlp",
    console: TextIO | None = None,
) -> TelemetrySetup:
    """Configure tracing and metrics export from the ``OTEL_*`` variables.

    Args:
        set_global: install the providers as the global ones (what an
            application wants); False only returns them, to inject into a
            ``Supervisor(tracer_provider=..., meter_provider=...)``.
        default_exporter: the exporter when ``OTEL_TRACES_EXPORTER`` /
            ``OTEL_METRICS_EXPORTER`` is unset (the standard says ``otlp``;
            the CLI passes ``none`` unless an OTLP endpoint is set).
        console: where the ``console`` exporters write (stdout by default).

    Returns:
        A :class:`TelemetrySetup`; call ``shutdown()`` (or use it as a context
        manager) before the process exits so that buffered spans are sent.

    Raises:
        ConfigurationError: a variable has a value this function cannot use,
            or OTLP is asked for without the ``replan[otel]`` extra.
    """
    return _configure(
        set_global=set_global,
        defaults=(default_exporter, default_exporter),
        console=console,
    )


def _configure(
    *, set_global: bool, defaults: tuple[str, str], console: TextIO | None
) -> TelemetrySetup:
    """:func:`setup`, with a default exporter for traces and one for metrics."""
    env = os.environ
    # Runs propagate their context through the API, configured or not:
    # checked even with the SDK disabled.
    check_propagators()
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return TelemetrySetup(configured=False)
    if set_global and _providers_already_set():
        return TelemetrySetup(configured=False)

    traces = _exporter_names(env, "OTEL_TRACES_EXPORTER", defaults[0])
    metric_names = _exporter_names(env, "OTEL_METRICS_EXPORTER", defaults[1])
    if set_global and not traces and not metric_names:
        # Global providers that export nowhere would only make every span
        # record for nothing: leave the no-op API in place.
        return TelemetrySetup(configured=False)

    check_sdk_variables(env, traces, metric_names)
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    try:
        resource = _resource()
        # Sampler and span limits come from OTEL_TRACES_SAMPLER(_ARG) and
        # OTEL_SPAN_*_LIMIT: the SDK reads them when given none here.
        # The providers' own exit hooks would wait on a collector that is down
        # for as long as the SDK retries, even after a bounded shutdown(): the
        # one hook registered below flushes only what shutdown() has not.
        tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for name in traces:
            _add_span_exporter(tracer_provider, name, env, console)
        readers = [_metric_reader(name, env, console) for name in metric_names]
        meter_provider = MeterProvider(
            resource=resource, metric_readers=readers, shutdown_on_exit=False
        )
    except ConfigurationError:
        raise
    except ValueError as exc:  # a value the checks above do not know of
        raise refused_by_sdk(exc) from None
    if set_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        # With the openai-otel extra, the OpenAI client's calls are traced
        # too, under the actor spans (an adapter then skips its own span).
        from ._openai import instrument_openai

        instrument_openai(
            tracer_provider=tracer_provider, meter_provider=meter_provider
        )
    configured = TelemetrySetup(
        configured=True,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        exporters={"traces": traces, "metrics": metric_names},
    )
    atexit.register(configured.shutdown)
    return configured


def setup_if_asked(*, console: TextIO | None = None) -> TelemetrySetup:
    """:func:`setup` for the CLI and the daemon: export only when asked.

    An application's default is OTLP, as the standard says; a command run by
    hand with no collector listening would only log export failures, so here
    nothing is exported unless ``OTEL_TRACES_EXPORTER`` /
    ``OTEL_METRICS_EXPORTER`` or an OTLP endpoint is set: a signal is sent
    over OTLP by default when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or its own
    endpoint (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
    ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``) is set, so traces alone can go
    to a collector that takes no metrics (Jaeger).

    Raises:
        ConfigurationError: as :func:`setup`.
    """

    def default(signal: str) -> str:
        for name in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT",
        ):
            if os.environ.get(name, "").strip():
                return "otlp"
        return "none"

    return _configure(
        set_global=True,
        defaults=(default("TRACES"), default("METRICS")),
        console=console,
    )


def check_propagators() -> None:
    """Check that ``OTEL_PROPAGATORS`` names installed propagators.

    :func:`setup` calls it first; a command can call it before it imports
    anything that imports ``opentelemetry.propagate`` (FastAPI does), which
    would fail with a bare ValueError.

    Raises:
        ConfigurationError: a propagator is not installed, or fails to load.
    """
    try:
        installed_propagators()
    except Exception as exc:  # whatever a propagator's loading raised
        raise ConfigurationError("OTEL_PROPAGATORS", propagator_problem(exc)) from None


def _providers_already_set() -> bool:
    """Did the application install its own global providers?"""
    # Until one is set, the API hands out proxy providers.
    tracer_set = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    meter_set = not type(metrics.get_meter_provider()).__name__.startswith("_Proxy")
    return tracer_set or meter_set


def _resource() -> Resource:
    """The SDK's resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``)
    with ``service.name`` defaulting to ``replan``, not ``unknown_service``."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create()
    name = str(resource.attributes.get(SERVICE_NAME, ""))
    if not os.environ.get("OTEL_SERVICE_NAME") and name.startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def _exporter_names(env: Environ, variable: str, default: str) -> list[str]:
    value = env.get(variable, "").strip() or default
    names = [v.strip().lower() for v in value.split(",") if v.strip()]
    for name in names:
        if name not in EXPORTERS:
            raise ConfigurationError(
                variable, f"{name!r} is not one of {', '.join(EXPORTERS)}"
            )
    return [name for name in names if name != "none"]


def _missing_extra(exc: ImportError) -> ConfigurationError:
    return ConfigurationError(
        "OTEL_TRACES_EXPORTER",
        f"OTLP export needs the exporters: pip install 'replan[otel]' ({exc})",
    )


def _add_span_exporter(
    provider: TracerProvider, name: str, env: Environ, console: TextIO | None
) -> None:
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    if name == "console":
        exporter = ConsoleSpanExporter(out=console or sys.stdout)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return
    try:
        if protocol(env, "TRACES") == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )

            provider.add_span_processor(BatchSpanProcessor(GrpcSpanExporter()))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter as HttpSpanExporter,
            )

            provider.add_span_processor(BatchSpanProcessor(HttpSpanExporter()))
    except ImportError as exc:
        raise _missing_extra(exc) from None


def _metric_reader(name: str, env: Environ, console: TextIO | None) -> MetricReader:
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        MetricExporter,
        PeriodicExportingMetricReader,
    )

    exporter: MetricExporter
    if name == "console":
        exporter = ConsoleMetricExporter(out=console or sys.stdout)
    else:
        try:
            if protocol(env, "METRICS") == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                    OTLPMetricExporter as GrpcMetricExporter,
                )

                exporter = GrpcMetricExporter()
            else:
                from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                    OTLPMetricExporter as HttpMetricExporter,
                )

                exporter = HttpMetricExporter()
        except ImportError as exc:
            raise _missing_extra(exc) from None
    return PeriodicExportingMetricReader(exporter)
