"""The OpenAI client's own instrumentation nests under the actor spans, once.

A real ``AsyncOpenAI`` client talks to an OpenAI-compatible server on
127.0.0.1 (a thread), instrumented by opentelemetry-instrumentation-genai-openai.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from openai import AsyncOpenAI
from opentelemetry.instrumentation.genai.openai import OpenAIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind
from scripts import chain, spec
from spans import Tree, attr, run_traced

from replan import ModelRequest, ModelResponse, Synthesis, TaskOutcome, TokenUsage
from replan.llm import OpenAIModel
from replan.telemetry import _names as n
from replan.telemetry import openai_instrumented


@pytest.fixture
def server() -> Iterator[str]:
    """Answers every chat completion with the output its last message asks for."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            wanted = body["messages"][-1]["content"]
            content = (
                Synthesis(output="the synthesis")
                if wanted == "Synthesis"
                else TaskOutcome(success=True, summary="done")
            ).model_dump_json()
            reply = json.dumps(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": content},
                        }
                    ],
                    "usage": {
                        "prompt_tokens": 12,
                        "completion_tokens": 5,
                        "total_tokens": 17,
                    },
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


class OpenAIChat:
    """A minimal adapter over the real client, instrumented by the extra."""

    provider_name = "openai"
    otel_instrumented = True

    def __init__(self, base_url: str) -> None:
        self.client = AsyncOpenAI(base_url=base_url, api_key="test", max_retries=0)

    def model_for(self, role: str) -> str:
        return "tiny-model"

    async def generate(self, request: ModelRequest) -> ModelResponse:
        completion = await self.client.chat.completions.create(
            model=self.model_for(request.role),
            messages=[{"role": "user", "content": request.output_type.__name__}],
        )
        usage = completion.usage
        assert usage is not None
        return ModelResponse(
            output=request.output_type.model_validate_json(
                completion.choices[0].message.content or ""
            ),
            usage=TokenUsage(
                input_tokens=usage.prompt_tokens,
                output_tokens=usage.completion_tokens,
                calls=1,
            ),
            model=completion.model,
        )


@pytest.fixture
def instrumented(provider: TracerProvider) -> Iterator[None]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    yield
    instrumentor.uninstrument()


@pytest.mark.usefixtures("instrumented")
async def test_openai_client_spans_nest_under_actor_spans_and_count_tokens_once(
    server: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    assert openai_instrumented()
    model = OpenAIChat(server)
    try:
        result = await run_traced(model, spec(chain(2)), provider)  # type: ignore[arg-type]
    finally:
        await model.client.close()
    tree = Tree(exporter.get_finished_spans())
    chats = [s for s in tree.spans if s.name.startswith(n.SPAN_CHAT_PREFIX)]
    # Two tasks and the synthesis: three calls, each one span, from the client.
    assert len(chats) == 3
    for chat in chats:
        assert chat.kind is SpanKind.CLIENT
        assert chat.instrumentation_scope is not None
        assert chat.instrumentation_scope.name != "replan"
        assert attr(chat, n.GEN_AI_REQUEST_MODEL) == "tiny-model"
        actor = tree.parent(chat)
        assert actor is not None
        assert actor.name == "invoke_agent executor"
    counted = sum(
        int((s.attributes or {}).get(n.GEN_AI_USAGE_INPUT_TOKENS, 0))
        for s in tree.spans
    )
    assert counted == result.usage.total.input_tokens == 3 * 12


async def test_the_openai_adapter_leaves_its_calls_to_an_active_instrumentation(
    server: str, provider: TracerProvider
) -> None:
    model = OpenAIModel("tiny-model", base_url=server)
    try:
        assert not model.otel_instrumented
        instrumentor = OpenAIInstrumentor()
        instrumentor.instrument(tracer_provider=provider)
        try:
            assert model.otel_instrumented
        finally:
            instrumentor.uninstrument()
        assert not model.otel_instrumented
    finally:
        await model.aclose()
