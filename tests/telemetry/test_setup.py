"""``replan.telemetry.setup()``: the SDK configured from the OTEL_* variables."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from processes import run_python
from scripts import chain, scripted, spec
from spans import Tree, attr, run_traced

from replan import ConfigurationError
from replan.telemetry import TelemetrySetup, setup
from replan.telemetry import _names as n
from replan.telemetry._telemetry import CONTENT_LIMIT

QUIET = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}


def set_env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    for name, value in {**QUIET, **values}.items():
        monkeypatch.setenv(name, value)


def test_runs_use_the_api_alone_and_only_setup_imports_the_sdk() -> None:
    done = run_python(
        """
        import sys

        import anyio

        from replan import GatePolicy, Supervisor
        from replan._demo import demo_model, demo_spec
        from replan.telemetry import setup

        def sdk():
            return [m for m in sys.modules if m.startswith("opentelemetry.sdk")]

        async def main():
            spec = demo_spec().model_copy(
                update={"gate_policy": GatePolicy(gate_on=frozenset())}
            )
            async with Supervisor(demo_model()) as sup:
                print((await (await sup.submit(spec)).result()).status.value)

        anyio.run(main)
        print(sdk() == [])
        setup(set_global=False).shutdown()
        print(sdk() != [])
        """,
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["completed", "True", "True"]


def test_the_service_name_defaults_to_replan(monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch)
    with setup(set_global=False) as configured:
        assert configured.configured
        assert configured.tracer_provider is not None
        resource = configured.tracer_provider.resource
        assert resource.attributes["service.name"] == "replan"


def test_otel_service_name_names_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, OTEL_SERVICE_NAME="research-agents")
    with setup(set_global=False) as configured:
        assert configured.tracer_provider is not None
        resource = configured.tracer_provider.resource
        assert resource.attributes["service.name"] == "research-agents"


def test_the_sampler_comes_from_otel_traces_sampler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_env(
        monkeypatch, OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.25"
    )
    with setup(set_global=False) as configured:
        assert configured.tracer_provider is not None
        sampler = configured.tracer_provider.sampler
        assert "0.25" in sampler.get_description()


def test_a_disabled_sdk_configures_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, OTEL_SDK_DISABLED="true", OTEL_TRACES_EXPORTER="otlp")
    configured = setup(set_global=False)
    assert not configured.configured
    assert configured.tracer_provider is None
    configured.shutdown()


def test_with_no_exporter_asked_for_nothing_is_installed_globally(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_env(monkeypatch)
    with setup() as configured:
        assert not configured.configured
        assert configured.tracer_provider is None
        assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_TRACES_EXPORTER", "jaeger"),
        ("OTEL_METRICS_EXPORTER", "prometheus"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "thrift"),
    ],
)
def test_an_unusable_variable_is_a_configuration_error_naming_it(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_env(monkeypatch, **{"OTEL_TRACES_EXPORTER": "otlp", variable: value})
    with pytest.raises(ConfigurationError) as caught:
        setup(set_global=False)
    assert caught.value.field == variable
    assert value in caught.value.problem


async def test_prompts_and_completions_are_captured_only_when_asked_and_truncated(
    monkeypatch: pytest.MonkeyPatch,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    long_goal = "map the market " + "x" * (2 * CONTENT_LIMIT)
    run_spec = spec(chain(1)).model_copy(update={"goal": long_goal})
    await run_traced(scripted(), run_spec, provider)
    chats = [
        s
        for s in Tree(exporter.get_finished_spans()).spans
        if s.name.startswith("chat ")
    ]
    assert chats
    for chat in chats:
        prompt = attr(chat, n.GEN_AI_INPUT_MESSAGES)
        assert "map the market" in prompt
        assert len(prompt) <= CONTENT_LIMIT
        # Shortened inside its texts: still the conventions' JSON array.
        (message,) = json.loads(prompt)
        assert message["parts"][0]["content"].endswith("…")
        assert attr(chat, n.GEN_AI_OUTPUT_MESSAGES)


def test_setup_leaves_a_provider_the_application_set_alone() -> None:
    done = run_python(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from replan.telemetry import setup

        mine = TracerProvider()
        trace.set_tracer_provider(mine)
        configured = setup()
        assert not configured.configured, configured
        assert trace.get_tracer_provider() is mine
        print("left alone")
        """,
        OTEL_TRACES_EXPORTER="console",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "left alone"


def test_an_application_that_calls_setup_gets_its_runs_traced_globally() -> None:
    done = run_python(
        """
        import anyio
        from replan import MemoryStore, RunSpec, ScriptedModel, Supervisor, TaskDraft
        from replan import Synthesis, TaskOutcome, Verdict
        from replan.telemetry import setup

        def answer(request):
            if request.purpose == "execute":
                return TaskOutcome(success=True, summary="done")
            if request.purpose == "synthesize":
                return Synthesis(output="all done")
            return Verdict(decision="continue")

        async def main():
            async with Supervisor(ScriptedModel(answer), MemoryStore()) as sup:
                spec = RunSpec(goal="g", tasks=[TaskDraft(key="a", description="a")])
                handle = await sup.submit(spec)
                print("status", (await handle.result()).status.value)

        with setup():
            anyio.run(main)
        """,
        OTEL_TRACES_EXPORTER="console",
        OTEL_METRICS_EXPORTER="none",
    )
    assert done.returncode == 0, done.stderr
    assert "status completed" in done.stdout
    assert '"name": "invoke_workflow replan"' in done.stdout
    assert '"name": "invoke_agent executor"' in done.stdout
    assert '"service.name": "replan"' in done.stdout


def test_the_demo_prints_its_spans_on_stderr_when_asked() -> None:
    asked = run_python(
        "from replan.cli import main; raise SystemExit(main(['demo', '--yes']))",
        OTEL_TRACES_EXPORTER="console",
    )
    assert asked.returncode == 0, asked.stderr
    assert '"name": "invoke_workflow replan"' in asked.stderr
    assert '"replan.outcome": "applied"' in asked.stderr
    assert '"name"' not in asked.stdout
    quiet = run_python(
        "from replan.cli import main; raise SystemExit(main(['demo', '--yes']))"
    )
    assert quiet.returncode == 0, quiet.stderr
    assert '"name"' not in quiet.stderr
    # The same demo either way: spans do not change what it prints.
    assert len(quiet.stdout.splitlines()) == len(asked.stdout.splitlines())


def test_a_bad_exporter_variable_is_one_cli_error_line() -> None:
    done = run_python(
        "from replan.cli import main; raise SystemExit(main(['demo', '--yes']))",
        OTEL_TRACES_EXPORTER="zipkin",
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "replan: error: OTEL_TRACES_EXPORTER: "
        "'zipkin' is not one of otlp, console, none"
    ]


def test_a_collector_that_is_down_holds_the_cli_s_exit_only_briefly() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port now. The SDK would retry each signal for
    # a minute; the command waits TELEMETRY_FLUSH_S, then says why it ends.
    done = run_python(
        "from replan.cli import main; raise SystemExit(main(['demo', '--yes']))",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_TIMEOUT="60",
    )
    assert done.returncode == 0, done.stderr
    assert "run finished: completed" in done.stdout
    assert (
        "replan: telemetry not sent within 3s (is the OTLP collector running?)"
        in done.stderr
    )
    assert "Traceback" not in done.stderr


class _StuckExporter(SpanExporter):
    """An exporter whose export waits until the test lets it go."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.exported: list[str] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait()
        self.exported.extend(span.name for span in spans)
        return SpanExportResult.SUCCESS


def test_shutdown_stops_waiting_after_its_timeout_and_the_flush_goes_on() -> None:
    exporter = _StuckExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    configured = TelemetrySetup(configured=True, tracer_provider=provider)
    provider.get_tracer("test").start_span("kept").end()

    assert configured.shutdown(timeout_s=0.2) is False
    assert exporter.exported == []
    assert configured.tracer_provider is None
    assert configured.shutdown(timeout_s=0.2) is True  # nothing left to stop
    exporter.release.set()
    [flush] = [t for t in threading.enumerate() if t.name == "replan-telemetry-flush"]
    flush.join(10)
    assert exporter.exported == ["kept"]
