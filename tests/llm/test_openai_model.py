"""OpenAIModel against a real Chat Completions server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import anyio.lowlevel
import openai
import pytest
from chat_server import Logged, Reply, chat_server, completion, error

from replan import (
    ConfigurationError,
    ModelRequest,
    PlanProposal,
    Supervisor,
    Task,
    TaskDraft,
    TaskOutcome,
    Verdict,
)
from replan._errors import (
    ModelAuthenticationError,
    ModelError,
    ModelOutputError,
    ModelRefusal,
    TransientModelError,
)
from replan.llm import MissingPromptError, ModelPrice, OpenAIModel, Tool
from replan.messages import ToolCall, ToolExchange, ToolResult

GOAL = "map the battery market"


def plan_request(**context: object) -> ModelRequest:
    return ModelRequest(
        role="planner",
        purpose="plan",
        output_type=PlanProposal,
        context={"goal": GOAL, "metadata": {}, **context},
    )


def execute_request(**fields: object) -> ModelRequest:
    task = Task(id="t1", key="search", description="search the news")
    return ModelRequest(
        role="executor",
        purpose="execute",
        output_type=TaskOutcome,
        temperature=0.4,
        context={"goal": GOAL, "task": task, "dependency_results": {}, "attempt": 1},
        **fields,
    )


def fast(server_url: str, **options: object) -> OpenAIModel:
    options = {"max_retries": 2, "backoff_s": 0.01, "max_backoff_s": 5.0, **options}
    return OpenAIModel("gpt-test", base_url=server_url, **options)  # type: ignore[arg-type]


async def test_a_structured_answer_is_parsed_into_the_requests_output_type() -> None:
    proposal = PlanProposal(
        tasks=[TaskDraft(key="search", description="search the news")],
        rationale="one search is enough",
    )
    with chat_server() as server:
        server.reply(completion(proposal, usage=(120, 30, 20)))
        async with OpenAIModel("gpt-test", base_url=server.base_url) as model:
            response = await model.generate(plan_request())
        [sent] = server.chat_requests()
    assert response.output == proposal
    assert response.prompt_version == "planner.plan@2"
    assert response.model == "test-model"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (120, 30)
    assert response.usage.cached_tokens == 20
    assert response.usage.calls == 1
    assert sent.body["model"] == "gpt-test"
    assert sent.body["temperature"] == 0
    schema = sent.body["response_format"]["json_schema"]
    assert schema["name"] == "PlanProposal"
    assert schema["strict"] is True
    assert "kind" not in schema["schema"]["properties"]
    assert sent.messages[0]["role"] == "system"
    assert GOAL in sent.text


async def test_a_schema_with_an_open_mapping_is_sent_without_strict_mode() -> None:
    from replan import Critique

    with chat_server() as server:
        server.reply(completion({"scores": {"goal_fit": 0.5}, "critique": "thin"}))
        async with fast(server.base_url) as model:
            response = await model.generate(
                ModelRequest(
                    role="reviewer",
                    purpose="critique",
                    output_type=Critique,
                    context={"goal": GOAL},
                )
            )
        [sent] = server.chat_requests()
    assert response.output == Critique(scores={"goal_fit": 0.5}, critique="thin")
    assert sent.body["response_format"]["json_schema"]["strict"] is False


async def test_rate_limit_with_retry_after_is_waited_out_then_succeeds() -> None:
    with chat_server() as server:
        server.reply(
            error(429, "slow down", retry_after="1"),
            completion(Verdict(decision="continue")),
        )
        async with fast(server.base_url) as model:
            started = time.monotonic()
            response = await model.generate(
                ModelRequest(role="reviewer", purpose="milestone", output_type=Verdict)
            )
            waited = time.monotonic() - started
        assert len(server.chat_requests()) == 2
    assert response.output == Verdict(decision="continue")
    assert waited >= 0.95


async def test_a_retry_after_longer_than_the_backoff_cap_gives_up_at_once() -> None:
    with chat_server() as server:
        server.reply(error(429, "come back tomorrow", retry_after="3600"))
        async with fast(server.base_url) as model:
            with pytest.raises(TransientModelError, match="3600s"):
                await model.generate(plan_request())
        assert len(server.chat_requests()) == 1


async def test_repeated_server_errors_surface_as_transient_after_the_retries() -> None:
    with chat_server(lambda _: error(500, "overloaded")) as server:
        async with fast(server.base_url, max_retries=2) as model:
            with pytest.raises(TransientModelError, match="HTTP 500") as caught:
                await model.generate(plan_request())
        assert len(server.chat_requests()) == 3
    assert "after 3 attempt(s)" in str(caught.value)


async def test_a_client_passed_in_makes_no_retries_of_its_own() -> None:
    with chat_server(lambda _: error(500, "overloaded")) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")
        model = OpenAIModel("gpt-test", client=client, max_retries=1, backoff_s=0.01)
        with pytest.raises(TransientModelError) as caught:
            await model.generate(plan_request())
        assert len(server.chat_requests()) == 2  # not 2 x 3: the client's own
        assert "after 2 attempt(s)" in str(caught.value)
        assert model.client is client
        assert client.max_retries == 2  # the caller's client is left as it was
        await model.aclose()
        assert not client.is_closed()
        await client.close()


async def test_a_supervisor_leaves_its_model_open_and_aclose_closes_it() -> None:
    with chat_server(lambda _: completion(PlanProposal())) as server:
        model = fast(server.base_url)
        async with Supervisor(model=model):
            await model.generate(plan_request())
        # The model was given: the supervisor's exit leaves it to its owner.
        assert not model.client.is_closed()
        assert (await model.generate(plan_request())).output == PlanProposal()
        await model.aclose()
        assert model.client.is_closed()
        assert len(server.chat_requests()) == 2


@pytest.mark.skipif(
    not hasattr(anyio.lowlevel, "current_token"), reason="anyio 4.11 tells loops apart"
)
def test_a_model_serves_each_event_loop_it_is_used_in_one_after_another() -> None:
    with chat_server(lambda _: completion(PlanProposal())) as server:
        model = fast(server.base_url)

        async def ask() -> None:
            async with model:  # its connections closed as each loop ends
                response = await model.generate(plan_request())
            assert response.output == PlanProposal()

        for backend in ("asyncio", "asyncio", "trio", "asyncio"):
            anyio.run(ask, backend=backend)
        assert len(server.chat_requests()) == 4


@contextmanager
def trickling_server(seconds_per_byte: float) -> Iterator[str]:
    """A server that answers every request one byte at a time: each wait
    for a byte is short, the whole answer long."""
    body = json.dumps(completion(PlanProposal()).body).encode()
    head = (
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    listener = socket.create_server(("127.0.0.1", 0))
    closing = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            while not closing.is_set():
                conn, _ = listener.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(head)
                    for byte in body:
                        if closing.wait(seconds_per_byte):
                            return
                        conn.sendall(bytes([byte]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        closing.set()
        listener.close()
        thread.join(5)


async def test_timeout_s_bounds_a_whole_request_not_each_wait_for_bytes() -> None:
    with trickling_server(seconds_per_byte=0.05) as url:
        async with fast(url, max_retries=0, timeout_s=0.5) as model:
            started = time.monotonic()
            with pytest.raises(TransientModelError, match="timed out"):
                await model.generate(plan_request())
            elapsed = time.monotonic() - started
    assert elapsed < 3  # the whole answer would take 20 s or more


async def test_a_timeout_is_retried_and_then_reported_transient() -> None:
    slow = Reply(**vars(completion(PlanProposal())))
    slow.delay_s = 3.0
    with chat_server(lambda _: slow) as server:
        async with fast(server.base_url, max_retries=1, timeout_s=0.3) as model:
            started = time.monotonic()
            with pytest.raises(TransientModelError, match="timed out"):
                await model.generate(plan_request())
            elapsed = time.monotonic() - started
        assert len(server.chat_requests()) == 2
    assert elapsed < 2.5


async def test_an_authentication_error_is_raised_after_one_request() -> None:
    with chat_server(lambda _: error(401, "Incorrect API key provided")) as server:
        async with fast(server.base_url, api_key="sk-wrong") as model:
            with pytest.raises(ModelAuthenticationError) as caught:
                await model.generate(plan_request())
        [sent] = server.chat_requests()
    assert sent.headers["authorization"] == "Bearer sk-wrong"
    assert "OPENAI_API_KEY" in str(caught.value)
    assert "Incorrect API key provided" in str(caught.value)


async def test_an_invalid_answer_is_asked_again_once_with_the_error_shown() -> None:
    good = TaskOutcome(success=True, summary="three surveys found")
    with chat_server() as server:
        server.reply(
            completion('{"success": "perhaps"}', usage=(100, 10, 0)),
            completion(good, usage=(150, 20, 0)),
        )
        async with fast(server.base_url) as model:
            response = await model.generate(execute_request())
        first, second = server.chat_requests()
    assert response.output == good
    assert response.usage.input_tokens == 250
    assert response.usage.calls == 2
    assert second.messages[-2] == {
        "role": "assistant",
        "content": '{"success": "perhaps"}',
    }
    assert "success" in second.messages[-1]["content"]
    assert "could not be used" in second.messages[-1]["content"]
    assert first.messages == second.messages[:-2]


async def test_a_plan_with_a_blank_task_is_asked_again_naming_the_task() -> None:
    blank = '{"tasks": [{"key": "search", "description": "  "}], "rationale": "r"}'
    good = PlanProposal(
        tasks=[TaskDraft(key="search", description="search the news")], rationale="r"
    )
    with chat_server() as server:
        server.reply(completion(blank), completion(good))
        async with fast(server.base_url) as model:
            response = await model.generate(plan_request())
        _, second = server.chat_requests()
    assert response.output == good
    problem = second.messages[-1]["content"]
    assert "tasks.0.description" in problem
    assert "the task's description must not be blank" in problem


async def test_an_answer_invalid_twice_is_an_error_that_keeps_the_raw_text() -> None:
    with chat_server(
        lambda _: completion("not json at all", usage=(80, 5, 0))
    ) as server:
        async with fast(server.base_url) as model:
            with pytest.raises(ModelOutputError) as caught:
                await model.generate(execute_request())
        assert len(server.chat_requests()) == 2
    assert caught.value.raw_output == "not json at all"
    assert caught.value.usage is not None
    assert caught.value.usage.input_tokens == 160
    assert caught.value.usage.calls == 2


PROSE = "Let me think about this task step by step. " * 500  # 22,000 characters


async def test_a_long_invalid_answer_is_shown_shortened_when_asked_again() -> None:
    good = TaskOutcome(success=True, summary="done")
    with chat_server() as server:
        server.reply(completion(PROSE), completion(good))
        async with fast(server.base_url) as model:
            response = await model.generate(execute_request())
        first, second = server.chat_requests()
    assert response.output == good
    shown = second.messages[-2]
    assert shown["role"] == "assistant"
    assert shown["content"].startswith(PROSE[:4000])
    assert len(shown["content"]) < 4100
    assert f"{len(PROSE) - 4000} more characters" in shown["content"]
    assert len(second.text) < len(first.text) + 5000


async def test_a_reask_the_server_refuses_keeps_the_invalid_answer_and_says_so() -> (
    None
):
    def script(logged: Logged) -> Reply:
        if len(logged.messages) > 2:  # the re-ask: too long for this server
            return error(400, "maximum context length is 2048 tokens")
        return completion(PROSE)

    with chat_server(script) as server:
        async with fast(server.base_url) as model:
            with pytest.raises(ModelError) as caught:
                await model.generate(execute_request())
        requests = server.chat_requests()
    # The server took json_schema for the first answer: no other format is
    # tried for the re-ask.
    assert formats(requests) == ["json_schema", "json_schema"]
    assert "maximum context length" in str(caught.value)
    assert "asked again after an answer that was not a valid TaskOutcome" in str(
        caught.value
    )
    assert caught.value.raw_output == PROSE
    assert caught.value.usage is not None
    assert caught.value.usage.calls == 1


@pytest.mark.parametrize(
    ("max_output_tokens", "limit"),
    [(50, "max_output_tokens=50"), (None, "the server's own")],
)
async def test_an_answer_cut_short_at_the_token_limit_fails_at_once_saying_so(
    max_output_tokens: int | None, limit: str
) -> None:
    truncated = '{"tasks": [{"key": "search", "descr'
    with chat_server(
        lambda _: completion(truncated, usage=(80, 50, 0), finish_reason="length")
    ) as server:
        async with fast(server.base_url, max_output_tokens=max_output_tokens) as model:
            with pytest.raises(ModelOutputError) as caught:
                await model.generate(plan_request())
        assert len(server.chat_requests()) == 1  # the same limit would cut a re-ask
    assert "cut short at the output token limit" in str(caught.value)
    assert limit in str(caught.value)
    assert caught.value.raw_output == truncated
    assert caught.value.usage is not None
    assert caught.value.usage.output_tokens == 50


async def test_an_answer_at_the_token_limit_that_is_valid_is_taken() -> None:
    with chat_server() as server:
        server.reply(
            completion(PlanProposal(rationale="short"), finish_reason="length")
        )
        async with fast(server.base_url, max_output_tokens=50) as model:
            response = await model.generate(plan_request())
    assert response.output == PlanProposal(rationale="short")


async def test_an_answer_in_a_code_fence_is_accepted() -> None:
    fenced = "```json\n" + Verdict(decision="complete").model_dump_json() + "\n```"
    with chat_server() as server:
        server.reply(completion(fenced))
        async with fast(server.base_url) as model:
            response = await model.generate(
                ModelRequest(role="reviewer", purpose="milestone", output_type=Verdict)
            )
    assert response.output == Verdict(decision="complete")


VERDICT_JSON = Verdict(decision="complete").model_dump_json()


@pytest.mark.parametrize(
    "content",
    [
        f"<think>The user wants a verdict {{maybe}}.</think>\n{VERDICT_JSON}",
        f"<think>x</think>\n```json\n{VERDICT_JSON}\n```",
        f"Here is my verdict:\n```json\n{VERDICT_JSON}\n```\nHope it helps.",
        f"Sure! {VERDICT_JSON} Let me know.",
    ],
    ids=["reasoning", "reasoning-then-fence", "prose-around-a-fence", "prose-inline"],
)
async def test_an_answer_with_text_around_its_json_is_read_without_a_reask(
    content: str,
) -> None:
    with chat_server() as server:
        server.reply(completion(content))
        async with fast(server.base_url) as model:
            response = await model.generate(
                ModelRequest(role="reviewer", purpose="milestone", output_type=Verdict)
            )
        assert len(server.chat_requests()) == 1
    assert response.output == Verdict(decision="complete")


async def test_json_inside_reasoning_that_never_ended_is_not_taken_as_the_answer() -> (
    None
):
    unfinished = f"<think>Perhaps {VERDICT_JSON} would do, but"
    with chat_server() as server:
        server.reply(completion(unfinished), completion(unfinished))
        async with fast(server.base_url) as model:
            with pytest.raises(ModelOutputError):
                await model.generate(
                    ModelRequest(
                        role="reviewer", purpose="milestone", output_type=Verdict
                    )
                )


async def test_json_of_the_wrong_shape_in_prose_is_reasked_with_its_own_problem() -> (
    None
):
    with chat_server() as server:
        server.reply(
            completion('Sure! {"decision": "maybe"}'),
            completion(VERDICT_JSON),
        )
        async with fast(server.base_url) as model:
            response = await model.generate(
                ModelRequest(role="reviewer", purpose="milestone", output_type=Verdict)
            )
        _, reask = server.chat_requests()
    assert response.output == Verdict(decision="complete")
    problem = reask.messages[-1]["content"]
    assert "- decision: Input should be" in problem
    assert "Invalid JSON" not in problem


async def test_a_refusal_and_a_content_filter_stop_are_reported_as_such() -> None:
    with chat_server() as server:
        server.reply(
            completion(None, refusal="I can't help with that."),
            completion("partial", finish_reason="content_filter"),
        )
        async with fast(server.base_url) as model:
            with pytest.raises(ModelRefusal, match="can't help") as refused:
                await model.generate(plan_request())
            with pytest.raises(ModelRefusal, match="content filter") as filtered:
                await model.generate(plan_request())
        assert len(server.chat_requests()) == 2
    assert refused.value.reason == "refusal"
    assert filtered.value.reason == "content_filter"


def formats(requests: list[Logged]) -> list[str | None]:
    """The response_format type each request asked for (None: none)."""
    return [r.body.get("response_format", {}).get("type") for r in requests]


def unsupported(param: str, message: str, code: str = "unsupported_value") -> Reply:
    """OpenAI's 400 for a parameter a model does not take."""
    body = {"message": message, "type": "invalid_request_error"}
    return Reply(status=400, body={"error": {**body, "param": param, "code": code}})


async def test_a_model_that_takes_no_temperature_is_asked_without_one() -> None:
    def script(logged: Logged) -> Reply:
        if "temperature" in logged.body:
            return unsupported(
                "temperature",
                "Unsupported value: 'temperature' does not support 0 with this "
                "model. Only the default (1) value is supported.",
            )
        return completion(PlanProposal())

    with chat_server(script) as server:
        async with fast(server.base_url) as model:
            first = await model.generate(plan_request())
            second = await model.generate(plan_request())
        requests = server.chat_requests()
    assert first.output == second.output == PlanProposal()
    assert ["temperature" in r.body for r in requests] == [True, False, False]
    assert formats(requests) == ["json_schema"] * 3  # not taken for a schema 400


async def test_max_tokens_goes_as_max_completion_tokens_to_a_model_that_wants_it() -> (
    None
):
    def script(logged: Logged) -> Reply:
        if "max_tokens" in logged.body:
            return unsupported(
                "max_tokens",
                "Unsupported parameter: 'max_tokens' is not supported with this "
                "model. Use 'max_completion_tokens' instead.",
                code="unsupported_parameter",
            )
        return completion(PlanProposal())

    with chat_server(script) as server:
        async with fast(server.base_url, max_output_tokens=500) as model:
            await model.generate(plan_request())
        first, second = server.chat_requests()
    assert first.body["max_tokens"] == 500
    assert "max_tokens" not in second.body
    assert second.body["max_completion_tokens"] == 500


async def test_a_400_about_a_temperature_for_another_reason_is_not_retried() -> None:
    with chat_server() as server:
        server.reply(error(400, "temperature: must be at most 1"))
        async with fast(server.base_url, structured_output="json_schema") as model:
            with pytest.raises(ModelError, match="must be at most 1"):
                await model.generate(plan_request())
        [sent] = server.chat_requests()
    assert sent.body["temperature"] == 0


async def test_a_server_without_schema_support_gets_json_mode_with_the_schema() -> None:
    def script(logged):
        if logged.body.get("response_format", {}).get("type") == "json_schema":
            return error(400, "response_format json_schema is not supported")
        return completion(PlanProposal(rationale="json mode"))

    with chat_server(script) as server:
        async with fast(server.base_url) as model:
            first = await model.generate(plan_request())
            second = await model.generate(plan_request())
        requests = server.chat_requests()
    assert first.output == second.output == PlanProposal(rationale="json mode")
    assert formats(requests) == [
        "json_schema",
        "json_object",
        "json_object",
    ]
    assert '"tasks"' in requests[1].messages[0]["content"]  # the schema is shown


async def test_a_model_refusing_the_schema_leaves_other_models_asking_with_it() -> None:
    def script(logged):
        schema = logged.body.get("response_format", {}).get("type") == "json_schema"
        if schema and logged.body["model"] == "small-model":
            return error(400, "response_format json_schema is not supported")
        if logged.body["model"] == "small-model":
            return completion(TaskOutcome(success=True, summary="done"))
        return completion(PlanProposal(rationale="schema mode"))

    with chat_server(script) as server:
        async with fast(server.base_url, models={"executor": "small-model"}) as model:
            await model.generate(execute_request())
            await model.generate(plan_request())
            await model.generate(execute_request())
        requests = server.chat_requests()
    asked = [r.body["model"] for r in requests]
    assert list(zip(asked, formats(requests), strict=True)) == [
        ("small-model", "json_schema"),
        ("small-model", "json_object"),
        ("gpt-test", "json_schema"),  # the planner's model takes the schema
        ("small-model", "json_object"),
    ]


async def test_a_server_rejecting_both_formats_gets_the_schema_in_the_prompt() -> None:
    def script(logged):
        if "response_format" in logged.body:
            return error(400, "response_format is not supported")
        return completion(PlanProposal(rationale="prompt only"))

    with chat_server(script) as server:
        async with fast(server.base_url) as model:
            first = await model.generate(plan_request())
            second = await model.generate(plan_request())
        requests = server.chat_requests()
    assert first.output == second.output == PlanProposal(rationale="prompt only")
    assert formats(requests) == [
        "json_schema",
        "json_object",
        None,
        None,  # the second call asks the way the first one was answered
    ]


async def test_a_400_no_format_avoids_raises_it_and_keeps_the_schema_mode() -> None:
    too_long = error(400, "This model's maximum context length is 8192 tokens")
    with chat_server() as server:
        server.reply(too_long, too_long, too_long, completion(PlanProposal()))
        async with fast(server.base_url) as model:
            with pytest.raises(ModelError, match="maximum context length"):
                await model.generate(plan_request())
            await model.generate(plan_request())  # a shorter prompt, say
        requests = server.chat_requests()
    assert formats(requests) == [
        "json_schema",
        "json_object",
        None,
        "json_schema",  # not downgraded by a 400 about something else
    ]


def _answer_with_null_message() -> Reply:
    reply = completion(PlanProposal(), usage=(300, 40, 0))
    assert isinstance(reply.body, dict)
    reply.body["choices"][0]["message"] = None
    return reply


@pytest.mark.parametrize(
    ("reply", "message", "tokens"),
    [
        (_answer_with_null_message(), "the answer's choice had no message", 340),
        (Reply(body='"a proxy says hello"'), "no chat completion", 0),
        (Reply(body="null"), "no chat completion: the body is null", 0),
        (Reply(body="[1, 2]"), "no chat completion: the body is a list", 0),
        (
            Reply(
                body="<html>502 Bad Gateway</html>",
                headers={"content-type": "text/html"},
            ),
            "no chat completion: a text body: <html>502 Bad Gateway</html>",
            0,
        ),
        (
            Reply(
                body='data: {"choices": []}\n\ndata: [DONE]\n\n',
                headers={"content-type": "text/event-stream"},
            ),
            "a text body \\(a stream, which was not asked for\\): data:",
            0,
        ),
        (Reply(body="<html>502 Bad Gateway</html>"), "could not be read", 0),
        (Reply(body='{"id": "chatcmpl-1", "choi'), "could not be read", 0),
        (
            completion(tool_calls=[("c1", "lookup", {})], usage=(50, 5, 0)),
            "a tool call could not be read",
            55,
        ),
    ],
    ids=[
        "null-message",
        "a-string",
        "null",
        "a-list",
        "an-html-page-as-html",
        "a-stream",
        "html-page",
        "cut-short",
        "tool-call-without-arguments",
    ],
)
async def test_an_answer_of_the_wrong_shape_is_a_model_error_that_keeps_its_tokens(
    reply: Reply, message: str, tokens: int
) -> None:
    if message.startswith("a tool call"):
        assert isinstance(reply.body, dict)
        reply.body["choices"][0]["message"]["tool_calls"][0]["function"][
            "arguments"
        ] = None
    with chat_server() as server:
        server.reply(reply)
        async with fast(server.base_url) as model:
            request = execute_request(tools=[Tool(_lookup).spec])
            with pytest.raises(ModelError, match=message) as caught:
                await model.generate(request)
    counted = caught.value.usage.total_tokens if caught.value.usage else 0
    assert counted == tokens


def _lookup(city: str) -> str:
    """Look up a city."""
    return city


async def test_credentials_in_the_base_url_stay_out_of_error_messages() -> None:
    with chat_server() as server:
        server.reply(error(503, "overloaded"))
        url = server.base_url.replace("http://", "http://ana:s3cret-pass@")
        async with fast(url, max_retries=0) as model:
            with pytest.raises(TransientModelError) as caught:
                await model.generate(plan_request())
        [sent] = server.chat_requests()
    assert "s3cret-pass" not in str(caught.value)
    assert server.base_url in str(caught.value)
    assert sent.headers["authorization"].startswith("Basic ")  # still sent


async def test_prompt_mode_sends_no_response_format_and_still_validates() -> None:
    with chat_server() as server:
        server.reply(completion("nope"), completion(PlanProposal(rationale="ok")))
        async with fast(server.base_url, structured_output="prompt") as model:
            response = await model.generate(plan_request())
        requests = server.chat_requests()
    assert response.output == PlanProposal(rationale="ok")
    assert all("response_format" not in r.body for r in requests)


async def test_a_tool_call_round_trip_carries_the_results_back() -> None:
    def lookup(city: str) -> str:
        """Look up a city's population."""
        return f"{city}: 2.1 million"

    spec = Tool(lookup).spec
    with chat_server() as server:
        server.reply(
            completion(tool_calls=[("call_1", "lookup", {"city": "Paris"})]),
            completion(TaskOutcome(success=True, summary="Paris has 2.1 million")),
        )
        async with fast(server.base_url) as model:
            first = await model.generate(execute_request(tools=[spec]))
            exchange = ToolExchange(
                calls=first.tool_calls,
                results=[
                    ToolResult(call_id="call_1", name="lookup", content="2.1 million")
                ],
            )
            second = await model.generate(
                execute_request(tools=[spec], transcript=[exchange])
            )
        asked, answered = server.chat_requests()
    assert first.output is None
    assert first.tool_calls == [
        ToolCall(id="call_1", name="lookup", arguments='{"city": "Paris"}')
    ]
    assert second.output == TaskOutcome(success=True, summary="Paris has 2.1 million")
    [sent_tool] = asked.body["tools"]
    assert sent_tool["function"]["name"] == "lookup"
    assert sent_tool["function"]["description"] == "Look up a city's population."
    assert sent_tool["function"]["parameters"]["required"] == ["city"]
    assistant, result = answered.messages[-2:]
    assert assistant["tool_calls"][0]["id"] == "call_1"
    assert result == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "2.1 million",
    }


async def test_planning_reviewing_and_ranking_run_at_temperature_zero() -> None:
    with chat_server(lambda _: completion(Verdict(decision="continue"))) as server:
        async with fast(server.base_url, temperatures={"executor": 0.9}) as model:
            await model.generate(
                ModelRequest(
                    role="reviewer",
                    purpose="milestone",
                    output_type=Verdict,
                    temperature=0.8,
                )
            )
            with pytest.raises(ModelOutputError):
                await model.generate(execute_request())
        reviewer, *executor = server.chat_requests()
    assert reviewer.body["temperature"] == 0
    assert {r.body["temperature"] for r in executor} == {0.9}


def test_temperatures_of_the_planner_reviewer_and_ranker_cannot_be_set() -> None:
    with pytest.raises(ConfigurationError) as caught:
        OpenAIModel("m", base_url="http://127.0.0.1:9/v1", temperatures={"planner": 1})
    assert caught.value.field == "temperatures.planner"


async def test_models_per_role_and_prices_turn_tokens_into_cost() -> None:
    prices = {
        "big": ModelPrice(input=10.0, output=30.0, cached_input=1.0),
        "small": ModelPrice(input=1.0, output=2.0),
    }
    with chat_server() as server:
        server.reply(
            completion(PlanProposal(), usage=(1_000, 100, 400)),
            completion(TaskOutcome(success=True, summary="ok"), usage=(2_000, 500, 0)),
        )
        async with fast(
            server.base_url,
            models={"planner": "big", "executor": "small"},
            prices=prices,
        ) as model:
            assert model.model_for("planner") == "big"
            assert model.model_for("reviewer") == "gpt-test"
            planned = await model.generate(plan_request())
            executed = await model.generate(execute_request())
        planner_sent, executor_sent = server.chat_requests()
    assert (planner_sent.body["model"], executor_sent.body["model"]) == ("big", "small")
    assert planned.usage.cost == pytest.approx((600 * 10 + 400 * 1 + 100 * 30) / 1e6)
    assert executed.usage.cost == pytest.approx((2_000 * 1 + 500 * 2) / 1e6)


async def test_a_price_given_as_a_mapping_of_its_fields_prices_the_answer() -> None:
    with chat_server() as server:
        server.reply(completion(PlanProposal(), usage=(1_000, 100, 0)))
        prices = {"gpt-test": {"input": 2.0, "output": 4.0}}
        async with fast(server.base_url, prices=prices) as model:
            assert model.prices == {"gpt-test": ModelPrice(input=2.0, output=4.0)}
            planned = await model.generate(plan_request())
    assert planned.usage.cost == pytest.approx((1_000 * 2 + 100 * 4) / 1e6)


async def test_a_users_own_messages_are_sent_as_they_are() -> None:
    mine = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    with chat_server() as server:
        server.reply(completion(Verdict(decision="continue")))
        async with fast(server.base_url) as model:
            response = await model.generate(
                ModelRequest(
                    role="reviewer",
                    purpose="milestone",
                    output_type=Verdict,
                    messages=mine,
                )
            )
        [sent] = server.chat_requests()
    assert response.prompt_version is None
    assert sent.messages[0]["content"].startswith("Be brief.")
    assert sent.messages[1:] == mine[1:]


async def test_a_missing_template_names_the_role_and_purpose() -> None:
    with chat_server() as server:
        async with fast(server.base_url) as model:
            with pytest.raises(MissingPromptError) as caught:
                await model.generate(
                    ModelRequest(
                        role="planner", purpose="brainstorm", output_type=PlanProposal
                    )
                )
        assert server.chat_requests() == []
    assert "'planner'" in str(caught.value)
    assert "'brainstorm'" in str(caught.value)


async def test_an_unknown_model_is_a_non_transient_error_naming_the_fix() -> None:
    with chat_server(lambda _: error(404, "model 'gpt-nope' not found")) as server:
        async with fast(server.base_url) as model:
            with pytest.raises(ModelError, match="check the model name") as caught:
                await model.generate(plan_request())
        assert len(server.chat_requests()) == 1
    assert not caught.value.transient


async def test_a_redirect_to_the_endpoint_is_followed() -> None:
    # A proxy that moved answers with a redirect to where it is now.
    with chat_server() as server:
        moved = Reply(308, headers={"location": f"{server.base_url}/chat/completions"})
        server.script = lambda logged: (
            moved if logged.path.startswith("/old/") else completion(PlanProposal())
        )
        old = server.base_url.replace("/v1", "/old/v1")
        async with fast(old, max_retries=0) as model:
            response = await model.generate(plan_request())
        paths = [r.path for r in server.requests]
    assert response.output == PlanProposal()
    assert paths == ["/old/v1/chat/completions", "/v1/chat/completions"]


@pytest.mark.parametrize("status", [301, 302, 303])
async def test_a_redirect_that_would_drop_the_request_fails_at_once_naming_it(
    status: int,
) -> None:
    # The HTTP client follows a 301, 302 or 303 as a GET without the body:
    # the server's 405 for it is no answer of the endpoint's.
    with chat_server() as server:
        moved = Reply(
            status, headers={"location": f"{server.base_url}/chat/completions"}
        )
        server.script = lambda _: moved
        old = server.base_url.replace("/v1", "/old/v1")
        async with fast(old, max_retries=3) as model:
            with pytest.raises(ModelError) as caught:
                await model.generate(plan_request())
        methods = [(r.method, r.path) for r in server.requests]
    assert str(caught.value) == (
        f"{old}/ (gpt-test): HTTP {status}: redirected to "
        f"{server.base_url}/chat/completions, where the request would go as a "
        "GET without its body: check the base URL"
    )
    assert not caught.value.transient
    assert methods == [
        ("POST", "/old/v1/chat/completions"),
        ("GET", "/v1/chat/completions"),
    ]


@pytest.mark.parametrize("status", [301, 302, 303])
@pytest.mark.parametrize(
    "page",
    [
        Reply(200, "<html><body>Sign in</body></html>", {"content-type": "text/html"}),
        Reply(200, {"ok": True}),
        completion(PlanProposal()),  # even a chat completion: not for this request
    ],
    ids=["login-page", "json", "completion"],
)
async def test_a_redirect_to_a_page_answered_200_fails_at_once_naming_it(
    status: int, page: Reply
) -> None:
    # A proxy that sends the request on to a login page: the GET it became
    # is answered 200, and the error said "no chat completion" (or took the
    # page's JSON for an answer) without naming the redirect.
    with chat_server() as server:
        login = f"{server.base_url.removesuffix('/v1')}/login"
        server.script = lambda _: Reply(status, headers={"location": login})
        server.page = page
        old = server.base_url.replace("/v1", "/old/v1")
        async with fast(old, max_retries=3) as model:
            with pytest.raises(ModelError) as caught:
                await model.generate(plan_request())
        methods = [(r.method, r.path) for r in server.requests]
    assert str(caught.value) == (
        f"{old}/ (gpt-test): HTTP {status}: redirected to {login}, where the "
        "request would go as a GET without its body: check the base URL"
    )
    assert not isinstance(caught.value, ModelOutputError)
    assert not caught.value.transient
    assert methods == [("POST", "/old/v1/chat/completions"), ("GET", "/login")]


@pytest.mark.parametrize("status", [307, 308])
@pytest.mark.parametrize("refusal", [401, 403])
async def test_credentials_refused_after_a_redirect_to_another_host_say_so(
    status: int, refusal: int
) -> None:
    # httpx leaves the Authorization header behind when a redirect leads to
    # another host: the host there saw no key, and the error read as if the
    # key had been refused.
    def keyed(logged: Logged) -> Reply:
        if "authorization" not in logged.headers:
            return error(refusal, "no API key given")
        return completion(PlanProposal())

    with chat_server(keyed) as target, chat_server() as proxy:
        there = target.base_url.replace("127.0.0.1", "localhost")
        proxy.script = lambda _: Reply(
            status, headers={"location": f"{there}/chat/completions"}
        )
        async with fast(proxy.base_url, api_key="sk-test", max_retries=3) as model:
            with pytest.raises(ModelAuthenticationError) as caught:
                await model.generate(plan_request())
        async with fast(target.base_url, api_key="sk-test") as model:
            answered = await model.generate(plan_request())  # the key is good
    origin = proxy.base_url.removesuffix("/v1")
    host = there.removesuffix("/v1")
    assert str(caught.value) == (
        f"{proxy.base_url}/ (gpt-test): HTTP {refusal} from {host} (no API key "
        f"given) after a redirect from {origin}: the HTTP client sends no "
        f"credentials to another host, so {host} got no key: if it is the "
        "endpoint, give its URL as the base URL"
    )
    assert "sk-test" not in str(caught.value)
    assert len(proxy.chat_requests()) == 1  # not retried
    assert answered.output == PlanProposal()


async def test_credentials_refused_after_a_redirect_on_the_same_host_are_refused() -> (
    None
):
    # The key went along: the host refused it, as the error says.
    with chat_server() as server:
        moved = Reply(307, headers={"location": f"{server.base_url}/chat/completions"})
        server.script = lambda logged: (
            moved
            if logged.path.startswith("/old/")
            else error(401, "Incorrect API key provided")
        )
        old = server.base_url.replace("/v1", "/old/v1")
        async with fast(old, api_key="sk-wrong") as model:
            with pytest.raises(ModelAuthenticationError) as caught:
                await model.generate(plan_request())
        sent = [r.headers.get("authorization") for r in server.requests]
    assert sent == ["Bearer sk-wrong"] * 2
    assert str(caught.value).startswith(f"{old}/ (gpt-test) rejected the credentials")


async def test_a_redirect_loop_fails_at_once_naming_the_base_url() -> None:
    with chat_server() as server:
        again = Reply(307, headers={"location": f"{server.base_url}/chat/completions"})
        server.script = lambda _: again
        async with fast(server.base_url, max_retries=3) as model:
            with pytest.raises(ModelError, match="redirected too often") as caught:
                await model.generate(plan_request())
        sent = len(server.chat_requests())
    assert "check the base URL" in str(caught.value)
    assert not caught.value.transient
    assert sent == 21  # one attempt (httpx follows 20 redirects), not retried


async def test_a_redirect_with_nowhere_to_go_fails_naming_the_base_url() -> None:
    with chat_server(lambda _: Reply(301)) as server:
        async with fast(server.base_url, max_retries=3) as model:
            with pytest.raises(ModelError, match="HTTP 301") as caught:
                await model.generate(plan_request())
        assert len(server.chat_requests()) == 1
    assert "check the base URL" in str(caught.value)
    assert not caught.value.transient


async def test_a_servers_long_error_message_is_kept_short() -> None:
    quoted = "context too long. Received Messages=" + "x" * 50_000  # a proxy's
    with chat_server() as server:
        server.reply(error(400, quoted), error(503, quoted), error(503, quoted))
        async with fast(
            server.base_url, structured_output="json_schema", max_retries=1
        ) as model:
            with pytest.raises(ModelError) as refused:
                await model.generate(plan_request())
            with pytest.raises(TransientModelError) as transient:
                await model.generate(plan_request())
    for caught in (refused, transient):
        assert "context too long. Received Messages=xxx" in str(caught.value)
        assert "(49036 more characters)" in str(caught.value)
        assert len(str(caught.value)) < 1_200


async def test_an_unreachable_endpoint_is_transient_and_names_it() -> None:
    with chat_server() as server:
        url = server.base_url
    async with fast(url, max_retries=1) as model:
        with pytest.raises(TransientModelError, match="cannot connect") as caught:
            await model.generate(plan_request())
    assert url in str(caught.value)


def test_openai_itself_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="set OPENAI_API_KEY") as caught:
        OpenAIModel("gpt-4o-mini")
    assert caught.value.field == "api_key"


def test_the_model_name_comes_from_replan_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REPLAN_MODEL", "qwen2.5:7b")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = OpenAIModel(provider_name="ollama")
    assert model.model_for("executor") == "qwen2.5:7b"
    assert model.base_url.startswith("http://127.0.0.1:11434/v1")
    assert model.provider_name == "ollama"
    monkeypatch.setenv("REPLAN_MODEL", "qwen2.5:7b\n")  # as an env file leaves it
    assert OpenAIModel().model_for("planner") == "qwen2.5:7b"
    assert OpenAIModel(" qwen2.5:3b\n").model_for("planner") == "qwen2.5:3b"
    per_role = OpenAIModel(models={"executor": " qwen2.5:1b\n"})
    assert per_role.model_for("executor") == "qwen2.5:1b"
    monkeypatch.setenv("REPLAN_MODEL", " ")
    with pytest.raises(ConfigurationError, match="name a model"):
        OpenAIModel()
    monkeypatch.delenv("REPLAN_MODEL")
    with pytest.raises(ConfigurationError) as caught:
        OpenAIModel()
    assert caught.value.field == "model"


def test_replan_model_in_the_daemons_openai_form_names_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # REPLAN_MODEL=openai:NAME is how replan serve, run and explore take it;
    # an application reading the same environment asks for NAME too.
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("REPLAN_MODEL", "openai:qwen2.5:7b\n")
    assert OpenAIModel().model_for("planner") == "qwen2.5:7b"
    monkeypatch.setenv("REPLAN_MODEL", "openai: ")
    with pytest.raises(ConfigurationError, match="name a model") as caught:
        OpenAIModel()
    assert caught.value.field == "model"


async def test_calls_made_while_the_server_asked_to_wait_are_not_sent() -> None:
    # The server says to come back in 120 s, longer than the model waits: the
    # call fails as transient, and so do the calls made after it (the retries
    # of the run's tasks and roles) without asking the server again.
    with chat_server() as server:
        server.reply(error(429, "come back in two minutes", retry_after="120"))
        async with fast(server.base_url) as model:
            with pytest.raises(TransientModelError, match="120s") as caught:
                await model.generate(plan_request())
            # The wait rides on the error, for the run to retry after it.
            assert caught.value.retry_after == 120
            assert caught.value.failure().retry_after_s == 120
            for _ in range(5):
                with pytest.raises(TransientModelError, match="not sent") as caught:
                    await model.generate(plan_request())
                assert 100 < (caught.value.retry_after or 0) <= 120
        assert len(server.chat_requests()) == 1


async def test_a_retry_after_holds_the_model_it_answered_for_not_the_others() -> None:
    # One endpoint (a LiteLLM proxy, say) serves a model per role: the wait
    # one model's 429 asked for holds that model's calls only.
    def answer(logged: Logged) -> Reply:
        if logged.body["model"] == "gpt-test":
            return error(429, "come back in two minutes", retry_after="120")
        return completion(Verdict(decision="continue"))

    with chat_server(answer) as server:
        async with fast(server.base_url, models={"reviewer": "gpt-other"}) as model:
            with pytest.raises(TransientModelError, match="120s"):
                await model.generate(plan_request())
            review = ModelRequest(
                role="reviewer", purpose="milestone", output_type=Verdict
            )
            with anyio.fail_after(5):
                answered = await model.generate(review)
            assert answered.output == Verdict(decision="continue")
            with pytest.raises(TransientModelError, match="not sent"):
                await model.generate(plan_request())
        models = [r.body["model"] for r in server.chat_requests()]
    assert models == ["gpt-test", "gpt-other"]


async def test_a_429_whose_retries_run_out_says_how_long_the_server_asked_to_wait() -> (
    None
):
    with chat_server(lambda _: error(429, "slow down", retry_after="0.2")) as server:
        async with fast(server.base_url, max_retries=1) as model:
            with pytest.raises(TransientModelError, match="HTTP 429") as caught:
                await model.generate(plan_request())
        assert len(server.chat_requests()) == 2
    assert 0 < (caught.value.retry_after or 0) <= 0.2
    with chat_server(lambda _: error(500, "overloaded")) as server:
        async with fast(server.base_url, max_retries=1) as model:
            with pytest.raises(TransientModelError, match="HTTP 500") as caught:
                await model.generate(plan_request())
    assert caught.value.retry_after is None
    assert caught.value.failure().retry_after_s is None


async def test_a_retry_after_that_is_no_finite_wait_is_taken_for_none() -> None:
    with chat_server() as server:
        server.reply(
            error(429, "slow down", retry_after="inf"),
            completion(PlanProposal()),
        )
        async with fast(server.base_url) as model:
            with anyio.fail_after(10):
                response = await model.generate(plan_request())
        assert response.output == PlanProposal()
        assert len(server.chat_requests()) == 2


async def test_a_retry_after_date_years_ahead_holds_calls_for_a_day_at_most() -> None:
    with chat_server() as server:
        server.reply(
            error(429, "come back later", retry_after="Fri, 01 Jan 2100 00:00:00 GMT")
        )
        async with fast(server.base_url) as model:
            with pytest.raises(TransientModelError, match=r"wait 86400s"):
                await model.generate(plan_request())
            with pytest.raises(TransientModelError, match="not sent"):
                await model.generate(plan_request())
        assert len(server.chat_requests()) == 1


async def test_a_call_made_during_a_short_retry_after_waits_before_sending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One call got 429 with Retry-After: 1 and waits; another call made
    # meanwhile waits too, rather than asking the server at once.
    replies = iter(
        [
            error(429, "slow down", retry_after="1"),
            completion(Verdict(decision="continue")),
            completion(Verdict(decision="continue")),
        ]
    )
    sent: list[float] = []

    def answer(logged: Logged) -> Reply:
        sent.append(time.monotonic())
        return next(replies)

    with chat_server(answer) as server:
        request = ModelRequest(
            role="reviewer", purpose="milestone", output_type=Verdict
        )
        answers: list[object] = []
        async with fast(server.base_url) as model:
            held = anyio.Event()
            held_at: list[float] = []
            hold_off = model.retry.hold_off

            def holding(where: str, seconds: float) -> None:
                held_at.append(time.monotonic())
                hold_off(where, seconds)
                held.set()

            monkeypatch.setattr(model.retry, "hold_off", holding)

            async def call() -> None:
                answers.append((await model.generate(request)).output)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)
                    await held.wait()  # the first call has its 429
                    tg.start_soon(call)
        assert len(server.chat_requests()) == 3
    assert answers == [Verdict(decision="continue")] * 2
    # Neither the retry nor the call made meanwhile asked before the wait.
    assert len(held_at) == 1
    assert [s - held_at[0] >= 0.95 for s in sent[1:]] == [True, True]


async def test_tool_calls_without_ids_or_with_object_arguments_are_read() -> None:
    # Some OpenAI-compatible servers leave a tool call's id out, or send its
    # arguments as a JSON object instead of text.
    answer = completion(tool_calls=[("x", "lookup", {"city": "Paris"})])
    assert isinstance(answer.body, dict)
    calls = answer.body["choices"][0]["message"]["tool_calls"]
    calls.append(json.loads(json.dumps(calls[0])))
    del calls[0]["id"]
    calls[1]["id"] = ""
    calls[1]["function"]["arguments"] = {"city": "Lyon"}

    def lookup(city: str) -> str:
        """Look up a city's population."""
        return city

    with chat_server() as server:
        server.reply(answer)
        async with fast(server.base_url) as model:
            response = await model.generate(execute_request(tools=[Tool(lookup).spec]))
    assert response.tool_calls == [
        ToolCall(id="call_0", name="lookup", arguments='{"city": "Paris"}'),
        ToolCall(id="call_1", name="lookup", arguments='{"city": "Lyon"}'),
    ]


def test_no_key_for_openai_names_what_the_library_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The library's message names its own arguments, not a command's flags.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError) as caught:
        OpenAIModel("gpt-test")
    assert caught.value.field == "api_key"
    assert "--" not in caught.value.problem
    assert "base_url" in caught.value.problem
