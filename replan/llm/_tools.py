"""Function tools: Python callables the executor may run for the model.

A tool's arguments come from its signature (typed parameters) or from one
pydantic model parameter; either way the model sees a JSON schema and the
arguments it sends are validated before the function runs. A tool that takes
an ``idempotency_key`` parameter receives a key that is stable for the call
(``run_id:task_id:s<step>c<index>``), so a side effect is not repeated when a
task is retried.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, get_type_hints, overload

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import to_jsonable_python

from .._errors import ConfigurationError, ReplanError
from .._importing import import_named

KEY_PARAMETER = "idempotency_key"

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What chat APIs take as a function's name."""

MAX_RESULT_CHARS = 16_000
"""The most characters of a tool's result the model reads by default
(about 4,000 tokens): a page, a file or a query result of megabytes would
make every later step of the loop a prompt too long for the model."""


class ToolSpec(BaseModel):
    """What a model is told about a tool."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(pattern=rf"^{_NAME.pattern}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    """The JSON schema of the arguments object."""
    side_effect: bool = False
    """Running it changes the world: a person approves each call first."""


class ToolArgumentsError(ReplanError, ValueError):
    """The model's arguments are not valid JSON for the tool's schema."""


class Tool:
    """A callable registered as a function tool.

    Args:
        fn: the function (sync or async). Its parameters are the tool's
            arguments, or it takes one pydantic model holding them.
        name: the name the model calls it by (the function's name by default).
        description: what it does (the docstring's first paragraph by default).
        side_effect: the call changes something outside the run (sends,
            writes, pays): each call waits for approval at a human gate.
        max_result_chars: the most characters of a result (or an error) the
            model reads; a longer one is cut there, with a note saying how
            much was left out. None: no bound.

    Raises:
        TypeError: ``fn`` is no function, or its parameters cannot be
            described.
        ValueError: the name is not one model APIs take (1 to 64 ASCII
            letters, digits, ``_`` or ``-``), or ``max_result_chars`` is no
            whole number from 1.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        side_effect: bool = False,
        max_result_chars: int | None = MAX_RESULT_CHARS,
    ) -> None:
        if isinstance(fn, type) or not callable(fn):
            raise TypeError(f"a tool is a function, not {type(fn).__name__}")
        named, annotated = _described(fn)
        self.fn = fn
        given = name or getattr(named, "__name__", None)
        if not isinstance(given, str) or not given:
            raise TypeError(f"{fn!r} has no name: give the tool one (name=...)")
        if not _NAME.fullmatch(given):
            # Checked here, not by ToolSpec: one line naming the fix.
            raise ValueError(
                f"tool name {given!r} is not 1 to 64 ASCII letters, digits, "
                "'_' or '-', which model APIs require: give the tool one "
                "(name=...)"
            )
        self.name = given
        doc = inspect.getdoc(named) or ""
        self.description = (
            description if description is not None else doc.split("\n\n")[0]
        )
        self.side_effect = side_effect
        if max_result_chars is not None and (
            isinstance(max_result_chars, bool)
            or not isinstance(max_result_chars, int)
            or max_result_chars < 1
        ):
            raise ValueError(
                f"tool {self.name}: max_result_chars must be a whole number "
                f"from 1, or None, not {max_result_chars!r}"
            )
        self.max_result_chars = max_result_chars
        self._model, self._packed = _arguments_model(fn, annotated, self.name)
        parameters = inspect.signature(fn).parameters
        self.takes_key = KEY_PARAMETER in parameters
        self._positional = [
            p.name for p in parameters.values() if p.kind is p.POSITIONAL_ONLY
        ]
        """Parameters that cannot be passed by name (``def f(x: int, /)``)."""
        self.spec = ToolSpec(
            name=self.name,
            description=self.description,
            parameters=_schema(self._model),
            side_effect=side_effect,
        )

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, side_effect={self.side_effect})"

    def parse(self, arguments: str) -> BaseModel:
        """Validate the model's arguments.

        Raises:
            ToolArgumentsError: naming what is wrong, for the model to fix.
        """
        try:
            return self._model.model_validate_json(arguments or "{}")
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ToolArgumentsError(problems) from None

    async def run(self, arguments: BaseModel, *, idempotency_key: str) -> str:
        """Run the tool and return its result as text for the model."""
        if self._packed is not None:
            kwargs: dict[str, Any] = {self._packed: arguments}
        else:
            kwargs = {k: getattr(arguments, k) for k in type(arguments).model_fields}
        if self.takes_key:
            kwargs[KEY_PARAMETER] = idempotency_key
        args = [kwargs.pop(name) for name in self._positional if name in kwargs]
        if inspect.iscoroutinefunction(self.fn):
            result = await self.fn(*args, **kwargs)
        else:
            # A thread cannot be stopped. One without side effects is
            # abandoned when cancelled (a task_timeout_s, a cancel, the
            # supervisor's exit): waiting for it would hold its executor
            # worker and the supervisor's exit for as long as it hangs, for
            # a result no one reads. A side effect's is waited for: it has
            # acted, and its result goes to the effect ledger.
            # Boxed: a function that returns a coroutine (an async
            # __call__, an async function behind a plain decorator) has it
            # awaited here; trio refuses a coroutine out of a thread.
            (result,) = await anyio.to_thread.run_sync(
                lambda: (self.fn(*args, **kwargs),),
                abandon_on_cancel=not self.side_effect,
            )
            if inspect.isawaitable(result):
                result = await _await(result)
        return self.bounded(as_text(result))

    def bounded(self, text: str) -> str:
        """``text`` cut to ``max_result_chars``, with a note of the rest."""
        limit = self.max_result_chars
        if limit is None or len(text) <= limit:
            return text
        return (
            f"{text[:limit]}\n[{len(text) - limit} more characters cut: "
            f"the tool's result is limited to {limit} characters]"
        )


async def _await(value: Awaitable[Any]) -> Any:
    return await value


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    side_effect: bool = False,
    max_result_chars: int | None = MAX_RESULT_CHARS,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    side_effect: bool = False,
    max_result_chars: int | None = MAX_RESULT_CHARS,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` of a function: ``@tool`` or ``@tool(side_effect=True)``."""
    if fn is not None:
        return Tool(fn)

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(
            f,
            name=name,
            description=description,
            side_effect=side_effect,
            max_result_chars=max_result_chars,
        )

    return wrap


def as_tools(tools: list[Tool | Callable[..., Any]]) -> dict[str, Tool]:
    """A name -> tool registry; plain callables become tools.

    Raises:
        ValueError: two tools share a name.
    """
    registry: dict[str, Tool] = {}
    for item in tools:
        t = item if isinstance(item, Tool) else Tool(item)
        if t.name in registry:
            raise ValueError(f"two tools are named {t.name!r}")
        registry[t.name] = t
    return registry


def import_tools(paths: Sequence[str]) -> list[Tool]:
    """The tools ``paths`` name, ``module:name`` each: a tool, a function,
    or a list or tuple of them (what ``replan run --tool`` and ``replan
    serve --tool`` take).

    Raises:
        ConfigurationError: a path cannot be imported, names no tool, or two
            tools share a name (field ``tools``).
    """
    found: list[Tool | Callable[..., Any]] = []
    for path in paths:
        value = import_named(path, "tools", f"use module:name, not {path!r}")
        for item in list(value) if isinstance(value, list | tuple) else [value]:
            if not (isinstance(item, Tool) or callable(item)):
                raise ConfigurationError(
                    "tools", f"{path}: {type(item).__name__} is not a tool"
                )
            found.append(item)
    try:
        return list(as_tools(found).values())
    except (TypeError, ValueError) as exc:
        raise ConfigurationError("tools", str(exc)) from None


def as_text(result: Any) -> str:
    """A tool's result as the model reads it (and the tool effect ledger
    keeps it). Never raises: the tool has run, whatever it returned. What
    JSON cannot hold (keys that are no strings) is shown by ``repr``; a lone
    UTF-16 surrogate, no text for any journal, becomes ``?``."""
    try:
        if isinstance(result, str):
            text = result
        elif isinstance(result, BaseModel):
            text = result.model_dump_json()
        else:
            text = json.dumps(result, default=_jsonable)
    except (TypeError, ValueError):  # PydanticSerializationError included
        text = repr(result)
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode(errors="replace").decode()
    return text


def _jsonable(value: Any) -> Any:
    """What ``json`` cannot encode by itself, as JSON values: a pydantic
    model or a dataclass in a list or a mapping as its fields (not as the
    ``str`` of it, ``city='Paris' zip=None``), a date in ISO format, an enum
    as its value, a set as a list; anything else as its ``str``."""
    return to_jsonable_python(value, fallback=str)


def _described(fn: Callable[..., Any]) -> tuple[Any, Callable[..., Any]]:
    """What names and documents ``fn``, and what holds its annotations:
    the function itself, the one a ``functools.partial`` wraps, or a
    callable object's class and its ``__call__``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isroutine(fn):
        return fn, fn
    return type(fn), type(fn).__call__


def _bound_keywords(fn: Callable[..., Any]) -> set[str]:
    """The arguments a ``functools.partial`` fixed by keyword: not the
    model's to choose."""
    bound: set[str] = set()
    while isinstance(fn, functools.partial):
        bound.update(fn.keywords)
        fn = fn.func
    return bound


def _arguments_model(
    fn: Callable[..., Any], annotated: Callable[..., Any], name: str
) -> tuple[type[BaseModel], str | None]:
    """The pydantic model of the arguments, and the parameter that takes it
    whole (when the function has one pydantic model parameter)."""
    try:
        hints = get_type_hints(annotated, include_extras=True)
    except Exception as exc:  # an annotation that names nothing importable
        raise TypeError(f"tool {name}: its annotations cannot be read: {exc}") from None
    bound = _bound_keywords(fn)
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.name != KEY_PARAMETER and p.name not in bound
    ]
    if len(params) == 1:
        hint = hints.get(params[0].name)
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            return hint, params[0].name
    fields: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {name}: *args and **kwargs cannot be described")
        if p.name not in hints:
            raise TypeError(f"tool {name}: parameter {p.name!r} needs a type")
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (hints[p.name], default)
    model = create_model(
        f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )
    return model, None


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    schema.setdefault("properties", {})
    return schema
