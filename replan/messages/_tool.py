"""Tool calls as they cross the model port, the journal and human gates."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ._base import Frozen


class ToolCall(Frozen):
    """A model's request to run one of the executor's tools."""

    kind: Literal["tool_call"] = "tool_call"
    id: str
    """The model's id for the call (results answer it by this id)."""
    name: str
    arguments: str = "{}"
    """The arguments as the model wrote them: a JSON object, unvalidated."""


class ToolResult(Frozen):
    """What running a tool produced, as the model will read it."""

    kind: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    content: str
    error: bool = False
    """True when the tool failed, was unknown, or was not approved."""


class ToolExchange(Frozen):
    """One step of a tool loop: the calls a model made and their results."""

    kind: Literal["tool_exchange"] = "tool_exchange"
    calls: list[ToolCall]
    results: list[ToolResult] = Field(default_factory=list)
