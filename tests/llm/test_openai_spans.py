"""What a traced OpenAIModel call records when content capture is on."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from chat_server import Logged, Reply, answer_type, chat_server, completion
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from replan import (
    MemoryStore,
    ModelRequest,
    RunResult,
    RunSpec,
    ScriptedModel,
    Supervisor,
    Synthesis,
    TaskDraft,
    TaskOutcome,
)
from replan.llm import OpenAIModel
from replan.telemetry import _names as n

SPEC = RunSpec(
    goal="Find which battery makers ship solid-state cells",
    tasks=[TaskDraft(key="search", description="search the trade press")],
)


@pytest.fixture
def traced(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[TracerProvider, InMemorySpanExporter]:
    """A tracer provider keeping its spans, with content capture on."""
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def answer(logged: Logged) -> Reply:
    if answer_type(logged) == "Synthesis":
        return completion(Synthesis(output="the answer"))
    return completion(TaskOutcome(success=True, summary="found four makers"))


async def run_against(
    script: Callable[[Logged], Reply], provider: TracerProvider
) -> tuple[RunResult, list[list[dict[str, Any]]]]:
    """Run SPEC on an OpenAIModel answered by ``script``: the result, and the
    messages of each request the endpoint was sent."""
    with chat_server(script) as server:
        model = OpenAIModel("gpt-test", base_url=server.base_url, max_retries=0)
        async with (
            model,
            Supervisor(model, MemoryStore(), tracer_provider=provider) as sup,
        ):
            with anyio.fail_after(30):
                result = await (await sup.submit(SPEC)).result()
        sent = [logged.messages for logged in server.chat_requests()]
    return result, sent


async def test_captured_prompts_are_the_messages_the_endpoint_was_sent(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    result, sent = await run_against(answer, provider)
    assert result.status == "completed"
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    assert len(chats) == len(sent) == 2  # the task and the synthesis
    for chat in chats:
        captured = json.loads(str((chat.attributes or {})[n.GEN_AI_INPUT_MESSAGES]))
        # The rendered prompt (system and user turns), not the raw context,
        # each turn one text part, as the GenAI conventions lay messages out.
        assert [m["role"] for m in captured] == ["system", "user"]
        assert all([p["type"] for p in m["parts"]] == ["text"] for m in captured)
        system, user = (m["parts"][0]["content"] for m in captured)
        # Sent as captured, bar the format instruction ending the system turn.
        assert any(
            user == messages[1]["content"] and messages[0]["content"].startswith(system)
            for messages in sent
        )
        output = json.loads(str((chat.attributes or {})[n.GEN_AI_OUTPUT_MESSAGES]))
        assert output[0]["role"] == "assistant"
        assert output[0]["finish_reason"] == "stop"
        answers = (
            Synthesis(output="the answer"),
            TaskOutcome(success=True, summary="found four makers"),
        )
        assert output[0]["parts"][0]["content"] in [
            a.model_dump_json() for a in answers
        ]
    executor = next(
        s
        for s in chats
        if (s.attributes or {})[n.GEN_AI_AGENT_NAME] == "executor"
        and (s.attributes or {})[n.PURPOSE] == "execute"
    )
    prompt = str((executor.attributes or {})[n.GEN_AI_INPUT_MESSAGES])
    assert "You are the executor of a supervised agent" in prompt
    assert "search the trade press" in prompt


async def test_a_model_that_takes_no_temperature_shows_the_one_replan_would_send(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced

    def no_temperature(logged: Logged) -> Reply:
        if "temperature" not in logged.body:
            return answer(logged)
        problem = {
            "message": "Unsupported value: 'temperature' does not support 0.7",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "unsupported_value",
        }
        return Reply(status=400, body={"error": problem})

    with chat_server(no_temperature) as server:
        model = OpenAIModel(
            "gpt-test",
            base_url=server.base_url,
            max_retries=0,
            temperatures={"executor": 0.7},
        )
        async with (
            model,
            Supervisor(model, MemoryStore(), tracer_provider=provider) as sup,
        ):
            with anyio.fail_after(30):
                result = await (await sup.submit(SPEC)).result()
        sent = [logged.body for logged in server.chat_requests()]
    assert result.status == "completed"
    assert ["temperature" in body for body in sent] == [True, False, False]
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    temperatures = {
        (s.attributes or {})[n.PURPOSE]: (s.attributes or {})[
            n.GEN_AI_REQUEST_TEMPERATURE
        ]
        for s in chats
    }
    assert temperatures == {"execute": 0.7, "synthesize": 0.7}  # executor calls


class UnrenderableModel(ScriptedModel):
    """A model whose prompt cannot be rendered for telemetry."""

    def prompt_messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        raise KeyError("no template")


async def test_a_prompt_that_cannot_be_rendered_is_captured_as_the_context(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    model = UnrenderableModel(
        lambda r: (
            TaskOutcome(success=True, summary="done")
            if r.purpose == "execute"
            else Synthesis(output="the answer")
        )
    )
    async with Supervisor(model, MemoryStore(), tracer_provider=provider) as sup:
        with anyio.fail_after(10):
            result = await (await sup.submit(SPEC)).result()
    assert result.status == "completed"
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    assert len(chats) == 2
    for chat in chats:
        captured = json.loads(str((chat.attributes or {})[n.GEN_AI_INPUT_MESSAGES]))
        assert captured[0]["role"] == "user"
        # The structured context, as the JSON text of one text part.
        (part,) = captured[0]["parts"]
        assert part["type"] == "text"
        assert json.loads(part["content"])["goal"] == SPEC.goal


async def test_a_reasked_answer_is_captured_with_the_turns_it_replied_to(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    # The task's first answer does not validate; the chat span of that call
    # shows the prompt, the invalid answer and the re-ask, then the answer.
    def invalid_once(logged: Logged) -> Reply:
        if answer_type(logged) == "TaskOutcome" and len(logged.messages) == 2:
            return completion({"succeeded": "maybe"})
        return answer(logged)

    provider, exporter = traced
    result, sent = await run_against(invalid_once, provider)
    assert result.status == "completed"
    assert [len(messages) for messages in sent] == [2, 4, 2]
    reasked = sent[1]
    [executor] = [
        s
        for s in exporter.get_finished_spans()
        if s.name.startswith("chat ") and (s.attributes or {})[n.PURPOSE] == "execute"
    ]
    attributes = executor.attributes or {}
    captured = json.loads(str(attributes[n.GEN_AI_INPUT_MESSAGES]))
    assert [m["role"] for m in captured] == ["system", "user", "assistant", "user"]
    assert [m["parts"][0]["content"] for m in captured[2:]] == [
        m["content"] for m in reasked[2:]
    ]
    assert "succeeded" in captured[2]["parts"][0]["content"]
    assert "could not be used" in captured[3]["parts"][0]["content"]
    output = json.loads(str(attributes[n.GEN_AI_OUTPUT_MESSAGES]))
    assert json.loads(output[0]["parts"][0]["content"])["summary"] == (
        "found four makers"
    )
    # A first answer that validates adds no turns.
    [synthesis] = [
        s
        for s in exporter.get_finished_spans()
        if s.name.startswith("chat ")
        and (s.attributes or {})[n.PURPOSE] == "synthesize"
    ]
    synthesis_input = json.loads(
        str((synthesis.attributes or {})[n.GEN_AI_INPUT_MESSAGES])
    )
    assert len(synthesis_input) == 2
