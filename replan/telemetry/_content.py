"""Captured content: chat messages in the GenAI semantic conventions' form.

With content capture on, a ``chat`` span records ``gen_ai.input.messages``
and ``gen_ai.output.messages`` as the conventions lay them out: a JSON array
of messages, each a ``role`` and a list of typed ``parts`` (``text``,
``tool_call``, ``tool_call_response``), output messages with their
``finish_reason``. Backends that read GenAI spans parse that form; the chat
API's own (``content`` strings, ``tool_calls``, ``tool_call_id``) is turned
into it here.

An attribute is at most :data:`CONTENT_LIMIT` characters. The longest texts
are shortened (ending in "…") until the array fits, so that what is
recorded stays valid JSON.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from ._telemetry import CONTENT_LIMIT, truncate

_SHORTENINGS = 8
"""Rounds of shortening before the JSON is cut as a string."""
_ESCAPE_ROOM = 8
"""Characters kept free per shortened text: its ellipsis and the rounding of
its cut."""


def input_messages(messages: Iterable[Any]) -> str:
    """``gen_ai.input.messages`` for the chat messages a model was sent."""
    return bounded_json([_chat_message(m) for m in messages])


def output_messages(response: Any) -> str:
    """``gen_ai.output.messages`` for a ``ModelResponse``: its tool calls, or
    its output as JSON text."""
    calls = getattr(response, "tool_calls", None) or []
    if calls:
        parts = [_tool_call(c.id, c.name, c.arguments) for c in calls]
        finish = "tool_call"
    else:
        parts = [_text(_json_text(response.output))]
        finish = "stop"
    message = {"role": "assistant", "parts": parts, "finish_reason": finish}
    return bounded_json([message])


def _chat_message(message: Any) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        return {"role": "user", "parts": [_text(_json_text(message))]}
    role = str(message.get("role") or "user")
    parts: list[dict[str, Any]] = []
    if role == "tool":
        parts.append(
            {
                "type": "tool_call_response",
                "id": message.get("tool_call_id"),
                "response": _plain(message.get("content")),
            }
        )
    else:
        parts.extend(_content_parts(message.get("content")))
        for call in message.get("tool_calls") or ():
            if not isinstance(call, Mapping):
                parts.append(_text(_json_text(call)))
                continue
            function = call.get("function") or {}
            parts.append(
                _tool_call(
                    call.get("id"), function.get("name"), function.get("arguments")
                )
            )
    out: dict[str, Any] = {"role": role, "parts": parts}
    if message.get("name"):
        out["name"] = str(message["name"])
    return out


def _content_parts(content: Any) -> list[dict[str, Any]]:
    """A chat message's ``content`` as parts: a string is one text part; the
    chat API's list of parts keeps its parts; anything else (a scripted
    model's structured context) is one text part holding its JSON."""
    if content is None:
        return []
    if isinstance(content, str):
        return [_text(content)]
    if isinstance(content, list):
        parts = []
        for item in content:
            if isinstance(item, Mapping) and item.get("type") == "text":
                parts.append(_text(str(item.get("text", ""))))
            elif isinstance(item, Mapping) and isinstance(item.get("type"), str):
                parts.append(_plain(item))
            else:
                parts.append(_text(_json_text(item)))
        return parts
    return [_text(_json_text(content))]


def _text(content: str) -> dict[str, Any]:
    return {"type": "text", "content": content}


def _tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A ``tool_call`` part; JSON arguments are recorded as the object."""
    if isinstance(arguments, str):
        # Kept as the model wrote them when they are no JSON.
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return {
        "type": "tool_call",
        "id": call_id,
        "name": name,
        "arguments": _plain(arguments),
    }


def _json_text(value: Any) -> str:
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(_plain(value), ensure_ascii=False)


def _plain(value: Any) -> Any:
    return to_jsonable_python(value, fallback=str)


def bounded_json(messages: list[dict[str, Any]], limit: int = CONTENT_LIMIT) -> str:
    """The messages as JSON of at most ``limit`` characters.

    When they are longer, every text (a part's ``content``, a tool's
    ``response``) longer than a common cap is cut to it, the cap as high as
    the limit allows (the short texts are kept whole, the long ones share
    what is left); only an array too long without its texts is cut as a
    string.
    """
    text = _dumps(messages)
    for _ in range(_SHORTENINGS):
        over = len(text) - limit
        if over <= 0:
            return text
        texts = [
            (part, key)
            for message in messages
            for part in message["parts"]
            for key in ("content", "response")
            if isinstance(part.get(key), str) and part[key]
        ]
        sizes = [len(_dumps(part[key])) - 2 for part, key in texts]
        cap = _cap(sizes, sum(sizes) - over - _ESCAPE_ROOM * len(texts))
        changed = False
        for (part, key), size in zip(texts, sizes, strict=True):
            if size > cap:
                value: str = part[key]
                # Escapes make a text longer in JSON: cut in proportion.
                shortened = value[: len(value) * cap // size] + "…"
                changed = changed or shortened != value
                part[key] = shortened
        if not changed:
            break
        text = _dumps(messages)
    return truncate(text, limit)


def _cap(sizes: list[int], budget: int) -> int:
    """The highest cap with ``sum(min(size, cap)) <= budget``."""
    left = budget
    ordered = sorted(sizes)
    for index, size in enumerate(ordered):
        others = len(ordered) - index
        if size * others > left:
            return max(left // others, 0)
        left -= size
    return ordered[-1] if ordered else 0


def _dumps(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, ensure_ascii=False)
