"""End to end: spans leave through the real OTLP exporters (HTTP and gRPC).

A receiver on 127.0.0.1, in a thread (so the test runs on both anyio
backends), decodes each ``ExportTraceServiceRequest`` with opentelemetry-proto.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from processes import run_python
from scripts import (
    chain,
    first_then_continue,
    replan_verdict,
    scripted,
    spec,
    with_finding,
)
from spans import run_traced

from replan import TokenUsage
from replan.telemetry import _names as n
from replan.telemetry import setup

Request = trace_service_pb2.ExportTraceServiceRequest


@contextmanager
def http_receiver(
    paths: list[str] | None = None,
) -> Iterator[tuple[str, list[Request]]]:
    """The receiver's URL and the trace requests it decoded; the path of
    every request (``/v1/traces``, ``/v1/metrics``) goes to ``paths``."""
    received: list[Request] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if paths is not None:
                paths.append(self.path)
            if self.path == "/v1/traces":
                assert self.headers["Content-Type"] == "application/x-protobuf"
                received.append(Request.FromString(body))
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def grpc_receiver() -> Iterator[tuple[str, list[Request]]]:
    received: list[Request] = []

    class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Request, context: Any) -> Any:
            received.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    with ThreadPoolExecutor(max_workers=2) as pool:
        server = grpc.server(pool)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
            TraceService(), server
        )
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            yield f"http://127.0.0.1:{port}", received
        finally:
            server.stop(None).wait(5)


def value_of(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


def span_names(received: list[Request]) -> set[str]:
    return {
        span.name
        for request in received
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    }


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
async def test_the_replan_span_reaches_an_otlp_receiver_with_its_attributes(
    protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = http_receiver if protocol == "http/protobuf" else grpc_receiver
    with receiver() as (endpoint, received):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "replan-wire-test")
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
        configured = setup(set_global=False)
        assert configured.exporters == {"traces": ["otlp"], "metrics": []}
        assert configured.tracer_provider is not None
        model = scripted(
            execute=with_finding,
            milestone=first_then_continue(replan_verdict()),
            usage=TokenUsage(input_tokens=10, output_tokens=4, calls=1),
        )
        result = await run_traced(
            model, spec(chain(3, milestone_at=[1])), configured.tracer_provider
        )
        # Shutting down flushes the batch (a blocking call: off the loop).
        await anyio.to_thread.run_sync(configured.shutdown)

    assert received
    spans: dict[str, list[Any]] = {}
    for request in received:
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            assert resource["service.name"] == "replan-wire-test"
            for scope_spans in resource_spans.scope_spans:
                assert scope_spans.scope.name == "replan"
                for span in scope_spans.spans:
                    spans.setdefault(span.name, []).append(span)
    (replan,) = spans[n.SPAN_REPLAN]
    found = attributes(replan.attributes)
    assert found[n.GEN_AI_CONVERSATION_ID] == result.run_id
    assert found[n.REPLAN_OUTCOME] == "applied"
    assert found[n.REPLAN_TRIGGER] == "contradiction"
    assert found[n.REPLAN_VERSION] == 2
    assert found[n.REPLAN_TASKS_REMOVED] == ["t2", "t3"]
    assert found[n.REPLAN_TASKS_ADDED] == ["t4", "t5"]
    assert found[n.REPLAN_TASKS_PRESERVED] == ["t1"]
    assert found[n.REPLAN_REPLANS_REMAINING] == 2
    assert found[n.REPLAN_USAGE_INPUT_TOKENS] == 20
    assert found[n.REPLAN_RATIONALE] == "a finding contradicts the plan"
    (root,) = spans[n.SPAN_RUN]
    assert replan.parent_span_id == root.span_id
    assert replan.trace_id == root.trace_id
    assert attributes(root.attributes)[n.RUN_OUTCOME] == "completed"


def test_a_command_sends_its_traces_to_the_traces_endpoint_alone() -> None:
    # Jaeger takes traces and no metrics: an operator points the traces
    # alone at it, with the signal's own endpoint variable.
    paths: list[str] = []
    with http_receiver(paths) as (url, received):
        done = run_python(
            "from replan.cli import main; raise SystemExit(main(['demo', '--yes']))",
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{url}/v1/traces",
        )
    assert done.returncode == 0, done.stderr
    names = span_names(received)
    assert {n.SPAN_RUN, n.SPAN_REPLAN} <= names
    # Metrics have no endpoint of their own, nor a common one: not sent.
    assert set(paths) == {"/v1/traces"}


def test_a_command_sends_traces_and_metrics_to_the_common_endpoint() -> None:
    paths: list[str] = []
    with http_receiver(paths) as (url, received):
        done = run_python(
            "from replan.cli import main; raise SystemExit(main(['demo', '--yes']))",
            OTEL_EXPORTER_OTLP_ENDPOINT=url,
        )
    assert done.returncode == 0, done.stderr
    assert set(paths) == {"/v1/traces", "/v1/metrics"}
    assert received


def test_an_application_that_exits_without_shutdown_still_sends_its_spans() -> None:
    with http_receiver() as (url, received):
        done = run_python(
            """
            from opentelemetry import trace
            from replan.telemetry import setup

            setup()
            trace.get_tracer("app").start_span("buffered").end()
            """,
            OTEL_EXPORTER_OTLP_ENDPOINT=url,
            OTEL_METRICS_EXPORTER="none",
        )
    assert done.returncode == 0, done.stderr
    names = span_names(received)
    assert names == {"buffered"}
