"""Reading a chat completion: its text or tool calls, whatever shape it came in."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from pydantic import ValidationError

from .._errors import ModelOutputError, ModelRefusal
from ..messages import TokenUsage, ToolCall


def brief(exc: BaseException) -> str:
    """An exception in one line, for a message; a group (from a task group
    inside the client) by the exceptions in it, which name the cause."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(brief(inner) for inner in exc.exceptions)[:300]
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def answer(
    choices: Any, tools: bool, where: str, usage: TokenUsage
) -> list[ToolCall] | str:
    """The tool calls (when ``tools``) or else the text of the first choice.

    Raises:
        ModelRefusal: a refusal or a content-filter stop.
        ModelOutputError: an answer of the wrong shape, with ``usage``.
    """

    def wrong(problem: str, raw: object = None) -> ModelOutputError:
        return ModelOutputError(
            f"{where}: {problem}", usage=usage, raw_output=_shown(raw)
        )

    if not choices:
        raise ModelOutputError(
            f"{where}: the answer had no choices", usage=usage, no_completion=True
        )
    if not isinstance(choices, list):
        raise ModelOutputError(
            f"{where}: the answer's choices are {_kind(choices)}, not a list",
            usage=usage,
            raw_output=_shown(choices),
            no_completion=True,
        )
    message = getattr(choices[0], "message", None)
    if message is None:
        raise wrong("the answer's choice had no message")
    if isinstance(message, str | int | float | list):  # JSON the client kept as is
        raise wrong(f"the answer's message is {_kind(message)}, not an object", message)
    content = getattr(message, "content", None)
    if getattr(choices[0], "finish_reason", None) == "content_filter":
        raise ModelRefusal(
            f"{where}: a content filter stopped the answer",
            reason="content_filter",
            usage=usage,
            raw_output=_shown(content),
        )
    refusal = _shown(getattr(message, "refusal", None))
    if refusal:
        raise ModelRefusal(
            f"{where}: the model refused: {refusal}",
            reason="refusal",
            usage=usage,
            raw_output=refusal,
        )
    listed = (getattr(message, "tool_calls", None) or []) if tools else []
    if not isinstance(listed, list):
        raise wrong(f"the answer's tool calls are {_kind(listed)}, not a list", listed)
    try:
        calls = _tool_calls(listed)
    except ValidationError as exc:
        raise wrong(f"a tool call could not be read: {brief(exc)}") from None
    if calls:
        return calls
    text = _text(content)
    if text is None:
        raise wrong(f"the answer's content is {_kind(content)}, not text", content)
    return text


_TEXT_PARTS = frozenset({"text", "output_text"})


def _text(content: object) -> str | None:
    """The text of a message's content: a string, or the text parts of a
    list of content parts (``[{"type": "text", "text": "..."}]``, as some
    servers send) joined; other parts (reasoning, images) are left out.
    None when the content is of another shape."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts: list[str] = []
    for part in content:
        if isinstance(part, dict):
            get = part.get
        elif hasattr(part, "type"):  # a part the client made a model of
            get = partial(getattr, part)
        else:
            return None
        if get("type", None) not in _TEXT_PARTS:
            continue
        text = get("text", None)
        if not isinstance(text, str):
            return None
        texts.append(text)
    return "".join(texts)


def _shown(value: object) -> str | None:
    """``value`` as text for a message or the journal."""
    if value is None:
        return None
    text = _text(value)
    return text if text is not None else json.dumps(value, default=str)


def _kind(value: object) -> str:
    """What a JSON value is, in words."""
    kinds: dict[type, str] = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    return kinds.get(type(value), f"a {type(value).__name__}")


def unparsed_body(completion: Any) -> str | None:
    """What came instead of a chat completion object, in words (a body that
    is no JSON object, which the client hands over as it is), else None."""
    if isinstance(completion, str):
        start = " ".join(completion.split())[:200]
        stream = " (a stream, which was not asked for)" if "data:" in start else ""
        return f"a text body{stream}: {start or '(empty)'}"
    if completion is None or isinstance(completion, bool | int | float | list):
        return f"the body is {'null' if completion is None else _kind(completion)}"
    return None


def reported_error(completion: Any) -> str | None:
    """The error a body with no choices reports in its ``error`` field (a
    proxy that answers 200 with an upstream's error), else None."""
    error = getattr(completion, "error", None)
    if isinstance(error, dict):
        message = error.get("message")
        error = message if isinstance(message, str) and message else error
    if error is None or error == "":
        return None
    text = error if isinstance(error, str) else json.dumps(error, default=str)
    return " ".join(text.split())[:300]


def answered_by(completion: Any, model: str) -> str:
    """The model the answer names, else the one asked."""
    named = getattr(completion, "model", None)
    return named if isinstance(named, str) and named else model


def _tool_calls(listed: list[Any]) -> list[ToolCall]:
    """The answer's tool calls.

    Some OpenAI-compatible servers leave a call's ``id`` out, or send its
    arguments as a JSON object rather than as text: a call without an id
    gets ``call_<index>`` (the results answer it by that id), and arguments
    sent as an object are taken as the JSON text of that object.
    """
    calls = []
    for index, call in enumerate(listed):
        function = getattr(call, "function", None)
        if function is None:
            continue
        call_id = getattr(call, "id", None)
        if call_id is None or call_id == "":
            call_id = f"call_{index}"
        arguments = getattr(function, "arguments", None)
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(
            ToolCall.model_validate(
                {
                    "id": call_id,
                    "name": getattr(function, "name", None),
                    "arguments": arguments,
                }
            )
        )
    return calls
