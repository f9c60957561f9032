"""Captured content in the GenAI conventions' message form."""

from __future__ import annotations

import json

from hypothesis import assume, given
from hypothesis import strategies as st

from replan import TaskOutcome, ToolCall
from replan.llm import ModelResponse
from replan.telemetry._content import bounded_json, input_messages, output_messages
from replan.telemetry._telemetry import CONTENT_LIMIT


def test_chat_turns_become_roles_with_typed_parts() -> None:
    sent = [
        {"role": "system", "content": "You are the executor."},
        {"role": "user", "content": "Search the trade press."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "cells"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "fetch", "arguments": "not json"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "three makers"},
        {"role": "user", "content": [{"type": "text", "text": "and prices?"}]},
    ]

    assert json.loads(input_messages(sent)) == [
        {
            "role": "system",
            "parts": [{"type": "text", "content": "You are the executor."}],
        },
        {
            "role": "user",
            "parts": [{"type": "text", "content": "Search the trade press."}],
        },
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "c1",
                    "name": "search",
                    "arguments": {"q": "cells"},
                },
                # Arguments that are no JSON stay as the model wrote them.
                {
                    "type": "tool_call",
                    "id": "c2",
                    "name": "fetch",
                    "arguments": "not json",
                },
            ],
        },
        {
            "role": "tool",
            "parts": [
                {"type": "tool_call_response", "id": "c1", "response": "three makers"}
            ],
        },
        {"role": "user", "parts": [{"type": "text", "content": "and prices?"}]},
    ]


def test_a_structured_context_is_one_text_part_of_its_json() -> None:
    context = {"goal": "map the market", "attempt": 1}

    (message,) = json.loads(input_messages([{"role": "user", "content": context}]))

    (part,) = message["parts"]
    assert part["type"] == "text"
    assert json.loads(part["content"]) == context


def test_an_answer_is_a_stopped_assistant_turn_with_the_output_as_json() -> None:
    outcome = TaskOutcome(success=True, summary="found four makers")

    (message,) = json.loads(output_messages(ModelResponse(output=outcome)))

    assert message == {
        "role": "assistant",
        "parts": [{"type": "text", "content": outcome.model_dump_json()}],
        "finish_reason": "stop",
    }


def test_tool_calls_are_an_assistant_turn_that_stopped_for_them() -> None:
    response = ModelResponse(
        tool_calls=[ToolCall(id="c1", name="search", arguments='{"q": "x"}')]
    )

    (message,) = json.loads(output_messages(response))

    assert message["finish_reason"] == "tool_call"
    assert message["parts"] == [
        {"type": "tool_call", "id": "c1", "name": "search", "arguments": {"q": "x"}}
    ]


def test_too_long_content_is_shortened_inside_its_texts_and_stays_json() -> None:
    long = 'say "hi"\n' * CONTENT_LIMIT  # escapes make the JSON longer still
    messages = [
        {"role": "system", "content": "short and kept"},
        {"role": "user", "content": long},
        {"role": "tool", "tool_call_id": "c1", "content": "r" * CONTENT_LIMIT},
    ]

    recorded = input_messages(messages)

    assert len(recorded) <= CONTENT_LIMIT
    system, user, tool = json.loads(recorded)
    assert system["parts"][0]["content"] == "short and kept"
    assert user["parts"][0]["content"].startswith('say "hi"\n')
    assert user["parts"][0]["content"].endswith("…")
    assert tool["parts"][0]["response"].endswith("…")
    # The two long texts share the room left; neither is cut to nothing.
    assert len(user["parts"][0]["content"]) > 1000
    assert len(tool["parts"][0]["response"]) > 1000


@given(
    st.lists(
        st.tuples(st.sampled_from(["system", "user", "tool"]), st.text(max_size=3000)),
        max_size=6,
    ),
    st.integers(min_value=200, max_value=CONTENT_LIMIT),
)
def test_any_messages_fit_the_limit_as_json(
    turns: list[tuple[str, str]], limit: int
) -> None:
    messages = [
        {"role": role, "parts": [{"type": "text", "content": text}]}
        for role, text in turns
    ]
    # Texts can be shortened down to "…", no further: the rest must fit.
    skeleton = [
        {"role": role, "parts": [{"type": "text", "content": "…"}]} for role, _ in turns
    ]
    assume(len(json.dumps(skeleton, ensure_ascii=False)) <= limit)

    recorded = bounded_json(messages, limit=limit)

    assert len(recorded) <= limit
    assert len(json.loads(recorded)) == len(turns)


def test_an_array_too_long_without_its_texts_is_cut_as_a_string() -> None:
    messages = [{"role": "user", "parts": []} for _ in range(200)]

    recorded = bounded_json(messages, limit=100)

    assert len(recorded) == 100
    assert recorded.endswith("…")
