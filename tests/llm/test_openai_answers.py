"""OpenAIModel on answers of odd shapes, dropped connections, and the
options and base URLs it refuses up front."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from chat_server import Reply, chat_server, completion

from replan import ConfigurationError, ModelRequest, PlanProposal, TaskDraft
from replan._errors import ModelError, ModelOutputError, TransientModelError
from replan.llm import BackoffPolicy, OpenAIModel, Tool

PLAN = PlanProposal(tasks=[TaskDraft(key="search", description="search the news")])
NOWHERE = "http://127.0.0.1:9/v1"


def plan_request() -> ModelRequest:
    return ModelRequest(
        role="planner",
        purpose="plan",
        output_type=PlanProposal,
        context={"goal": "map the battery market", "metadata": {}},
    )


def fast(url: str, **options: Any) -> OpenAIModel:
    options = {"max_retries": 0, "backoff_s": 0.01, **options}
    return OpenAIModel("gpt-test", base_url=url, **options)


def with_message(**fields: Any) -> Reply:
    """A completion of 120 tokens whose message has ``fields`` instead."""
    reply = completion(PLAN, usage=(100, 20, 0))
    assert isinstance(reply.body, dict)
    reply.body["choices"][0]["message"].update(fields)
    return reply


# Answers -------------------------------------------------------------------


async def test_content_sent_as_a_list_of_text_parts_is_joined_and_parsed() -> None:
    text = PLAN.model_dump_json()
    parts = [
        {"type": "thinking", "thinking": "a search will do"},
        {"type": "text", "text": text[:10]},
        {"type": "text", "text": text[10:]},
    ]
    with chat_server() as server:
        server.reply(with_message(content=parts))
        async with fast(server.base_url) as model:
            response = await model.generate(plan_request())
    assert response.output == PLAN
    assert response.usage.total_tokens == 120


def _choices_as_an_object() -> Reply:
    reply = completion(PLAN, usage=(100, 20, 0))
    assert isinstance(reply.body, dict)
    reply.body["choices"] = {"0": reply.body["choices"][0]}
    return reply


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (with_message(content=PLAN.model_dump()), "content is an object, not text"),
        (with_message(content=42), "content is a number, not text"),
        (with_message(content=[1, 2]), "content is a list, not text"),
        (
            with_message(content=[{"type": "text", "text": {"tasks": []}}]),
            "content is a list, not text",
        ),
        (_choices_as_an_object(), "choices are an object, not a list"),
        (
            with_message(tool_calls="search it"),
            "tool calls are a string, not a list",
        ),
    ],
    ids=["object", "number", "list", "text-part-of-an-object", "choices", "calls"],
)
async def test_an_answer_of_another_shape_is_an_output_error_with_its_tokens(
    reply: Reply, message: str
) -> None:
    request = plan_request().model_copy(update={"tools": [Tool(_lookup).spec]})
    with chat_server() as server:
        server.reply(reply)
        async with fast(server.base_url) as model:
            with pytest.raises(ModelOutputError, match=message) as caught:
                await model.generate(request)
        assert len(server.chat_requests()) == 1  # no re-ask: it would not help
    assert caught.value.usage is not None
    assert caught.value.usage.total_tokens == 120
    assert caught.value.raw_output  # what came, for the journal


def _lookup(city: str) -> str:
    """Look up a city."""
    return city


async def test_answers_without_usage_count_a_call_and_warn_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reply = completion(PLAN)
    assert isinstance(reply.body, dict)
    del reply.body["usage"]
    with chat_server(lambda _: reply) as server:
        async with fast(server.base_url) as model:
            with caplog.at_level(logging.WARNING, logger="replan.llm"):
                first = await model.generate(plan_request())
                second = await model.generate(plan_request())
    assert first.usage.calls == second.usage.calls == 1
    assert first.usage.total_tokens == 0
    [record] = caplog.records
    assert "reports no token usage" in record.getMessage()
    assert "token_budget does not bound them" in record.getMessage()


@pytest.mark.parametrize(
    ("usage", "tokens"),
    [
        ({"prompt_tokens": -1, "completion_tokens": 20}, 20),
        ({"prompt_tokens": 100, "completion_tokens": 2.5}, 100),
        ({"prompt_tokens": "many", "completion_tokens": 20}, 20),
        ({"prompt_tokens": 100.0, "completion_tokens": "20"}, 120),
    ],
    ids=["negative", "fractional", "text", "float-and-digits"],
)
async def test_odd_token_counts_keep_the_answer_and_count_what_they_can(
    usage: dict[str, object], tokens: int, caplog: pytest.LogCaptureFixture
) -> None:
    reply = completion(PLAN)
    assert isinstance(reply.body, dict)
    reply.body["usage"] = {**usage, "total_tokens": 120}
    with chat_server(lambda _: reply) as server:
        async with fast(server.base_url) as model:
            with caplog.at_level(logging.WARNING, logger="replan.llm"):
                first = await model.generate(plan_request())
                second = await model.generate(plan_request())
        assert len(server.chat_requests()) == 2  # neither was asked again
    assert first.output == second.output == PLAN
    assert first.usage.total_tokens == second.usage.total_tokens == tokens
    assert first.usage.calls == 1
    odd = [r for r in caplog.records if "no counts" in r.getMessage()]
    assert len(odd) == (0 if tokens == 120 else 1)


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        ({"message": "model 'm' not found, try pulling it first"}, "not found, try"),
        ("upstream timed out", "upstream timed out"),
        ({"code": 502}, '{"code": 502}'),
    ],
)
async def test_a_body_with_no_choices_but_an_error_reports_the_servers_error(
    error: object, shown: str
) -> None:
    with chat_server() as server:
        server.reply(Reply(body={"error": error}))
        async with fast(server.base_url) as model:
            with pytest.raises(ModelError) as caught:
                await model.generate(plan_request())
        assert len(server.chat_requests()) == 1
    assert "the server answered with an error: " in str(caught.value)
    assert shown in str(caught.value)
    assert "no choices" not in str(caught.value)


async def test_a_message_that_is_no_object_is_an_output_error() -> None:
    reply = completion(PLAN, usage=(100, 20, 0))
    assert isinstance(reply.body, dict)
    reply.body["choices"][0]["message"] = "here is the plan"
    with chat_server() as server:
        server.reply(reply)
        async with fast(server.base_url) as model:
            with pytest.raises(ModelOutputError, match="message is a string") as caught:
                await model.generate(plan_request())
    assert caught.value.raw_output == "here is the plan"
    assert caught.value.usage is not None
    assert caught.value.usage.total_tokens == 120


@pytest.mark.parametrize(
    "reply",
    [
        Reply(body="<html>502</html>", headers={"content-type": "text/html"}),
        Reply(body='{"id": "chatcmpl-1", "choi'),
        Reply(body="null"),
    ],
    ids=["a-page", "cut-short-json", "null"],
)
async def test_an_answer_that_is_no_chat_completion_counts_no_call(
    reply: Reply,
) -> None:
    # A run counts a usage of no calls as one call: a 200 that brought no
    # completion must count as none, as a 502 does.
    with chat_server() as server:
        server.reply(reply, completion('{"tasks": "none"}', usage=(100, 20, 0)), reply)
        async with fast(server.base_url) as model:
            with pytest.raises(ModelError) as first:
                await model.generate(plan_request())
            with pytest.raises(ModelError) as reasked:
                await model.generate(plan_request())
    assert first.value.usage is None
    assert reasked.value.usage is not None  # the invalid answer's
    assert reasked.value.usage.calls == 1
    assert reasked.value.usage.total_tokens == 120


def _no_choices(**fields: Any) -> Reply:
    reply = completion(PLAN, usage=(30, 5, 0))
    assert isinstance(reply.body, dict)
    reply.body.update(choices=[], **fields)
    return reply


@pytest.mark.parametrize(
    ("reply", "kind", "message", "tokens"),
    [
        (_no_choices(), ModelOutputError, "the answer had no choices", 155),
        (
            _no_choices(error={"message": "upstream timed out"}),
            ModelError,
            "the server answered with an error: upstream timed out",
            155,
        ),
        (
            Reply(body="null"),
            ModelOutputError,
            "no chat completion: the body is null",
            120,
        ),
    ],
    ids=["no-choices", "upstream-error", "null-body"],
)
async def test_a_reask_answered_with_no_answer_keeps_the_invalid_one_and_says_so(
    reply: Reply, kind: type[ModelError], message: str, tokens: int
) -> None:
    with chat_server() as server:
        server.reply(completion('{"tasks": "none"}', usage=(100, 20, 0)), reply)
        async with fast(server.base_url) as model:
            with pytest.raises(ModelError) as caught:
                await model.generate(plan_request())
        assert len(server.chat_requests()) == 2
    assert type(caught.value) is kind
    assert message in str(caught.value)
    assert "asked again after an answer that was not a valid PlanProposal" in str(
        caught.value
    )
    assert caught.value.raw_output == '{"tasks": "none"}'  # for the journal
    assert caught.value.usage is not None
    assert caught.value.usage.total_tokens == tokens


# Connections ---------------------------------------------------------------


@contextmanager
def raw_server(answer: bytes) -> Iterator[tuple[str, list[int]]]:
    """A server that reads each request and sends ``answer`` (nothing: it
    closes the connection), and counts the connections it took."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # to see `closing` soon: close() wakes no accept()
    taken: list[int] = []
    closing = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            while not closing.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                conn.settimeout(None)
                taken.append(1)
                with conn:
                    conn.recv(65536)
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1", taken
    finally:
        closing.set()
        listener.close()
        thread.join(5)


async def test_a_dropped_connection_is_retried_and_not_reported_as_unreachable() -> (
    None
):
    with raw_server(b"") as (url, taken):
        async with fast(url, max_retries=1) as model:
            with pytest.raises(TransientModelError) as caught:
                await model.generate(plan_request())
    assert len(taken) == 2
    assert "connected, but the server dropped the connection" in str(caught.value)
    assert "cannot connect" not in str(caught.value)


# httpx leaves the generator that read the body suspended when decoding it
# fails; trio warns when the garbage collector finalizes it.
@pytest.mark.filterwarnings(
    "ignore:Async generator .* garbage collected:ResourceWarning"
)
async def test_an_answer_that_cannot_be_decompressed_is_transient_and_says_so() -> None:
    body = b"this is no gzip stream"
    head = (
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        f"content-encoding: gzip\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    with raw_server(head.encode() + body) as (url, _):
        async with fast(url) as model:
            with pytest.raises(TransientModelError) as caught:
                await model.generate(plan_request())
    assert "connected, but the answer could not be decoded" in str(caught.value)
    assert "cannot connect" not in str(caught.value)


async def test_an_exception_group_from_the_client_is_reported_by_its_cause() -> None:
    async def create(**_: Any) -> Any:
        raise ExceptionGroup("unhandled errors", [OverflowError("port must be 0-1")])

    chat = SimpleNamespace(completions=SimpleNamespace(create=create))
    client: Any = SimpleNamespace(base_url="http://stub/v1/", chat=chat)
    async with OpenAIModel("gpt-test", client=client) as model:
        with pytest.raises(Exception, match="request failed") as caught:
            await model.generate(plan_request())
    assert "OverflowError: port must be 0-1" in str(caught.value)
    assert "ExceptionGroup" not in str(caught.value)


# Options -------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"timeout_s": NAN}, "timeout_s"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": INF}, "timeout_s"),
        ({"backoff_s": NAN}, "backoff_s"),
        ({"backoff_s": -1}, "backoff_s"),
        ({"max_backoff_s": -1}, "max_backoff_s"),
        ({"max_backoff_s": INF}, "max_backoff_s"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": NAN}, "max_retries"),
        ({"max_retries": 1.5}, "max_retries"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_output_tokens": NAN}, "max_output_tokens"),
        ({"max_prompt_chars": NAN}, "max_prompt_chars"),
        ({"max_prompt_chars": 999}, "max_prompt_chars"),
        ({"temperatures": {"executor": NAN}}, "temperatures.executor"),
        ({"temperatures": {"executor": 2.5}}, "temperatures.executor"),
        ({"temperatures": {"evolver": -0.1}}, "temperatures.evolver"),
        ({"temperatures": {"executor": "hot"}}, "temperatures.executor"),
        ({"structured_output": "json"}, "structured_output"),
        ({"models": {"exectuor": "gpt-small"}}, "models.exectuor"),
        ({"models": "gpt-small"}, "models"),  # model= meant
        ({"models": ["executor"]}, "models"),
        ({"temperatures": 0.3}, "temperatures"),
        ({"api_key": 12345}, "api_key"),
        ({"models": {"executor": ""}}, "models.executor"),
        ({"models": {"planner": None}}, "models.planner"),
        ({"models": {"planner": "gpt-\udcff"}}, "models.planner"),
        ({"prices": [("gpt-test", 1.0)]}, "prices"),
        ({"prices": {"gpt-test": 3.0}}, "prices.gpt-test"),
        ({"prices": {"gpt-test": {"input": 1.0}}}, "prices.gpt-test.output"),
        ({"prices": {"gpt-test": {"input": -1, "output": 1}}}, "prices.gpt-test.input"),
        (
            {"prices": {"gpt-test": {"input": NAN, "output": 1}}},
            "prices.gpt-test.input",
        ),
    ],
    ids=lambda value: str(value) if isinstance(value, dict) else None,
)
def test_an_option_out_of_range_is_a_configuration_error_naming_it(
    options: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        OpenAIModel("gpt-test", base_url=NOWHERE, **options)
    assert caught.value.field == field


def test_a_model_name_or_base_url_that_is_no_text_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError) as caught:
        OpenAIModel(4, base_url=NOWHERE)  # type: ignore[arg-type]
    assert caught.value.field == "model"
    with pytest.raises(ConfigurationError) as caught:
        OpenAIModel("gpt-test", base_url=8000)  # type: ignore[arg-type]
    assert caught.value.field == "base_url"


@pytest.mark.parametrize(
    "key", ["sk-top secret", "sk-t\u00f6psecret", "sk-top\x1bsecret", "sk-\udcff"]
)
def test_a_key_no_http_header_can_carry_is_refused_without_showing_it(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        OpenAIModel("gpt-test", base_url=NOWHERE, api_key=key)
    assert caught.value.field == "api_key"
    assert "secret" not in str(caught.value)
    monkeypatch.setenv("OPENAI_API_KEY", key)
    with pytest.raises(ConfigurationError, match="in OPENAI_API_KEY holds") as caught:
        OpenAIModel("gpt-test", base_url=NOWHERE)
    assert "secret" not in str(caught.value)


async def test_a_key_with_a_newline_around_it_is_sent_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-an-env-file\r\n")
    with chat_server() as server:
        server.reply(completion(PLAN))
        async with fast(server.base_url) as model:
            await model.generate(plan_request())
        [sent] = server.chat_requests()
    assert sent.headers["authorization"] == "Bearer sk-from-an-env-file"


def test_a_model_name_that_is_no_text_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError) as caught:
        OpenAIModel("gpt-\udcff", base_url=NOWHERE)
    assert caught.value.field == "model"


def test_a_backoff_policy_refuses_a_wait_of_nan() -> None:
    with pytest.raises(ConfigurationError, match="backoff_s"):
        BackoffPolicy(backoff_s=NAN)


def test_the_backoff_doubles_up_to_max_backoff_s_with_jitter() -> None:
    policy = BackoffPolicy(backoff_s=1, max_backoff_s=10)
    for retry, ceiling in enumerate([1, 2, 4, 8, 10, 10]):
        waits = {policy.delay(retry, None) for _ in range(50)}
        # Equal jitter: from half the backoff to all of it, never in lockstep.
        assert all(ceiling / 2 <= wait <= ceiling for wait in waits)
        assert len(waits) > 1
    assert policy.delay(0, 2.5) == 2.5  # what the server asked for


def test_options_in_range_are_kept() -> None:
    model = OpenAIModel(
        "gpt-test",
        base_url=NOWHERE,
        max_retries=0,
        backoff_s=0,
        max_backoff_s=0,
        timeout_s=0.5,
        max_output_tokens=1,
        max_prompt_chars=1000,
    )
    assert (model.retry.max_retries, model.retry.backoff_s) == (0, 0.0)
    assert (model.timeout_s, model.max_output_tokens) == (0.5, 1)
    edges = OpenAIModel(
        "gpt-test", base_url=NOWHERE, temperatures={"executor": 0, "evolver": 2}
    )
    assert edges.temperatures == {"executor": 0, "evolver": 2}


def test_the_defaults_are_the_documented_ones() -> None:
    model = OpenAIModel("gpt-test", base_url=NOWHERE)
    assert model.structured_output == "auto"
    assert model.timeout_s == 120
    assert (model.retry.max_retries, model.retry.max_backoff_s) == (3, 30)
    assert model.max_prompt_chars == 100_000


# Base URLs -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://127.0.0.1:99999/v1", "the port must be 1 to 65535"),
        ("http://127.0.0.1:0/v1", "the port must be 1 to 65535"),
        ("http://127.0.0.1:eighty/v1", "could not be cast"),
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://:8000/v1", "it names no host"),
        ("ftp://127.0.0.1/v1", "http:// or https://"),
        ("localhost:8000/v1", "http:// or https://"),
        ("http://local\x00host/v1", "non-printable"),  # only the client sees it
        ("http://127.0.0.1:8000/my models/v1", "a space or a line break"),
        ("http://127.0.0.1:8000/v1\n/chat", "a space or a line break"),
    ],
)
def test_a_base_url_that_is_no_usable_url_is_a_configuration_error(
    url: str, problem: str
) -> None:
    with pytest.raises(ConfigurationError, match=problem) as caught:
        OpenAIModel("gpt-test", base_url=url)
    assert caught.value.field == "base_url"


@pytest.mark.parametrize(
    "url",
    [
        "http://ana:s3cret-pass@127.0.0.1:99999/v1",
        "http://ana:s3cret-pass@[::1/v1",
        "http://ana:s3cret-pass@127.0.0.1:eighty/v1",
        "http://ana:s3cret/pass@127.0.0.1/v1",  # a "/" moves it out of the host
        "ftp://ana:s3cret-pass@127.0.0.1/v1",
        "http://ana:s3cret-pass@local\x00host/v1",
    ],
)
def test_a_refused_base_url_never_shows_its_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        OpenAIModel("gpt-test", base_url=url)
    assert "s3cret" not in str(caught.value)
    assert "ana" not in str(caught.value)
    assert "no usable URL" in str(caught.value)


def test_a_bad_base_url_from_the_environment_says_where_it_came_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:70000/v1")
    with pytest.raises(ConfigurationError, match="from OPENAI_BASE_URL"):
        OpenAIModel("gpt-test")


@pytest.mark.parametrize(
    "given", [" http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1 ", "\t{}\n"]
)
def test_a_base_url_with_space_or_a_newline_around_it_is_taken_stripped(
    given: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "http://127.0.0.1:8000/v1"
    given = given.format(url) if "{}" in given else given
    assert OpenAIModel("gpt-test", base_url=given).base_url == f"{url}/"
    monkeypatch.setenv("OPENAI_BASE_URL", given)  # as an env file leaves it
    assert OpenAIModel("gpt-test").base_url == f"{url}/"


@pytest.mark.parametrize(
    "url",
    ["http://[::1]:8000/v1", "https://ana:pw@example.com/v1", "HTTP://Example.com"],
)
def test_a_usable_base_url_is_taken(url: str) -> None:
    model = OpenAIModel("gpt-test", base_url=url)
    assert model.base_url.lower().startswith(url.lower())
