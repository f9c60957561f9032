"""The HTTP API's SERVER spans, from the real app in the test's own process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from inspect import iscoroutinefunction
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from in_process import serving
from opentelemetry import baggage, trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

from replan._demo import GOAL, demo_model
from replan.daemon import DaemonSettings, Token, create_app
from replan.daemon._service import Daemon
from replan.daemon._tracing import ServerSpans
from replan.messages import TraceStarted
from replan.telemetry import _guard

TOKEN = "server-spans-test-token"
NO_GATE = {"gate_on": []}
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
CLIENT_SPAN_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{CLIENT_SPAN_ID:016x}-01"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    yield memory
    memory.clear()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield tracer_provider
    tracer_provider.shutdown()


def make_daemon(
    tmp_path: Path, provider: TracerProvider | None = None, **settings: Any
) -> Daemon:
    return Daemon(
        settings=DaemonSettings(data_dir=tmp_path, **settings),
        token=Token(TOKEN),
        model=demo_model(),
        tracer_provider=provider,
    )


def server_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]


def only_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = server_spans(exporter)
    exporter.clear()
    return span


async def until(check: Any) -> Any:
    """Poll ``check`` until it returns something (the run gives no event
    to wait on)."""
    with anyio.fail_after(10):
        while True:
            found = await check() if iscoroutinefunction(check) else check()
            if found:
                return found
            await anyio.sleep(0.01)


async def test_a_request_gets_a_server_span_named_after_its_route(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with serving(make_daemon(tmp_path, provider)) as client:
        submitted = await client.post(
            "/v1/runs", json={"goal": GOAL, "gate_policy": NO_GATE}
        )
        run_id = submitted.json()["run_id"]
        exporter.clear()
        response = await client.get(
            f"/v1/runs/{run_id}",
            headers={
                "User-Agent": "ops-console/2",
                # A proxy's word for the client is not taken: the peer is.
                "X-Forwarded-For": "203.0.113.9",
                "Forwarded": "for=203.0.113.9;proto=https",
            },
        )
        assert response.status_code == 200
        span = only_span(exporter)
    assert span.kind is SpanKind.SERVER
    assert span.name == "GET /v1/runs/{run_id}"
    assert run_id not in span.name
    assert span.status.status_code is StatusCode.UNSET
    assert dict(span.attributes or {}) == {
        "http.request.method": "GET",
        "http.route": "/v1/runs/{run_id}",
        "url.path": f"/v1/runs/{run_id}",
        "url.scheme": "http",
        "server.address": "replan",
        "server.port": 80,
        "client.address": "127.0.0.1",
        "user_agent.original": "ops-console/2",
        "network.protocol.version": "1.1",
        "http.response.status_code": 200,
        "gen_ai.conversation.id": run_id,
    }
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "replan"


async def test_answers_before_and_without_a_route_are_traced_too(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    daemon = make_daemon(tmp_path, provider, max_body_bytes=1024)
    async with serving(daemon) as client:
        assert (await client.get("/v1/runs/no-such-run")).status_code == 404
        missing_run = only_span(exporter)
        assert (await client.get("/no/such/path")).status_code == 404
        no_route = only_span(exporter)
        refused = await client.post(
            "/v1/runs", json={"goal": GOAL}, headers={"Authorization": ""}
        )
        assert refused.status_code == 401
        unauthorized = only_span(exporter)
        wrong = await client.get(
            "/v1/runs", headers={"Authorization": "Bearer not-the-token"}
        )
        assert wrong.status_code == 403
        forbidden = only_span(exporter)
        large = await client.post("/v1/runs", content=b"x" * 2048)
        assert large.status_code == 413
        too_large = only_span(exporter)

    assert missing_run.name == "GET /v1/runs/{run_id}"
    assert (missing_run.attributes or {})["http.response.status_code"] == 404
    # Refused before routing: the method alone names the span.
    assert (no_route.name, unauthorized.name, too_large.name) == ("GET", "POST", "POST")
    assert forbidden.name == "GET"
    assert (forbidden.attributes or {})["http.response.status_code"] == 403
    assert "http.route" not in (unauthorized.attributes or {})
    assert (unauthorized.attributes or {})["url.path"] == "/v1/runs"
    assert (unauthorized.attributes or {})["http.response.status_code"] == 401
    assert (too_large.attributes or {})["http.response.status_code"] == 413
    # A client's error is not the server's.
    for span in (missing_run, no_route, unauthorized, forbidden, too_large):
        assert span.status.status_code is StatusCode.UNSET
        assert "error.type" not in (span.attributes or {})


async def test_the_query_string_is_not_recorded(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with serving(make_daemon(tmp_path, provider)) as client:
        listed = await client.get("/v1/runs?status=completed&limit=7")
        assert listed.status_code == 200
        span = only_span(exporter)
    attributes = dict(span.attributes or {})
    assert attributes["url.path"] == "/v1/runs"
    assert "url.query" not in attributes
    assert [k for k, v in attributes.items() if "limit=7" in str(v)] == []


async def test_a_client_trace_continues_into_the_daemon(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with serving(make_daemon(tmp_path, provider)) as client:
        response = await client.get("/v1/runs", headers={"traceparent": TRACEPARENT})
        assert response.status_code == 200
        span = only_span(exporter)
    assert span.name == "GET /v1/runs"
    assert span.context is not None
    assert span.context.trace_id == TRACE_ID
    assert span.parent is not None
    assert span.parent.span_id == CLIENT_SPAN_ID
    assert span.parent.is_remote


async def test_a_submitted_run_has_its_own_trace_linked_to_the_request(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with serving(make_daemon(tmp_path, provider)) as client:
        response = await client.post(
            "/v1/runs",
            json={"goal": GOAL, "gate_policy": NO_GATE},
            headers={"traceparent": TRACEPARENT},
        )
        assert response.status_code == 202

        def root() -> ReadableSpan | None:
            for span in exporter.get_finished_spans():
                if span.name == "invoke_workflow replan":
                    return span
            return None

        run_root = await until(root)
    (request,) = [s for s in server_spans(exporter) if s.name == "POST /v1/runs"]
    assert request.context is not None
    assert request.context.trace_id == TRACE_ID
    assert run_root.context.trace_id != TRACE_ID  # one trace per run
    assert run_root.parent is None
    (link,) = run_root.links
    assert link.context.span_id == request.context.span_id
    assert (link.attributes or {})["replan.link"] == "submitted_by"


class BaggageOnSpans(SpanProcessor):
    """What an application adds to copy W3C baggage onto every span (as
    ``opentelemetry-processor-baggage`` does): the baggage of the context
    the span starts in becomes its attributes."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        span.set_attributes(
            {k: str(v) for k, v in baggage.get_all(parent_context).items()}
        )


async def test_the_baggage_a_request_sends_reaches_the_run_it_submits(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    provider.add_span_processor(BaggageOnSpans())
    async with serving(make_daemon(tmp_path, provider)) as client:
        response = await client.post(
            "/v1/runs",
            json={"goal": GOAL, "gate_policy": NO_GATE},
            headers={"traceparent": TRACEPARENT, "baggage": "tenant.id=acme"},
        )
        assert response.status_code == 202

        def root() -> ReadableSpan | None:
            for span in exporter.get_finished_spans():
                if span.name == "invoke_workflow replan":
                    return span
            return None

        run_root = await until(root)
    assert run_root.context is not None
    run_spans = [
        s
        for s in exporter.get_finished_spans()
        if s.context is not None and s.context.trace_id == run_root.context.trace_id
    ]
    assert {s.name for s in run_spans} >= {
        "invoke_workflow replan",
        "plan planner",
        "invoke_agent executor",
        "invoke_agent reviewer",
    }
    without = [
        s.name for s in run_spans if (s.attributes or {}).get("tenant.id") != "acme"
    ]
    assert without == []
    (request,) = [s for s in server_spans(exporter) if s.name == "POST /v1/runs"]
    assert (request.attributes or {})["tenant.id"] == "acme"


async def test_requests_about_a_run_name_it_on_their_span(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """So that searching Jaeger for a run's id also finds who submitted it,
    read it, answered its gates and cancelled it."""
    async with serving(make_daemon(tmp_path, provider)) as client:
        submitted = await client.post("/v1/runs", json={"goal": GOAL})
        assert submitted.status_code == 202
        run_id = submitted.json()["run_id"]
        submit = only_span(exporter)

        async def gate() -> str | None:
            gates = (await client.get("/v1/gates")).json()["gates"]
            return str(gates[0]["gate_id"]) if gates else None

        gate_id = await until(gate)
        exporter.clear()
        answered = await client.post(
            f"/v1/gates/{gate_id}", json={"decision": "approve", "by": "ana"}
        )
        assert answered.status_code == 200
        answer = only_span(exporter)
        assert (await client.get(f"/v1/runs/{run_id}")).status_code == 200
        read = only_span(exporter)
        assert (await client.get("/v1/runs")).status_code == 200
        listed = only_span(exporter)
    for span in (submit, answer, read):
        assert (span.attributes or {})["gen_ai.conversation.id"] == run_id, span.name
    assert "gen_ai.conversation.id" not in (listed.attributes or {})


async def test_the_event_stream_span_ends_while_the_stream_is_still_open(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    daemon = make_daemon(tmp_path, provider)
    async with serving(daemon) as client:
        # The demo's run waits at a gate for a person: its stream stays open.
        submitted = await client.post("/v1/runs", json={"goal": GOAL})
        run_id = submitted.json()["run_id"]
        exporter.clear()
        app = create_app(daemon)
        sent: list[dict[str, Any]] = []
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": f"/v1/runs/{run_id}/events",
            "raw_path": f"/v1/runs/{run_id}/events".encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"host", b"replan"),
                (b"authorization", f"Bearer {TOKEN}".encode()),
            ],
            "client": ("127.0.0.1", 50000),
            "server": ("replan", 80),
        }
        disconnected = anyio.Event()

        async def receive() -> dict[str, Any]:
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async with anyio.create_task_group() as tg:
            finished = anyio.Event()

            async def stream() -> None:
                await app(scope, receive, send)
                finished.set()

            tg.start_soon(stream)
            await until(lambda: any(m.get("body") for m in sent))
            span = only_span(exporter)
            assert not finished.is_set()  # the stream is still open
            disconnected.set()
    assert sent[0]["status"] == 200
    assert span.name == "GET /v1/runs/{run_id}/events"
    assert (span.attributes or {})["replan.http.streaming"] is True
    assert (span.attributes or {})["http.response.status_code"] == 200


async def test_an_unexpected_error_is_an_error_span(
    tmp_path: Path,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    daemon = make_daemon(tmp_path, provider)

    async def broken(**_: Any) -> None:
        raise RuntimeError("the disk caught fire")

    async with daemon.running(), client_of(daemon) as client:
        monkeypatch.setattr(daemon.store, "list_runs", broken)
        response = await client.get("/v1/runs")
        assert response.status_code == 500
        span = only_span(exporter)
    assert span.name == "GET /v1/runs"
    assert span.status.status_code is StatusCode.ERROR
    attributes = span.attributes or {}
    assert attributes["http.response.status_code"] == 500
    assert attributes["error.type"] == "RuntimeError"
    assert [e.name for e in span.events] == ["exception"]


async def test_a_5xx_answer_is_an_error_span_without_an_exception(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    daemon = make_daemon(tmp_path, provider)
    async with client_of(daemon) as client:  # not started: not ready
        response = await client.get("/readyz")
        assert response.status_code == 503
        span = only_span(exporter)
    assert span.name == "GET /readyz"
    assert span.status.status_code is StatusCode.ERROR
    attributes = span.attributes or {}
    assert attributes["http.response.status_code"] == 503
    assert attributes["error.type"] == "503"
    assert span.events == ()


async def test_a_request_cut_off_before_its_answer_is_an_error_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async def never_answers(scope: Any, receive: Any, send: Any) -> None:
        await anyio.sleep_forever()

    app = ServerSpans(never_answers, provider)
    scope = {
        "type": "http",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/runs",
        "query_string": b"",
        "headers": [(b"host", b"replan")],
        "client": ("127.0.0.1", 50000),
        "server": ("replan", 80),
    }

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError("nothing is sent")

    with anyio.move_on_after(0.05) as scope_:
        await app(scope, receive, send)
    assert scope_.cancelled_caught
    span = only_span(exporter)
    assert span.status.status_code is StatusCode.ERROR
    attributes = span.attributes or {}
    assert "http.response.status_code" not in attributes
    assert "Cancel" in str(attributes["error.type"])


class Raising(SpanProcessor):
    """An application's buggy processor: raises as every span starts, or ends."""

    def __init__(self, when: str) -> None:
        self.when = when

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self.when == "start":
            raise RuntimeError("exporter bug on start")

    def on_end(self, span: ReadableSpan) -> None:
        if self.when == "end":
            raise RuntimeError("exporter bug on end")


@pytest.mark.parametrize("when", ["start", "end"])
async def test_a_failing_span_processor_fails_no_request(
    when: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(_guard, "_logged", set())
    buggy = TracerProvider()
    buggy.add_span_processor(Raising(when))
    try:
        with caplog.at_level(logging.ERROR, logger="replan.telemetry"):
            async with serving(make_daemon(tmp_path, buggy)) as client:
                assert (await client.get("/v1/runs")).status_code == 200
                assert (await client.get("/healthz")).status_code == 200
    finally:
        buggy.shutdown()
    assert any("OpenTelemetry" in r.getMessage() for r in caplog.records)


async def test_nothing_is_traced_without_a_tracer_provider(tmp_path: Path) -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    daemon = make_daemon(tmp_path)
    async with serving(daemon) as client:
        response = await client.post(
            "/v1/runs",
            json={"goal": GOAL, "gate_policy": NO_GATE},
            headers={"traceparent": TRACEPARENT},
        )
        assert response.status_code == 202
        run_id = response.json()["run_id"]

        async def ended() -> bool:
            view = (await client.get(f"/v1/runs/{run_id}")).json()
            return bool(view["status"] == "completed")

        await until(ended)
        events = await daemon.store.read(run_id)
    # The run was not traced: no trace segment was journaled.
    assert not [e for e in events if isinstance(e, TraceStarted)]


GLOBAL_PROVIDER = """
    import json, sys
    import anyio, httpx
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )
    from replan._demo import demo_model
    from replan.daemon import Daemon, DaemonSettings, Token, create_app

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    async def main() -> None:
        daemon = Daemon(
            settings=DaemonSettings(data_dir=sys.argv[1]),
            token=Token("global-provider-token-0"),
            model=demo_model(),
        )
        transport = httpx.ASGITransport(app=create_app(daemon))
        async with daemon.running(), httpx.AsyncClient(
            transport=transport, base_url="http://replan"
        ) as client:
            auth = {"Authorization": "Bearer global-provider-token-0"}
            await client.get("/v1/runs", headers=auth)
            await client.get("/v1/runs")

    anyio.run(main)
    print(json.dumps([
        [s.name, s.instrumentation_scope.name]
        for s in exporter.get_finished_spans()
        if s.kind is trace.SpanKind.SERVER
    ]))
"""


def test_with_a_global_provider_each_request_has_one_server_span(
    tmp_path: Path,
) -> None:
    """The web framework's own request spans (FastAPI's native telemetry,
    where it has it) would be a second SERVER span per request."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(GLOBAL_PROVIDER), str(tmp_path)],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    spans = json.loads(done.stdout)
    assert spans == [["GET /v1/runs", "replan"], ["GET", "replan"]]


@asynccontextmanager
async def client_of(daemon: Daemon) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app that gets the 500 the server would send, where
    the ``serving`` helper's client raises the app's exception."""
    transport = httpx.ASGITransport(app=create_app(daemon), raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://replan",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as client:
        yield client
