"""A SERVER span for each request to the HTTP API.

One span per request, named ``{method} {route}`` after the route template
(``GET /v1/runs/{run_id}``, never the path with its ids), with the
OpenTelemetry HTTP server attributes, and ``gen_ai.conversation.id`` on a
request about one run (its id or its gate's in the path, or the run
``POST /v1/runs`` started), as on the run's own spans. The span continues
the trace the client sent (``traceparent``, read by the application's
propagator), and is current while the request is answered, with the
client's W3C ``baggage``: a run submitted by ``POST /v1/runs`` has its own
trace, whose root links to this span (``replan.link`` = ``submitted_by``),
and the request's baggage is current in every span of it (until a restart).

A request answered before it is routed (401 or 403 without the right token,
413 for a body too large, 404 for no route) has no route: its span is named
after the method alone, as the conventions say, and ``url.path`` tells
which path it was.

An event stream (``text/event-stream``, ``GET /v1/runs/{run_id}/events``)
may stay open for as long as its run lasts: its span ends as soon as the
response's headers are sent, with ``replan.http.streaming`` set. It covers
the request up to the first byte of the stream, not the stream itself.

Status is ERROR only for a 5xx answer, an exception, or a request cut off
before any answer (``error.type`` names the cancellation's class); 4xx
answers are the client's errors, not the server's. ``url.query`` is not
recorded (a token pasted into a query by mistake stays out of the trace),
nor proxy headers: ``client.address`` is the peer the server saw.

FastAPI releases with native OpenTelemetry support make a SERVER span of
their own for each request, with the global provider: the daemon's app
turns it off (:func:`without_framework_spans`), so that each request has
one span, this one, which follows the rules above.
"""

from __future__ import annotations

import inspect
from typing import Any

from fastapi import FastAPI
from opentelemetry import context, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._version import __version__
from ..telemetry import _names as n
from ..telemetry._guard import GuardedTracer, end
from ..telemetry._propagation import propagator

KNOWN_METHODS = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}
)
"""RFC 9110's methods and PATCH; any other is ``_OTHER``."""
_DEFAULT_PORTS = {"http": 80, "https": 443}


def without_framework_spans() -> dict[str, Any]:
    """``FastAPI()`` keyword arguments that turn off the framework's own
    request spans, where it makes them (its ``telemetry`` option); none for
    a release without. Its HTTP metrics stay as they are."""
    if "telemetry" in inspect.signature(FastAPI).parameters:
        return {"telemetry": {"tracing": False}}
    return {}


class ServerSpans:
    """ASGI middleware: one SERVER span per HTTP request.

    Args:
        app: the app it wraps.
        tracer_provider: where the spans go; the global provider when None
            (a no-op until the application or ``setup()`` installs one).
    """

    def __init__(self, app: ASGIApp, tracer_provider: TracerProvider | None) -> None:
        self.app = app
        # Guarded: an application's span processor that raises is logged,
        # never raised into a request.
        self.tracer = GuardedTracer(
            trace.get_tracer(n.LIBRARY, __version__, tracer_provider)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        parent = propagator().extract(headers)
        method = scope["method"]
        known = method if method in KNOWN_METHODS else "_OTHER"
        span = self.tracer.start_span(
            "HTTP" if known == "_OTHER" else known,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=_request_attributes(scope, headers, known),
        )
        # The client's context is current while the request is handled, its
        # baggage too: a run it submits carries that baggage on its spans.
        token = context.attach(trace.set_span_in_context(span, parent))
        try:
            if not span.is_recording():
                await self.app(scope, receive, send)
                return
            await self._traced(span, scope, receive, send)
        finally:
            context.detach(token)

    async def _traced(
        self, span: Span, scope: Scope, receive: Receive, send: Send
    ) -> None:
        status: int | None = None
        ended = False

        async def traced_send(message: Message) -> None:
            nonlocal status, ended
            if message["type"] == "http.response.start" and status is None:
                status = int(message["status"])
                _name_after_route(span, scope)
                _set_status(span, status)
                if _streams(message):
                    span.set_attribute(n.HTTP_STREAMING, True)
                    ended = True
                    end(span)
            await send(message)

        try:
            await self.app(scope, receive, traced_send)
        except Exception as exc:
            if not ended:
                _name_after_route(span, scope)
                span.record_exception(exc)
                span.set_attribute(n.ERROR_TYPE, _qualified_name(type(exc)))
                span.set_status(
                    Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
                )
                if status is None:
                    # Answered 500 by the server's error middleware, outside.
                    span.set_attribute(n.HTTP_RESPONSE_STATUS_CODE, 500)
            raise
        except BaseException as exc:
            if not ended and status is None:
                # Cut off before any answer (the server stopping, the task
                # cancelled): no status code says what happened, so this does.
                _name_after_route(span, scope)
                span.set_attribute(n.ERROR_TYPE, _qualified_name(type(exc)))
                span.set_status(
                    Status(StatusCode.ERROR, "cut off before an answer was sent")
                )
            raise
        finally:
            if not ended:
                _name_after_route(span, scope)
                end(span)


def _request_attributes(
    scope: Scope, headers: dict[str, str], method: str
) -> dict[str, AttributeValue]:
    """What is known as the request arrives (samplers may read it)."""
    scheme = str(scope.get("scheme", "http"))
    attrs: dict[str, AttributeValue] = {
        n.HTTP_REQUEST_METHOD: method,
        n.URL_PATH: str(scope.get("path", "")),
        n.URL_SCHEME: scheme,
    }
    if method != scope["method"]:
        attrs[n.HTTP_REQUEST_METHOD_ORIGINAL] = scope["method"]
    address = _server_address(headers.get("host"), scope, scheme)
    if address is not None:
        attrs[n.SERVER_ADDRESS], attrs[n.SERVER_PORT] = address
    client = scope.get("client")
    if client:
        attrs[n.CLIENT_ADDRESS] = str(client[0])
    agent = headers.get("user-agent")
    if agent:
        attrs[n.USER_AGENT_ORIGINAL] = agent
    version = scope.get("http_version")
    if version:
        attrs[n.NETWORK_PROTOCOL_VERSION] = str(version)
    return attrs


def _server_address(
    host: str | None, scope: Scope, scheme: str
) -> tuple[str, int] | None:
    """``server.address`` and ``server.port``: from the Host header, as the
    client named the server, else the socket the server listens on."""
    if host:
        name, sep, port = host.rpartition(":")
        if sep and port.isdigit() and (not name.startswith("[") or name.endswith("]")):
            return name.strip("[]"), int(port)
        return host.strip("[]"), _DEFAULT_PORTS.get(scheme, 80)
    server = scope.get("server")
    if server and server[1] is not None:
        return str(server[0]), int(server[1])
    return None


def _name_after_route(span: Span, scope: Scope) -> None:
    """Name the span ``{method} {route}`` once the router has matched one,
    and the run the request is about, as the run's own spans name it."""
    route = getattr(scope.get("route"), "path", None)
    if not isinstance(route, str) or not span.is_recording():
        return
    method = scope["method"]
    span.set_attribute(n.HTTP_ROUTE, route)
    span.update_name(f"{method if method in KNOWN_METHODS else 'HTTP'} {route}")
    run_id = _run_of(scope.get("path_params") or {})
    if run_id:
        span.set_attribute(n.GEN_AI_CONVERSATION_ID, run_id)


def _run_of(params: dict[str, Any]) -> str | None:
    """The run a path names: its id, or its gate's (``RUN_ID-gN``)."""
    run_id = params.get("run_id")
    if isinstance(run_id, str):
        return run_id
    gate_id = params.get("gate_id")
    if isinstance(gate_id, str):
        run_id, sep, number = gate_id.rpartition("-g")
        if sep and number.isdigit():
            return run_id
    return None


def _set_status(span: Span, status: int) -> None:
    span.set_attribute(n.HTTP_RESPONSE_STATUS_CODE, status)
    if status >= 500:
        # No description: the status code says it.
        span.set_attribute(n.ERROR_TYPE, str(status))
        span.set_status(Status(StatusCode.ERROR))


def _streams(message: Message) -> bool:
    for name, value in message.get("headers", []):
        if bytes(name).lower() == b"content-type":
            return bytes(value).lower().startswith(b"text/event-stream")
    return False


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name, for the propagator (repeated
    headers joined with commas, as HTTP allows)."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name = bytes(raw_name).decode("latin-1").lower()
        value = bytes(raw_value).decode("latin-1")
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return headers


def _qualified_name(cls: type[BaseException]) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
