"""The ``OTEL_*`` values :func:`~replan.telemetry.setup` and the SDK read,
checked before anything is built.

The SDK raises a bare ValueError for some bad values and, for others, logs
and falls back to its default; here each is a ``ConfigurationError`` naming
the variable, so that a command can say in one line what to fix.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from urllib.parse import urlsplit

from .._errors import ConfigurationError

Environ = os._Environ[str]

PROTOCOLS = ("http/protobuf", "grpc")
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
EXEMPLAR_FILTERS = ("trace_based", "always_on", "always_off")
SPAN_LIMITS = (
    "OTEL_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_EVENT_COUNT_LIMIT",
    "OTEL_SPAN_LINK_COUNT_LIMIT",
    "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
)


def protocol(env: Environ, signal: str) -> str:
    for variable in (
        f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ):
        value = env.get(variable, "").strip().lower()
        if value:
            if value not in PROTOCOLS:
                raise ConfigurationError(
                    variable, f"{value!r} is not one of {', '.join(PROTOCOLS)}"
                )
            return value
    return "http/protobuf"


def propagator_problem(exc: Exception) -> str:
    from importlib.metadata import entry_points

    installed = sorted(e.name for e in entry_points(group="opentelemetry_propagator"))
    # As the API reads the list: names are exact, and "none" ends it.
    for name in os.environ.get("OTEL_PROPAGATORS", "").split(","):
        if name.strip().lower() == "none":
            break
        if name.strip() not in installed:
            return (
                f"{name.strip()!r} is not an installed propagator "
                f"(installed: {', '.join(installed)}; or none)"
            )
    return f"{type(exc).__name__}: {exc}"


def check_sdk_variables(env: Environ, traces: list[str], metrics: list[str]) -> None:
    """Check the values the SDK reads as :func:`setup` builds the providers.

    The SDK raises a bare ValueError for some bad values (a span limit that
    is no number, a metric interval below zero) and, for others, logs a
    traceback or a warning and uses its default. The numbers, the sampler,
    the exemplar filter and the compression are accepted here only if the
    SDK would use them, else they are a ``ConfigurationError`` naming the
    variable. A variable set to nothing is a bad value too, as the SDK does
    not always read it as unset (a span limit set to nothing is no limit).
    Headers and resource attributes the SDK parses as best it can, with a
    one-line warning.
    """
    for variable in SPAN_LIMITS:
        if env.get(variable, "").strip():  # set to nothing: no limit at all
            _number(env, variable, int, _at_least_0, "a whole number, 0 or more")
    sampler = env.get("OTEL_TRACES_SAMPLER")
    if sampler is not None:
        _one_of("OTEL_TRACES_SAMPLER", sampler.lower(), SAMPLERS)
        if sampler.lower().endswith("traceidratio"):
            _number(
                env, "OTEL_TRACES_SAMPLER_ARG", float, _ratio, "a ratio from 0 to 1"
            )
    filter_ = env.get("OTEL_METRICS_EXEMPLAR_FILTER")
    if filter_ is not None:
        _one_of("OTEL_METRICS_EXEMPLAR_FILTER", filter_, EXEMPLAR_FILTERS)
    if "otlp" in traces:
        _check_span_batches(env)
        _check_otlp_exporter(env, "TRACES")
    if metrics:
        # The SDK takes inf too: for the interval, export only at shutdown.
        ms = "a number of milliseconds above 0"
        _number(env, "OTEL_METRIC_EXPORT_INTERVAL", float, _above_0, ms)
        _number(env, "OTEL_METRIC_EXPORT_TIMEOUT", float, _above_0, ms)
    if "otlp" in metrics:
        _check_otlp_exporter(env, "METRICS")


def _check_span_batches(env: Environ) -> None:
    """The ``OTEL_BSP_*`` values of the batching span processor (OTLP)."""
    whole = "a whole number above 0"
    queue = _number(env, "OTEL_BSP_MAX_QUEUE_SIZE", int, _above_0, whole)
    batch = _number(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", int, _above_0, whole)
    ms = "a whole number of milliseconds"
    _number(env, "OTEL_BSP_SCHEDULE_DELAY", int, _above_0, f"{ms} above 0")
    _number(env, "OTEL_BSP_EXPORT_TIMEOUT", int, _at_least_0, ms)
    # The SDK's defaults: a queue of 2048 spans, batches of 512.
    if (batch or 512) > (queue or 2048):
        raise ConfigurationError(
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" if batch else "OTEL_BSP_MAX_QUEUE_SIZE",
            f"a batch of {int(batch or 512)} spans is more than the queue of "
            f"{int(queue or 2048)} holds (OTEL_BSP_MAX_QUEUE_SIZE)",
        )


def _check_otlp_exporter(env: Environ, signal: str) -> None:
    """The endpoint, timeouts and compressions an OTLP exporter of ``signal``
    reads."""
    grpc = protocol(env, signal) == "grpc"
    if not grpc:  # gRPC also takes a bare host:port
        _check_http_endpoint(env, signal)
    for scope in (f"{signal}_", ""):
        # An infinite timeout would fail every export in the HTTP client.
        timeout = f"OTEL_EXPORTER_OTLP_{scope}TIMEOUT"
        _number(env, timeout, float, _finite_above_0, "a number of seconds above 0")
        variable = f"OTEL_EXPORTER_OTLP_{scope}COMPRESSION"
        value = env.get(variable)
        if value is None:
            continue
        if grpc:  # which takes gzip only, not even none
            _one_of(variable, value.strip().lower(), ("gzip",))
        elif value:  # HTTP reads an empty value as unset
            _one_of(variable, value.strip().lower(), ("none", "deflate", "gzip"))


def _check_http_endpoint(env: Environ, signal: str) -> None:
    """The endpoint an OTLP/HTTP exporter of ``signal`` sends to: its own
    variable if set, else the common one. Else each export would fail with
    a logged error, for as long as the process runs."""
    for variable in (
        f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ):
        value = env.get(variable)
        if value is None:
            continue
        try:
            parts = urlsplit(value)
            usable = (
                parts.scheme in ("http", "https")
                and bool(parts.hostname)
                and not any(c.isspace() for c in value)
            )
            parts.port  # noqa: B018 (raises for a port out of range)
        except ValueError:
            usable = False
        if not usable:
            shown = re.sub(r"//[^/@]*@", "//***@", value)
            raise ConfigurationError(
                variable,
                f"{shown!r} is not an http:// or https:// URL with a host, "
                "as OTLP over HTTP needs (e.g. http://localhost:4318)",
            )
        return


def _number(
    env: Environ,
    variable: str,
    parse: Callable[[str], float],
    allowed: Callable[[float], bool],
    expected: str,
) -> float | None:
    """The variable's value, parsed as the SDK parses it; None when unset."""
    raw = env.get(variable)
    if raw is None:
        return None
    try:
        value = parse(raw)
    except ValueError:
        value = math.nan  # which no check allows
    if not allowed(value):
        raise ConfigurationError(variable, f"{raw!r} is not {expected}")
    return value


def _at_least_0(value: float) -> bool:
    return value >= 0


def _above_0(value: float) -> bool:
    return value > 0


def _finite_above_0(value: float) -> bool:
    return 0 < value < math.inf


def _ratio(value: float) -> bool:
    return 0 <= value <= 1


def _one_of(variable: str, value: str, known: tuple[str, ...]) -> None:
    if value not in known:
        raise ConfigurationError(
            variable, f"{value!r} is not one of {', '.join(known)}"
        )


def refused_by_sdk(exc: ValueError) -> ConfigurationError:
    named = re.search(r"\bOTEL_[A-Z0-9_]+", str(exc))
    return ConfigurationError(
        named.group() if named else "OTEL_*",
        f"the OpenTelemetry SDK refused a value: {exc}",
    )
