"""``OTEL_*`` values that cannot be used: never an import error, never a
traceback; ``setup()`` names the variable in a ConfigurationError."""

from __future__ import annotations

import importlib
import io
import logging
import os
import sys

import opentelemetry
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from processes import run_python
from scripts import chain, scripted, spec
from spans import Tree, run_traced

from replan import ConfigurationError, RunStatus
from replan.telemetry import _names as n
from replan.telemetry import _propagation, setup

QUIET = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}
DEMO = "from replan.cli import main; raise SystemExit(main(['demo', '--yes']))"


def set_env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    for name, value in {**QUIET, **values}.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def propagate_not_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a fresh process: ``opentelemetry.propagate`` reads
    OTEL_PROPAGATORS again when next imported (restored afterwards)."""
    monkeypatch.delitem(sys.modules, "opentelemetry.propagate", raising=False)
    monkeypatch.delattr(opentelemetry, "propagate", raising=False)
    monkeypatch.setattr(_propagation, "_global_textmap", None, raising=False)


# OTEL_PROPAGATORS ------------------------------------------------------------


def test_a_propagator_that_is_not_installed_does_not_break_import_replan() -> None:
    done = run_python(
        "import replan, replan.cli, replan.telemetry; print('imported')",
        OTEL_PROPAGATORS="b3",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"


SERVE = (
    "from replan.cli import main; "
    "raise SystemExit(main(['serve', '--data-dir', 'unused', '--port', '0']))"
)


@pytest.mark.parametrize("command", [DEMO, SERVE], ids=["demo", "serve"])
def test_a_propagator_that_is_not_installed_is_one_cli_error_line(
    command: str,
) -> None:
    # serve imports a web framework that reads the variable as it is imported.
    done = run_python(command, OTEL_PROPAGATORS="b3")
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(
        "replan: error: OTEL_PROPAGATORS: 'b3' is not an installed propagator "
        "(installed: "
    )
    assert "tracecontext" in line


@pytest.mark.parametrize(
    ("value", "named"),
    [("b3", "'b3'"), ("tracecontext,bogus", "'bogus'"), ("tracecontext,", "''")],
)
@pytest.mark.usefixtures("propagate_not_imported")
def test_setup_reports_a_propagator_that_is_not_installed(
    value: str, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_env(monkeypatch, OTEL_PROPAGATORS=value)
    with pytest.raises(ConfigurationError) as caught:
        setup(set_global=False)
    assert caught.value.field == "OTEL_PROPAGATORS"
    assert caught.value.problem.startswith(f"{named} is not an installed propagator")


@pytest.mark.usefixtures("propagate_not_imported")
def test_setup_reports_a_bad_propagator_even_with_the_sdk_disabled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The API propagates context whether the SDK is configured or not.
    set_env(monkeypatch, OTEL_PROPAGATORS="b3", OTEL_SDK_DISABLED="true")
    with pytest.raises(ConfigurationError, match="OTEL_PROPAGATORS"):
        setup(set_global=False)


@pytest.mark.usefixtures("propagate_not_imported")
def test_setup_accepts_installed_propagators_and_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for value in ("tracecontext, baggage", "none", "none,bogus"):
        set_env(monkeypatch, OTEL_PROPAGATORS=value)
        with setup(set_global=False) as configured:
            assert configured.configured
        # The module was imported by the check: forget it for the next value.
        monkeypatch.delitem(sys.modules, "opentelemetry.propagate", raising=False)
        monkeypatch.delattr(opentelemetry, "propagate", raising=False)


@pytest.mark.parametrize("value", ["none", "baggage"])
@pytest.mark.usefixtures("propagate_not_imported")
async def test_propagators_that_carry_no_span_still_leave_the_actors_spans_in_the_run(
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    set_env(monkeypatch, OTEL_PROPAGATORS=value)  # nothing sent to other processes
    result = await run_traced(scripted(), spec(chain(2)), provider)
    assert result.status is RunStatus.COMPLETED
    tree = Tree(exporter.get_finished_spans())
    assert len(tree.traces()) == 1
    root = tree.one(n.SPAN_RUN)
    executors = tree.named("invoke_agent executor")
    assert len(executors) == 3  # two tasks and the synthesis
    for span in executors:
        assert tree.parent(span) == root
        assert [tree.parent(chat) for chat in tree.children(span)] == [span]


@pytest.mark.usefixtures("propagate_not_imported")
async def test_a_run_without_setup_propagates_w3c_context_and_warns_once(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    set_env(monkeypatch, OTEL_PROPAGATORS="b3")
    with caplog.at_level(logging.WARNING, logger="replan.telemetry"):
        result = await run_traced(scripted(), spec(chain(2)), provider)
        await run_traced(scripted(), spec(chain(1)), provider)
    assert result.status is RunStatus.COMPLETED
    warnings = [r for r in caplog.records if r.name == "replan.telemetry"]
    assert len(warnings) == 1
    assert "OTEL_PROPAGATORS='b3' cannot be used" in warnings[0].getMessage()
    # The actors' spans are still children of their run's root.
    tree = Tree(exporter.get_finished_spans())
    assert len(tree.traces()) == 2
    roots = tree.named(n.SPAN_RUN)
    for span in tree.named("invoke_agent executor"):
        assert tree.parent(span) in roots


# Values the SDK reads while setup() builds the providers ---------------------

OTLP_TRACES = {"OTEL_TRACES_EXPORTER": "otlp"}
CONSOLE_METRICS = {"OTEL_METRICS_EXPORTER": "console"}
GRPC = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}


@pytest.mark.parametrize(
    ("variable", "value", "others"),
    [
        ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "abc", {}),
        ("OTEL_SPAN_EVENT_COUNT_LIMIT", "abc", {}),
        ("OTEL_SPAN_LINK_COUNT_LIMIT", "-1", {}),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "abc", {}),
        ("OTEL_ATTRIBUTE_COUNT_LIMIT", "unset", {}),
        ("OTEL_TRACES_SAMPLER", "always", {}),
        ("OTEL_METRICS_EXEMPLAR_FILTER", "sometimes", {}),
        ("OTEL_METRIC_EXPORT_INTERVAL", "-5", CONSOLE_METRICS),
        ("OTEL_METRIC_EXPORT_INTERVAL", "abc", CONSOLE_METRICS),
        ("OTEL_METRIC_EXPORT_TIMEOUT", "0", CONSOLE_METRICS),
        ("OTEL_BSP_SCHEDULE_DELAY", "abc", OTLP_TRACES),
        ("OTEL_BSP_SCHEDULE_DELAY", "0", OTLP_TRACES),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0", OTLP_TRACES),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4096", OTLP_TRACES),
        ("OTEL_BSP_EXPORT_TIMEOUT", "soon", OTLP_TRACES),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "abc", OTLP_TRACES),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "-1", {**OTLP_TRACES, **GRPC}),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "nan", {**OTLP_TRACES, **GRPC}),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zip", OTLP_TRACES),
        ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none", {**OTLP_TRACES, **GRPC}),
        # OTLP over HTTP needs a URL: each export would fail, logged, for ever.
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318", OTLP_TRACES),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "", OTLP_TRACES),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://", OTLP_TRACES),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://a b:4318", OTLP_TRACES),
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "http://h:99999",
            CONSOLE_METRICS | {"OTEL_METRICS_EXPORTER": "otlp"},
        ),
    ],
)
def test_a_value_the_sdk_cannot_use_is_a_configuration_error_naming_it(
    variable: str, value: str, others: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    set_env(monkeypatch, **others, **{variable: value})
    with pytest.raises(ConfigurationError) as caught:
        setup(set_global=False, console=io.StringIO())
    assert caught.value.field == variable
    assert repr(value) in caught.value.problem or value in caught.value.problem


@pytest.mark.parametrize(
    ("sampler", "ratio"), [("traceidratio", "1.5"), ("parentbased_traceidratio", "")]
)
def test_a_sampling_ratio_outside_0_to_1_is_a_configuration_error(
    sampler: str, ratio: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_env(monkeypatch, OTEL_TRACES_SAMPLER=sampler, OTEL_TRACES_SAMPLER_ARG=ratio)
    with pytest.raises(ConfigurationError) as caught:
        setup(set_global=False)
    assert caught.value.field == "OTEL_TRACES_SAMPLER_ARG"


@pytest.mark.parametrize(
    "values",
    [
        {
            "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": " ",
            "OTEL_SPAN_EVENT_COUNT_LIMIT": "0",
        },
        {"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": " 12 "},
        {"OTEL_TRACES_SAMPLER": "TraceIdRatio", "OTEL_TRACES_SAMPLER_ARG": "0"},
        {"OTEL_TRACES_SAMPLER": "parentbased_always_off"},
        {"OTEL_METRICS_EXEMPLAR_FILTER": "always_off"},
        {**CONSOLE_METRICS, "OTEL_METRIC_EXPORT_INTERVAL": "inf"},
        {
            **OTLP_TRACES,
            "OTEL_BSP_MAX_QUEUE_SIZE": "100",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100",
        },
        {
            **OTLP_TRACES,
            "OTEL_BSP_EXPORT_TIMEOUT": "0",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2.5",
        },
        {**OTLP_TRACES, "OTEL_EXPORTER_OTLP_COMPRESSION": " Deflate"},
        {**OTLP_TRACES, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": ""},
        {**OTLP_TRACES, **GRPC, "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"},
        {**OTLP_TRACES, **GRPC, "OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4317"},
        {**OTLP_TRACES, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://[::1]/v1/t"},
        # The traces' own endpoint is the one used: the common one is not read.
        {
            **OTLP_TRACES,
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/v1/traces",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "h:4317",
        },
        # Read only by the batching processor of the OTLP exporter.
        {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "abc"},
    ],
)
def test_values_the_sdk_can_use_are_accepted(
    values: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    set_env(
        monkeypatch, **{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", **values}
    )
    configured = setup(set_global=False, console=io.StringIO())
    assert configured.configured
    assert configured.shutdown(timeout_s=5)


def test_a_value_the_sdk_refuses_beyond_the_checks_is_still_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = importlib.import_module("replan.telemetry.setup")
    monkeypatch.setattr(module, "check_sdk_variables", lambda *_: None)
    set_env(monkeypatch, OTEL_SPAN_EVENT_COUNT_LIMIT="many")
    with pytest.raises(ConfigurationError) as caught:
        setup(set_global=False)
    assert caught.value.field == "OTEL_SPAN_EVENT_COUNT_LIMIT"
    assert "the OpenTelemetry SDK refused a value" in caught.value.problem
    set_env(monkeypatch, **OTLP_TRACES, OTEL_BSP_MAX_QUEUE_SIZE="0")
    with pytest.raises(ConfigurationError) as caught:
        setup(set_global=False)
    assert caught.value.field == "OTEL_*"
    assert "max_queue_size" in caught.value.problem


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {
                "OTEL_TRACES_EXPORTER": "console",
                "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "abc",
            },
            "replan: error: OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT: "
            "'abc' is not a whole number, 0 or more",
        ),
        (
            {"OTEL_METRICS_EXPORTER": "console", "OTEL_METRIC_EXPORT_INTERVAL": "-5"},
            "replan: error: OTEL_METRIC_EXPORT_INTERVAL: "
            "'-5' is not a number of milliseconds above 0",
        ),
    ],
)
def test_a_bad_otel_number_is_one_cli_error_line(
    env: dict[str, str], line: str
) -> None:
    done = run_python(DEMO, **env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [line]
