"""Function tools: schemas from signatures or pydantic models, validation, running."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import json
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel, Field

from replan import (
    ConfigurationError,
    Limits,
    ModelRequest,
    ModelResponse,
    RunSpec,
    RunStatus,
    ScriptedModel,
    Supervisor,
    Synthesis,
    TaskDraft,
    TaskOutcome,
)
from replan.llm import Tool, ToolArgumentsError, tool
from replan.llm._tools import MAX_RESULT_CHARS, as_text
from replan.messages import ToolCall


class Order(BaseModel):
    maker: str
    cells: int = Field(ge=1, description="how many cells")


def test_a_typed_signature_becomes_the_argument_schema() -> None:
    def search(
        query: Annotated[str, Field(description="what to look for")], limit: int = 5
    ) -> str:
        """Search the trade press.

        Longer text the model does not need.
        """
        return query

    spec = Tool(search).spec
    assert spec.name == "search"
    assert spec.description == "Search the trade press."
    assert spec.parameters["required"] == ["query"]
    assert spec.parameters["properties"]["limit"]["default"] == 5
    assert spec.parameters["properties"]["query"]["description"] == "what to look for"
    assert spec.side_effect is False


def test_a_single_pydantic_parameter_is_the_argument_schema() -> None:
    @tool(side_effect=True, name="place_order")
    def order(request: Order, idempotency_key: str) -> str:
        return f"{request.cells} from {request.maker} ({idempotency_key})"

    assert order.spec.name == "place_order"
    assert order.spec.side_effect is True
    assert set(order.spec.parameters["properties"]) == {"maker", "cells"}
    assert order.takes_key


async def test_arguments_are_validated_then_the_tool_runs_with_its_key() -> None:
    @tool
    async def order(request: Order, idempotency_key: str) -> Order:
        await anyio.lowlevel.checkpoint()
        return request.model_copy(
            update={"maker": f"{request.maker}#{idempotency_key}"}
        )

    args = order.parse('{"maker": "QS", "cells": 2}')
    assert await order.run(args, idempotency_key="r:t1:s1c0") == (
        '{"maker":"QS#r:t1:s1c0","cells":2}'
    )
    with pytest.raises(ToolArgumentsError, match="cells"):
        order.parse('{"maker": "QS", "cells": 0}')
    with pytest.raises(ToolArgumentsError):
        order.parse("not json")


async def test_a_sync_tool_runs_in_a_worker_thread_and_its_result_becomes_json() -> (
    None
):
    def count(words: list[str]) -> dict[str, int]:
        return {"words": len(words)}

    t = Tool(count)
    assert await t.run(t.parse('{"words": ["a", "b"]}'), idempotency_key="k") == (
        '{"words": 2}'
    )
    with pytest.raises(ToolArgumentsError, match=r"other: Extra inputs"):
        t.parse('{"words": [], "other": 1}')


async def test_a_tool_with_positional_only_parameters_gets_them_by_position() -> None:
    def scale(value: float, /, factor: float = 2.0) -> float:
        """Scale a value."""
        return value * factor

    @tool
    async def tag(name: str, /, idempotency_key: str) -> str:
        """Tag a name once."""
        return f"{name}@{idempotency_key}"

    scaled = Tool(scale)
    assert await scaled.run(scaled.parse('{"value": 3}'), idempotency_key="k") == "6.0"
    assert await tag.run(tag.parse('{"name": "QS"}'), idempotency_key="k") == "QS@k"


def test_untyped_parameters_and_duplicate_names_are_configuration_errors() -> None:
    def untyped(x):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(TypeError, match="needs a type"):
        Tool(untyped)

    def a(x: int) -> int:
        return x

    with pytest.raises(ConfigurationError) as caught:
        Supervisor(model=ScriptedModel(lambda r: None), tools=[a, Tool(a)])
    assert caught.value.field == "tools"


async def test_a_partial_is_a_tool_of_the_arguments_it_leaves_open() -> None:
    async def search(query: str, index: str, idempotency_key: str) -> str:
        """Search one index."""
        return f"{query} in {index} ({idempotency_key})"

    t = Tool(functools.partial(search, index="news"))
    assert t.spec.name == "search"
    assert t.spec.description == "Search one index."
    # The bound argument is the application's, not the model's.
    assert set(t.spec.parameters["properties"]) == {"query"}
    with pytest.raises(ToolArgumentsError, match="index"):
        t.parse('{"query": "cells", "index": "secrets"}')
    assert await t.run(t.parse('{"query": "cells"}'), idempotency_key="k") == (
        "cells in news (k)"
    )


async def test_a_callable_object_is_a_tool_named_after_its_class() -> None:
    class Lookup:
        """Look a maker up."""

        def __call__(self, maker: str) -> str:
            return maker.upper()

    t = Tool(Lookup())
    assert (t.spec.name, t.spec.description) == ("Lookup", "Look a maker up.")
    assert t.spec.parameters["required"] == ["maker"]
    assert await t.run(t.parse('{"maker": "qs"}'), idempotency_key="k") == "QS"


def logged(fn: Any) -> Any:
    """A decorator that knows nothing of async: it returns what ``fn`` does."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


class AsyncLookup:
    """Look a maker up."""

    async def __call__(self, maker: str) -> str:
        await anyio.lowlevel.checkpoint()
        return maker.upper()


@logged
async def decorated_lookup(maker: str) -> str:
    """Look a maker up."""
    await anyio.lowlevel.checkpoint()
    return maker.upper()


@pytest.mark.parametrize("fn", [AsyncLookup(), decorated_lookup])
async def test_a_tool_whose_call_returns_a_coroutine_has_it_awaited(fn: Any) -> None:
    # An async __call__, or an async function behind a plain decorator, looks
    # like a plain function: on trio its coroutine, made in the worker
    # thread, failed the call ("Trio expected a sync function").
    t = Tool(fn)
    assert await t.run(t.parse('{"maker": "qs"}'), idempotency_key="k") == "QS"


@pytest.mark.parametrize("item", [42, "search", Order])
def test_what_is_no_function_is_refused_as_a_tool(item: object) -> None:
    with pytest.raises(TypeError, match="a tool is a function"):
        Tool(item)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError) as caught:
        Supervisor(model=ScriptedModel(lambda r: None), tools=[item])  # type: ignore[list-item]
    assert caught.value.field == "tools"


@pytest.mark.parametrize("name", ["café", "look up", "x" * 65, "<lambda>"])
def test_a_name_no_model_api_takes_is_one_line_naming_it(name: str) -> None:
    def lookup(word: str) -> str:
        return word

    lookup.__name__ = name
    with pytest.raises(ConfigurationError) as caught:
        Supervisor(model=ScriptedModel(lambda r: None), tools=[lookup])
    assert caught.value.field == "tools"
    assert caught.value.problem == (
        f"tool name {name!r} is not 1 to 64 ASCII letters, digits, '_' or '-', "
        "which model APIs require: give the tool one (name=...)"
    )
    assert Tool(lookup, name="look_up").spec.name == "look_up"


def test_tools_named_by_path_are_found_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from replan.llm._tools import import_tools

    (tmp_path / "desk_tools.py").write_text(
        "from replan import tool\n\n\n"
        "@tool\ndef lookup(word: str) -> str:\n"
        '    """Look a word up."""\n'
        "    return word\n\n\n"
        "def plain(query: str) -> str:\n"
        '    """Search."""\n'
        "    return query\n\n\n"
        "BOTH = [lookup, plain]\n"
    )
    (tmp_path / "broken_tools.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.chdir(tmp_path)
    # As the console script starts: the working directory is not on the path.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    monkeypatch.delitem(sys.modules, "desk_tools", raising=False)
    tools = import_tools(["desk_tools:BOTH"])
    assert [t.name for t in tools] == ["lookup", "plain"]
    assert sys.path[-1] == str(tmp_path)  # appended: it shadows nothing
    with pytest.raises(ConfigurationError) as caught:
        import_tools(["broken_tools:x"])
    assert caught.value.field == "tools"
    assert caught.value.problem == (
        "importing broken_tools raised RuntimeError: boom at import"
    )
    with pytest.raises(ConfigurationError, match="two tools are named 'lookup'"):
        import_tools(["desk_tools:lookup", "desk_tools:BOTH"])


class Unserializable(BaseModel):
    value: Any


def test_a_result_is_always_text_a_journal_can_keep() -> None:
    circular: list[Any] = []
    circular.append(circular)
    assert as_text({(1, 2): "x"}) == "{(1, 2): 'x'}"
    assert as_text("sent \udfff") == "sent ?"
    assert as_text(["\ud800"]) == '["\\ud800"]'  # JSON escapes it: fine as is
    assert as_text(circular) == "[[...]]"
    assert as_text({"n": 1}) == '{"n": 1}'
    assert as_text(Unserializable(value=object())).startswith("Unserializable(")


class Place(BaseModel):
    city: str
    zip: int | None = None


class Size(enum.Enum):
    SMALL = 1
    LARGE = "L"


@dataclasses.dataclass
class Visit:
    place: Place
    on: datetime.date


def test_models_and_dataclasses_inside_a_result_reach_the_model_as_json() -> None:
    # A search tool returning a list of pydantic results: the model reads
    # their fields as JSON, not the str() of each ("city='Paris' zip=None").
    assert json.loads(as_text([Place(city="Paris")])) == [
        {"city": "Paris", "zip": None}
    ]
    visit = Visit(place=Place(city="Lyon", zip=69001), on=datetime.date(2026, 1, 2))
    assert json.loads(as_text({"visits": [visit], "tags": {"a"}})) == {
        "visits": [{"place": {"city": "Lyon", "zip": 69001}, "on": "2026-01-02"}],
        "tags": ["a"],
    }
    assert as_text({"at": object}) == json.dumps({"at": str(object)})
    assert json.loads(as_text([Size.LARGE, {"on": Size.SMALL}])) == ["L", {"on": 1}]


async def test_a_sync_tool_that_hangs_is_abandoned_when_its_call_is_cancelled() -> None:
    released = threading.Event()

    def lookup(topic: str) -> str:
        """Look something up, over a connection that never answers."""
        released.wait(15)
        return topic

    t = Tool(lookup)
    try:
        with anyio.fail_after(5):
            with anyio.move_on_after(0.1) as scope:
                await t.run(t.parse('{"topic": "x"}'), idempotency_key="k")
        assert scope.cancelled_caught
    finally:
        released.set()


async def test_a_sync_side_effect_tool_is_waited_for_when_its_call_is_cancelled() -> (
    None
):
    released = threading.Event()
    sent: list[str] = []

    def send(to: str) -> str:
        """Send a message, over a slow connection."""
        released.wait(5)
        sent.append(to)
        return "sent"

    t = Tool(send, side_effect=True)
    timer = threading.Timer(0.5, released.set)
    timer.start()
    try:
        with anyio.fail_after(10):
            with anyio.move_on_after(0.1):
                await t.run(t.parse('{"to": "ana"}'), idempotency_key="k")
        # What it did is known when the call ends: it was not left running.
        assert sent == ["ana"]
    finally:
        released.set()
        timer.cancel()


def _hangs_first(request: ModelRequest) -> Any:
    if request.purpose == "synthesize":
        return Synthesis(output="done")
    if request.context["attempt"] == 1 and not request.transcript:
        call = ToolCall(id="c1", name="lookup", arguments='{"topic": "x"}')
        return ModelResponse(tool_calls=[call])
    return TaskOutcome(success=True, summary="found it without the tool")


async def test_a_sync_tool_that_hangs_holds_up_neither_the_retry_nor_the_exit() -> None:
    released = threading.Event()

    @tool
    def lookup(topic: str) -> str:
        """Look something up, over a connection that never answers."""
        released.wait(15)
        return topic

    task = TaskDraft(key="look", description="look it up")
    try:
        with anyio.fail_after(5):
            async with Supervisor(
                ScriptedModel(_hangs_first),
                tools=[lookup],
                workers={"executor": 1},
            ) as sup:
                handle = await sup.submit(
                    RunSpec(
                        goal="find x",
                        pattern="contract",
                        tasks=[task],
                        limits=Limits(task_timeout_s=0.2),
                    )
                )
                result = await handle.result()
        assert result.status is RunStatus.COMPLETED
        assert result.tasks[0].attempts == 2
    finally:
        released.set()


async def test_a_huge_result_is_cut_to_max_result_chars_with_a_note() -> None:
    def fetch(url: str) -> str:
        """Fetch a page."""
        return "x" * 1_000_000

    page = Tool(fetch)
    assert page.max_result_chars == MAX_RESULT_CHARS == 16_000  # the documented
    text = await page.run(page.parse('{"url": "u"}'), idempotency_key="k")
    assert text.startswith("x" * MAX_RESULT_CHARS + "\n[")
    assert text.endswith(
        f"[{1_000_000 - MAX_RESULT_CHARS} more characters cut: the tool's "
        f"result is limited to {MAX_RESULT_CHARS} characters]"
    )
    short = Tool(fetch, max_result_chars=10)
    assert (
        await short.run(short.parse('{"url": "u"}'), idempotency_key="k")
    ).startswith("xxxxxxxxxx\n[999990 more characters cut")
    whole = tool(max_result_chars=None)(fetch)
    assert await whole.run(whole.parse('{"url": "u"}'), idempotency_key="k") == (
        "x" * 1_000_000
    )


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "10"])
def test_max_result_chars_is_a_whole_number_from_one(value: object) -> None:
    def fetch(url: str) -> str:
        return url

    with pytest.raises(ValueError, match="max_result_chars"):
        Tool(fetch, max_result_chars=value)  # type: ignore[arg-type]


def _fetches(request: ModelRequest) -> Any:
    if request.purpose == "synthesize":
        return Synthesis(output="done")
    if not request.transcript:
        calls = [
            ToolCall(id="c1", name="fetch", arguments='{"url": "u"}'),
            ToolCall(id="c2", name="fail", arguments='{"url": "u"}'),
        ]
        return ModelResponse(tool_calls=calls)
    return TaskOutcome(success=True, summary="read it")


async def test_the_model_reads_huge_results_and_errors_cut_short() -> None:
    @tool
    async def fetch(url: str) -> str:
        """Fetch a page of megabytes."""
        return "x" * 5_000_000

    @tool(max_result_chars=100)
    async def fail(url: str) -> str:
        """Fail with the whole page in the error."""
        raise ConnectionError("y" * 5_000_000)

    model = ScriptedModel(_fetches)
    async with Supervisor(model, tools=[fetch, fail]) as sup:
        handle = await sup.submit(
            RunSpec(
                goal="read the page",
                pattern="contract",
                tasks=[TaskDraft(key="read", description="read the page")],
            )
        )
        result = await handle.result()
    assert result.status is RunStatus.COMPLETED
    step = model.calls_for("executor", "execute")[-1]
    page, error = step.transcript[0].results
    assert len(page.content) < MAX_RESULT_CHARS + 100
    assert not page.error
    assert error.error
    assert error.content.startswith("ConnectionError: yyy")
    assert len(error.content) < 200


def _calls_each_tool(request: ModelRequest) -> Any:
    if request.purpose == "synthesize":
        return Synthesis(output="done")
    if not request.transcript:
        name = request.context["task"].description
        return ModelResponse(
            tool_calls=[ToolCall(id="c1", name=name, arguments='{"account": "a1"}')]
        )
    result = request.transcript[-1].results[0]
    return TaskOutcome(success=not result.error, summary=result.content)


async def test_a_tool_that_calls_sys_exit_fails_its_call_not_the_application() -> None:
    def close_account(account: str) -> str:
        """Close an account, the way a command-line helper does."""
        sys.exit(f"no such account: {account}")

    async def freeze_account(account: str) -> str:
        """Freeze an account."""
        raise SystemExit(2)

    tasks = [
        TaskDraft(key=name, description=name)
        for name in ("close_account", "freeze_account")
    ]
    with anyio.fail_after(10):
        async with Supervisor(
            ScriptedModel(_calls_each_tool), tools=[close_account, freeze_account]
        ) as sup:
            handle = await sup.submit(
                RunSpec(goal="tidy accounts", pattern="contract", tasks=tasks)
            )
            result = await handle.result()
    assert result.status is RunStatus.ABORTED  # every task failed
    outcomes = [t.result for t in result.tasks]
    assert [o.summary for o in outcomes if o is not None] == [
        "SystemExit: no such account: a1",
        "SystemExit: 2",
    ]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_tool_raising_a_stray_cancellation_fails_its_call_only() -> None:
    # Only asyncio code can raise a cancellation that no scope sent: a tool
    # awaiting a task of its own that something else cancelled.
    import asyncio  # noqa: TID251 - a stray asyncio.CancelledError

    async def close_account(account: str) -> str:
        """Close an account through a client whose request was cancelled."""
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        await future
        return "closed"

    tasks = [TaskDraft(key="close", description="close_account")]
    with anyio.fail_after(10):
        async with Supervisor(
            ScriptedModel(_calls_each_tool),
            tools=[close_account],
            max_restarts=0,
        ) as sup:
            handle = await sup.submit(
                RunSpec(goal="tidy accounts", pattern="contract", tasks=tasks)
            )
            result = await handle.result()
            executor = next(p for p in sup.pool_statistics() if p.role == "executor")
    assert result.status is RunStatus.ABORTED  # its one task failed
    outcome = result.tasks[0].result
    assert outcome is not None
    assert outcome.summary == (
        "the tool close_account raised a cancellation that nothing had asked "
        "for (CancelledError)"
    )
    assert not executor.stopped
    assert executor.restarts == 0
