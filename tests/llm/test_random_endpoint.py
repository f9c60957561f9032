"""OpenAIModel keeps its promises whatever an endpoint answers.

Each example draws a request (a plan, a task whose executor has a tool, a
milestone verdict), the model's options (the structured output mode, the
retries, a token allowance), the response formats the server refuses with
400, and what the Chat Completions server on 127.0.0.1 answers each request
in turn: an HTTP error from 400 to 504 (with a ``Retry-After`` or
``retry-after-ms`` of a few milliseconds, of more than ``max_backoff_s``, of
no wait at all, or that is no wait), a connection dropped before or during
the answer, an answer slower than ``timeout_s``, or a 200 whose body is a
valid answer (alone, fenced, after reasoning or inside prose), JSON of the
wrong shape, prose, empty or null content, a refusal, a content-filter or
length stop, no choices (with or without the upstream's ``error``), no
message, tool calls with bad arguments, unknown names or no arguments, text
or an empty body, or JSON that is no object; with usage as it should be,
missing, or holding counts that are no counts.

It makes one or two ``OpenAIModel.generate`` calls with one model and checks
each against a step-by-step account of what README's OpenAI section and the
adapter's docstrings promise (:class:`Endpoint`): the call returns the
request's output type (or the tool calls the answer made) or raises the
``ModelError`` that fits, with a message naming what went wrong, in bounded
time; retryable failures are retried exactly as often as the
``BackoffPolicy`` allows, others not at all; ``auto`` falls back to simpler
response formats on a 400 before the first answer only, and the next call
asks the way the server last answered; an invalid answer is asked again
once, not when cut at the length limit or past the token allowance; the
usage reported (by the answer or the error) is what every chat completion
said, the malformed ones included; a transient failure carries the wait the
server asked for, and a wait longer than ``max_backoff_s`` holds the next
call unsent; and an error after a re-ask keeps the invalid answer.

A second test runs whole plan runs through a ``Supervisor`` over such an
endpoint, the drawn answers taken in turn whatever each request asks for,
and checks that the run ends, replays to its result, counts the tokens and
calls of every chat completion the server sent (README's budget and cost),
and stops at once, naming the fix, after a rejected key.

Search for new examples with ``pytest --hypothesis-profile=explore
--hypothesis-seed=N`` (see conftest.py).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Any

import anyio
import pytest
from chat_server import Logged, Reply, answer_type, chat_server, completion, error
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from replan import (
    Alignment,
    Limits,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    PlanProposal,
    RunResult,
    RunSpec,
    RunStatus,
    Supervisor,
    Synthesis,
    Task,
    TaskDraft,
    TaskOutcome,
    Verdict,
)
from replan._errors import (
    BudgetExhausted,
    ModelAuthenticationError,
    ModelError,
    ModelOutputError,
    ModelRefusal,
    TransientModelError,
)
from replan.llm import OpenAIModel, Tool
from replan.messages import ToolCall

GOAL = "map the battery market"
TIMEOUT_S = 0.25
MAX_BACKOFF_S = 0.05

# Requests --------------------------------------------------------------------


def lookup(city: str) -> str:
    """Look up a city."""
    return city


@dataclass(frozen=True)
class Kind:
    """A request the model is asked, with a valid answer to it and an
    answer of the wrong shape."""

    name: str
    valid: BaseModel
    wrong: dict[str, Any]
    tools: bool = False

    def request(self, allowance: int | None) -> ModelRequest:
        fields: dict[str, Any] = {"token_allowance": allowance}
        if self.name == "plan":
            return ModelRequest(
                role="planner",
                purpose="plan",
                output_type=PlanProposal,
                context={"goal": GOAL, "metadata": {}},
                **fields,
            )
        if self.name == "execute":
            task = Task(id="t1", key="search", description="search the news")
            return ModelRequest(
                role="executor",
                purpose="execute",
                output_type=TaskOutcome,
                context={
                    "goal": GOAL,
                    "task": task,
                    "dependency_results": {},
                    "attempt": 1,
                },
                tools=[Tool(lookup).spec] if self.tools else [],
                **fields,
            )
        return ModelRequest(
            role="reviewer", purpose="milestone", output_type=Verdict, **fields
        )


KINDS = [
    Kind(
        "plan",
        PlanProposal(
            tasks=[TaskDraft(key="search", description="search the news")],
            rationale="one search",
        ),
        {"tasks": "none"},
    ),
    Kind(
        "execute",
        TaskOutcome(success=True, summary="three surveys found"),
        {"success": "perhaps"},
        tools=True,
    ),
    Kind(
        "execute",
        TaskOutcome(success=True, summary="three surveys found"),
        {"success": "perhaps"},
    ),
    Kind("verdict", Verdict(decision="continue"), {"decision": "maybe"}),
]

# Answers ---------------------------------------------------------------------

RETRYABLE = frozenset({408, 409, 429, 500, 502, 503, 504})
STATUSES = [400, 400, 400, 401, 403, 404, 408, 409, 422, 429, 500, 502, 503, 504]
"""400 thrice: ``auto`` takes it for a response format the server refuses."""

WAITS: list[tuple[str, str, float | None] | None] = [
    None,
    ("retry-after", "0", 0.0),
    ("retry-after", "0.02", 0.02),
    ("retry-after", "1", 1.0),  # more than max_backoff_s: given up at once
    ("retry-after", "soon", None),  # no wait anyone could mean
    ("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date gone by
    ("retry-after-ms", "10", 0.01),
    ("retry-after-ms", "2000", 2.0),
]
"""A status answer's wait header: (name, value, the seconds it means)."""

USAGES = [
    "normal",
    "normal",
    "missing",
    "null",
    "negative",
    "fractional",
    "text",
    "digits",
    "float",
]
"""How a 200 answer reports its tokens."""

COUNTED = [
    "valid",
    "valid",
    "valid",
    "valid_at_length",
    "wrong_shape",
    "prose",
    "empty_content",
    "null_content",
    "invalid_at_length",
    "refusal",
    "content_filter",
    "no_choices",
    "upstream_error",
    "no_message",
    "null_message",
    "message_text",
    "tool_calls",
    "tool_calls",
    "tool_without_arguments",
]
"""200 answers that are chat completions: their usage counts."""

UNCOUNTED = [
    "text_body",
    "empty_text_body",
    "unreadable_json",
    "json_null",
    "json_list",
]
"""200 answers that are no chat completion object."""

WRAPS = ["plain", "fenced", "reasoning", "prose", "parts"]
"""How a valid answer's JSON comes: alone, in a code fence, after a reasoning
model's thinking, inside a sentence, or as a list of content parts."""
TOOL_NAMES = ["lookup", "no_such_tool"]
ARGUMENTS = ['{"city": "Oslo"}', '{"city": ', "", '{"city": 1}', "[]"]
FORMS = ["text", "text", "no_id", "object"]
"""How a tool call comes: as it should, without its id, or with its
arguments as a JSON object rather than as text (when they are one)."""


@dataclass(frozen=True)
class Answer:
    """What the server answers to one request."""

    kind: str
    status: int = 200
    wait: tuple[str, str, float | None] | None = None
    usage: str = "normal"
    tokens: tuple[int, int, int] = (100, 20, 0)
    wrap: str = "plain"
    calls: tuple[tuple[str, str, str], ...] = ()
    """(name, arguments, form) of each tool call."""
    slow: bool = False

    @property
    def retryable(self) -> bool:
        if self.kind in ("dropped", "dropped_mid_body", "timeout"):
            return True
        return self.kind == "status" and self.status in RETRYABLE

    @property
    def asks_to_wait(self) -> float | None:
        return self.wait[2] if self.kind == "status" and self.wait else None

    def counted(self) -> tuple[int, int, int]:
        """The tokens the answer reports, as README says they count."""
        prompt, output, cached = self.tokens
        return {
            "normal": (prompt, output, cached),
            "missing": (0, 0, 0),
            "null": (0, 0, 0),
            "negative": (0, output, 0),
            "fractional": (prompt, 0, 0),
            "text": (0, output, 0),
            "digits": (prompt, output, 0),
            "float": (prompt, output, 0),
        }[self.usage]


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    group = draw(
        st.sampled_from(["status"] * 4 + ["counted"] * 6 + ["uncounted", "broken"])
    )
    if group == "status":
        return Answer(
            "status",
            status=draw(st.sampled_from(STATUSES)),
            wait=draw(st.sampled_from(WAITS)),
        )
    if group == "broken":
        return Answer(
            draw(st.sampled_from(["dropped", "dropped_mid_body", "dropped", "timeout"]))
        )
    if group == "uncounted":
        return Answer(draw(st.sampled_from(UNCOUNTED)))
    kind = draw(st.sampled_from(COUNTED))
    calls: tuple[tuple[str, str, str], ...] = ()
    if kind == "tool_calls":
        calls = tuple(
            draw(
                st.lists(
                    st.tuples(
                        st.sampled_from(TOOL_NAMES),
                        st.sampled_from(ARGUMENTS),
                        st.sampled_from(FORMS),
                    ),
                    min_size=1,
                    max_size=2,
                )
            )
        )
    return Answer(
        kind,
        usage=draw(st.sampled_from(USAGES)),
        tokens=(
            draw(st.sampled_from([0, 100, 250])),
            draw(st.sampled_from([0, 20])),
            draw(st.integers(0, 50)),
        ),
        wrap=draw(st.sampled_from(WRAPS)),
        calls=calls,
        slow=draw(st.booleans()) and draw(st.booleans()),
    )


def reply_for(answer: Answer, kind: Kind) -> Reply:
    """The HTTP answer ``answer`` is."""
    if answer.kind == "status":
        headers = {answer.wait[0]: answer.wait[1]} if answer.wait else {}
        reply = error(answer.status, f"the server says {answer.status}")
        reply.headers.update(headers)
        return reply
    if answer.kind in ("dropped", "dropped_mid_body"):
        reply = completion(kind.valid)
        reply.drop = "unanswered" if answer.kind == "dropped" else "mid_body"
        return reply
    if answer.kind == "timeout":
        reply = completion(kind.valid)
        reply.delay_s = TIMEOUT_S * 4
        return reply
    uncounted = {
        "text_body": Reply(
            body="<html>502 Bad Gateway</html>", headers={"content-type": "text/html"}
        ),
        "empty_text_body": Reply(body="", headers={"content-type": "text/plain"}),
        "unreadable_json": Reply(body='{"id": "chatcmpl-1", "choi'),
        "json_null": Reply(body="null"),
        "json_list": Reply(body="[1, 2]"),
    }
    if answer.kind in uncounted:
        return uncounted[answer.kind]
    reply = completion(
        _content(answer, kind),
        tool_calls=[
            (f"c{i}", name, arguments)
            for i, (name, arguments, _) in enumerate(answer.calls)
        ]
        or None,
        usage=answer.tokens,
        finish_reason={
            "valid_at_length": "length",
            "invalid_at_length": "length",
            "content_filter": "content_filter",
        }.get(answer.kind),
        refusal="I can't help with that." if answer.kind == "refusal" else None,
    )
    body = reply.body
    assert isinstance(body, dict)
    choice = body["choices"][0]
    if answer.kind == "tool_calls":
        listed = choice["message"]["tool_calls"]
        for call, (_, arguments, form) in zip(listed, answer.calls, strict=True):
            if form == "no_id":
                del call["id"]
            elif form == "object" and arguments[:1] == "{" and arguments[-1:] == "}":
                call["function"]["arguments"] = json.loads(arguments)
    elif answer.kind == "tool_without_arguments":
        choice["message"]["tool_calls"] = [
            {"id": "c0", "type": "function", "function": {"name": "lookup"}}
        ]
    elif answer.kind == "no_choices":
        body["choices"] = []
    elif answer.kind == "upstream_error":
        body["choices"] = []
        body["error"] = {"message": "upstream timed out"}
    elif answer.kind == "no_message":
        del choice["message"]
    elif answer.kind == "null_message":
        choice["message"] = None
    elif answer.kind == "message_text":
        choice["message"] = "here is my answer"
    elif answer.wrap == "parts" and isinstance(choice["message"]["content"], str):
        text = choice["message"]["content"]
        choice["message"]["content"] = [
            {"type": "thinking", "thinking": "a search will do"},
            {"type": "text", "text": text[:10]},
            {"type": "text", "text": text[10:]},
        ]
    _set_usage(body, answer)
    reply.delay_s = 0.02 if answer.slow else 0.0
    return reply


def _content(answer: Answer, kind: Kind) -> str | None:
    if answer.kind in ("valid", "valid_at_length", "content_filter"):
        text = kind.valid.model_dump_json()
        return {
            "plain": text,
            "fenced": f"```json\n{text}\n```",
            "reasoning": f"<think>Which {{shape}} fits?</think>\n{text}",
            "prose": f"Sure! {text} Let me know.",
            "parts": text,  # made parts of in reply_for
        }[answer.wrap]
    if answer.kind in ("wrong_shape", "invalid_at_length"):
        return json.dumps(kind.wrong)
    if answer.kind == "prose":
        return "I think the plan should start with a search."
    if answer.kind == "empty_content":
        return ""
    if answer.kind == "refusal":
        return None
    return None  # null content, tool calls, or the shapes set afterwards


def _set_usage(body: dict[str, Any], answer: Answer) -> None:
    prompt, output, _ = answer.tokens
    usage = body["usage"]
    if answer.usage == "missing":
        del body["usage"]
    elif answer.usage == "null":
        body["usage"] = None
    elif answer.usage == "negative":
        usage.update(prompt_tokens=-1, prompt_tokens_details=None)
    elif answer.usage == "fractional":
        usage.update(completion_tokens=2.5, prompt_tokens_details={})
    elif answer.usage == "text":
        usage.update(prompt_tokens="many", prompt_tokens_details=None)
    elif answer.usage == "digits":
        usage.update(completion_tokens=str(output), prompt_tokens_details=None)
    elif answer.usage == "float":
        usage.update(prompt_tokens=float(prompt), prompt_tokens_details=None)


# Scenarios -------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    kind: Kind
    mode: str
    max_retries: int
    allowance: int | None
    calls: int
    """Calls made one after another with the same model."""
    refused: tuple[str, ...]
    """The response formats the server answers 400 to, whatever comes next."""
    answers: tuple[Answer, ...]
    rest: Answer
    """The answer to every request after ``answers``."""

    def stream(self) -> Iterator[Answer]:
        return chain(self.answers, repeat(self.rest))


REFUSALS: list[tuple[str, ...]] = [
    (),
    (),
    ("json_schema",),
    ("json_schema", "json_object"),
]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    return Scenario(
        kind=draw(st.sampled_from(KINDS)),
        mode=draw(st.sampled_from(["auto", "auto", "json_schema", "json_object"])),
        max_retries=draw(st.integers(0, 3)),
        allowance=draw(st.sampled_from([None, None, None, 0, 20, 120, 250, 400])),
        refused=draw(st.sampled_from(REFUSALS)),
        calls=draw(st.sampled_from([1, 2, 2])),
        answers=tuple(draw(st.lists(answers(), max_size=6))),
        rest=draw(answers()),
    )


# What README promises --------------------------------------------------------

FALLBACK = {"json_schema": "json_object", "json_object": "prompt"}
REFUSED = Answer("status", status=400)


@dataclass
class Expected:
    """What one call must come to, step by step from README."""

    error: type[ModelError] | None = None
    answer: Answer | None = None
    """The answer the call returns (a valid one, or tool calls)."""
    answers: list[Answer] = field(default_factory=list)
    """The answers to the call's requests."""
    modes: list[str] = field(default_factory=list)
    """The response format each request asks with."""
    tokens: tuple[int, int, int, int] = (0, 0, 0, 0)
    """Input, output and cached tokens, and calls, of every chat completion."""
    reasked_at: int | None = None
    """The request that asked again for an invalid answer."""
    final: bool = False
    """A ModelOutputError asking once more cannot help."""
    held: float | None = None
    """Not sent: the wait a Retry-After of an earlier call asked for."""


@dataclass
class Endpoint:
    """What README says the model does with the server's answers, call
    after call: the response format ``auto`` asks with is kept per model,
    and a Retry-After longer than ``max_backoff_s`` holds the next call."""

    s: Scenario
    stream: Iterator[Answer]
    mode: str
    held: float | None = None

    def call(self) -> Expected:
        s = self.s
        out = Expected()
        if self.held is not None:
            out.error, out.held = TransientModelError, self.held
            return out
        auto = s.mode == "auto"
        tools = s.kind.tools
        mode = self.mode
        retry = 0
        tokens = [0, 0, 0, 0]

        def done(error: type[ModelError] | None) -> Expected:
            out.error = error
            out.tokens = (tokens[0], tokens[1], tokens[2], tokens[3])
            return out

        while True:
            n = len(out.modes)
            out.modes.append(mode)
            answer = REFUSED if mode in s.refused else next(self.stream)
            out.answers.append(answer)
            if answer.retryable:
                wait = answer.asks_to_wait
                if wait is not None and wait > MAX_BACKOFF_S:
                    self.held = wait
                    return done(TransientModelError)
                if retry >= s.max_retries:
                    return done(TransientModelError)
                retry += 1
                continue
            retry = 0
            if answer.kind == "status":
                if answer.status in (401, 403):
                    return done(ModelAuthenticationError)
                fallback = FALLBACK.get(mode)
                if answer.status == 400 and auto and fallback and not out.reasked_at:
                    mode = fallback
                    continue
                return done(ModelError)
            if answer.kind == "unreadable_json":
                return done(ModelError)
            if auto:  # the server took this format
                self.mode = mode
            if answer.kind in UNCOUNTED:
                return done(ModelOutputError)
            for i, count in enumerate((*answer.counted(), 1)):
                tokens[i] += count
            if answer.kind == "upstream_error":
                return done(ModelError)
            if answer.kind in ("refusal", "content_filter"):
                return done(ModelRefusal)
            if answer.kind in (
                "no_choices",
                "no_message",
                "null_message",
                "message_text",
            ) or (tools and answer.kind == "tool_without_arguments"):
                return done(ModelOutputError)
            if (tools and answer.kind == "tool_calls") or answer.kind in (
                "valid",
                "valid_at_length",
            ):
                out.answer = answer
                return done(None)
            # Invalid: prose, the wrong shape, empty or null content, or tool
            # calls when the request gave no tools.
            if answer.kind == "invalid_at_length" or out.reasked_at is not None:
                out.final = True
                return done(ModelOutputError)
            if s.allowance is not None and tokens[0] + tokens[1] >= s.allowance:
                return done(BudgetExhausted)
            out.reasked_at = n + 1


def expect(s: Scenario) -> list[Expected]:
    mode = "json_schema" if s.mode == "auto" else s.mode
    endpoint = Endpoint(s, s.stream(), mode)
    return [endpoint.call() for _ in range(s.calls)]


# Running ---------------------------------------------------------------------


@dataclass
class Outcome:
    response: ModelResponse | None = None
    error: BaseException | None = None
    requests: list[Logged] = field(default_factory=list)


async def ask(s: Scenario) -> list[Outcome]:
    replies = deque(reply_for(a, s.kind) for a in s.answers)
    rest = reply_for(s.rest, s.kind)

    def script(logged: Logged) -> Reply:
        if format_of(logged) in s.refused:
            return error(400, f"response_format {format_of(logged)} is not supported")
        return replies.popleft() if replies else rest

    outcomes: list[Outcome] = []
    with chat_server(script) as server:
        model = OpenAIModel(
            "gpt-test",
            base_url=server.base_url,
            structured_output=s.mode,  # type: ignore[arg-type]
            max_retries=s.max_retries,
            backoff_s=0.001,
            max_backoff_s=MAX_BACKOFF_S,
            timeout_s=TIMEOUT_S,
        )
        async with model:
            for _ in range(s.calls):
                outcome = Outcome()
                sent = len(server.chat_requests())
                # Never a hang: every request is bounded by timeout_s, every
                # wait by max_backoff_s.
                with anyio.fail_after(10):
                    try:
                        request = s.kind.request(s.allowance)
                        outcome.response = await model.generate(request)
                    except ModelError as exc:
                        outcome.error = exc
                outcome.requests = server.chat_requests()[sent:]
                outcomes.append(outcome)
    return outcomes


def format_of(logged: Logged) -> str:
    return str(logged.body.get("response_format", {}).get("type", "prompt"))


def check(s: Scenario, want: Expected, got: Outcome) -> None:
    asked = len(want.modes)
    assert len(got.requests) == asked, f"{len(got.requests)} requests, {asked} due"
    assert [format_of(r) for r in got.requests] == want.modes

    # A re-ask shows the invalid answer and the problem after the prompt.
    if want.reasked_at is not None and want.reasked_at < asked:
        first = got.requests[0].messages
        reask = got.requests[want.reasked_at].messages
        assert len(reask) == len(first) + 2
        assert reask[-2]["role"] == "assistant"
        assert reask[-1]["role"] == "user"

    if want.error is None:
        response = got.response
        assert response is not None, f"raised {got.error!r}"
        assert want.answer is not None
        if want.answer.kind == "tool_calls":
            assert response.output is None
            assert response.tool_calls == [
                ToolCall(
                    id=f"call_{i}" if form == "no_id" else f"c{i}",
                    name=name,
                    arguments=arguments,
                )
                for i, (name, arguments, form) in enumerate(want.answer.calls)
            ]
        else:
            assert isinstance(response.output, s.kind.request(None).output_type)
            assert response.output == s.kind.valid
            assert not response.tool_calls
        assert bool(response.reask) == (want.reasked_at is not None)
        usage = response.usage
    else:
        exc = got.error
        assert exc is not None, f"answered {got.response!r}"
        assert type(exc) is want.error, f"{type(exc).__name__}: {exc}"
        assert str(exc).strip()
        if isinstance(exc, ModelOutputError):
            assert exc.final == want.final, str(exc)
        if isinstance(exc, TransientModelError):
            check_wait(want, exc)
        check_message(want, str(exc))
        if want.reasked_at is not None and not isinstance(exc, ModelRefusal):
            # An error after a re-ask keeps the invalid answer (the second
            # one, when it is that answer that is invalid again).
            assert exc.raw_output is not None, f"{type(exc).__name__}: {exc}"
        usage = exc.usage
    counted = (
        (usage.input_tokens, usage.output_tokens, usage.cached_tokens, usage.calls)
        if usage is not None
        else (0, 0, 0, 0)
    )
    assert counted == want.tokens


def check_message(want: Expected, message: str) -> None:
    """An error names what went wrong: the server's own message, a timeout,
    a dropped connection (never taken for no connection at all)."""
    if not want.answers:
        return
    last = want.answers[-1]
    if last.kind == "status":
        assert "the server says" in message or "is not supported" in message
        if last.status == 404:
            assert "check the model name and the base URL" in message
    elif last.kind == "timeout":
        assert "timed out" in message
    elif last.kind in ("dropped", "dropped_mid_body"):
        assert "connected, but the server dropped the connection" in message
        assert "cannot connect" not in message


def check_wait(want: Expected, exc: TransientModelError) -> None:
    """A transient failure carries the wait the server asked for."""
    if want.held is not None:
        assert "not sent" in str(exc)
        assert exc.retry_after is not None
        assert 0 < exc.retry_after <= want.held
        return
    last = want.answers[-1].asks_to_wait
    if last is not None and last > MAX_BACKOFF_S:
        assert exc.retry_after is not None
        assert 0 < exc.retry_after <= last
    elif exc.retry_after is not None:
        waits = [a.asks_to_wait or 0.0 for a in want.answers]
        assert 0 < exc.retry_after <= max(waits)


def run_and_check(s: Scenario, backend: str) -> None:
    got = anyio.run(ask, s, backend=backend)
    for want, outcome in zip(expect(s), got, strict=True):
        check(s, want, outcome)


# Some 15 s a backend; the same examples each time (the deterministic profile
# of conftest.py).
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@given(scenario=scenarios())
@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
def test_openai_model_keeps_its_promises_whatever_the_endpoint_answers(
    backend: str, scenario: Scenario
) -> None:
    note(repr(scenario))  # the report's own rendering of it may come out blank
    run_and_check(scenario, backend)


# Whole runs ------------------------------------------------------------------

RUN_KINDS = {
    "PlanProposal": Kind(
        "plan",
        PlanProposal(
            tasks=[
                TaskDraft(key="search", description="search the news"),
                TaskDraft(key="read", description="read the surveys"),
            ]
        ),
        {"tasks": "none"},
    ),
    "TaskOutcome": Kind(
        "execute", TaskOutcome(success=True, summary="found four"), {"success": 3}
    ),
    "Verdict": Kind("verdict", Verdict(decision="continue"), {"decision": "maybe"}),
    "Synthesis": Kind("synthesis", Synthesis(output="the answer"), {"output": []}),
    "Alignment": Kind("alignment", Alignment(aligned=[True] * 10), {"aligned": 1}),
}
FINAL = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.ABORTED,
        RunStatus.LIMIT_REACHED,
        RunStatus.FAILED,
    }
)


@dataclass
class Served:
    """What the server answered a run, request by request."""

    answers: deque[Answer]
    lock: threading.Lock = field(default_factory=threading.Lock)
    counted: list[tuple[int, int, int, int]] = field(default_factory=list)
    """The tokens of every chat completion sent, as they count."""
    rejected_key: int | None = None
    """How many requests had come when the first 401 or 403 was sent."""
    requests: int = 0

    def answer(self, logged: Logged) -> Reply:
        kind = RUN_KINDS[answer_type(logged)]
        with self.lock:
            self.requests += 1
            answer = self.answers.popleft() if self.answers else Answer("valid")
            rejected = answer.kind == "status" and answer.status in (401, 403)
            if rejected and self.rejected_key is None:
                self.rejected_key = self.requests
            if answer.kind in COUNTED:
                self.counted.append((*answer.counted(), 1))
        return reply_for(answer, kind)


@st.composite
def runs(draw: st.DrawFn) -> tuple[int, list[Answer]]:
    return draw(st.integers(0, 2)), draw(st.lists(answers(), max_size=12))


async def run_over(served: Served, max_retries: int) -> tuple[RunResult, RunResult]:
    with chat_server(served.answer) as server:
        model = OpenAIModel(
            "gpt-test",
            base_url=server.base_url,
            max_retries=max_retries,
            backoff_s=0.001,
            max_backoff_s=MAX_BACKOFF_S,
            timeout_s=TIMEOUT_S,
        )
        spec = RunSpec(
            goal=GOAL,
            limits=Limits(max_concurrency=1, retry_backoff_s=0.01, milestone_every=2),
        )
        async with model, Supervisor(model=model, store=MemoryStore()) as sup:
            with anyio.fail_after(30):
                handle = await sup.submit(spec)
                result = await handle.result()
            replayed = await sup.replay(result.run_id)
    return result, replayed


def check_run(served: Served, result: RunResult, replayed: RunResult) -> None:
    assert result.status in FINAL, result.status
    assert replayed == result
    total = result.usage.total
    counted = tuple(sum(column) for column in zip(*served.counted, strict=True))
    got = (total.input_tokens, total.output_tokens, total.cached_tokens, total.calls)
    assert got == (counted or (0, 0, 0, 0))
    for failure in result.model_failures:
        assert failure.message.strip()
    if served.rejected_key is not None:
        # A rejected key stops the run at once, naming the fix.
        assert served.requests == served.rejected_key
        assert result.status is RunStatus.FAILED
        assert "OPENAI_API_KEY" in (result.stop_reason or "")


# Whole runs take longer: fewer of them (some 10 s a backend).
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@given(drawn=runs())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_run_over_an_endpoint_that_answers_at_random_ends_and_counts_its_tokens(
    backend: str, drawn: tuple[int, list[Answer]]
) -> None:
    note(repr(drawn))
    max_retries, drawn_answers = drawn
    served = Served(deque(drawn_answers))
    result, replayed = anyio.run(run_over, served, max_retries, backend=backend)
    check_run(served, result, replayed)
