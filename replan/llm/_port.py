from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from ..messages import TokenUsage, ToolCall, ToolExchange
from ._tools import ToolSpec

Role = Literal["planner", "executor", "reviewer", "ranker", "evolver"]


class ModelRequest(BaseModel):
    """What an actor asks a model for.

    ``context`` holds the structured inputs the prompt was built from, so a
    scripted model can answer without parsing prompts (see DESIGN.md section 5).
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    role: Role
    purpose: str
    """``plan``, ``replan``, ``boundary``, ``execute``, ``synthesize``,
    ``milestone``, ``critique``, ``alignment``, ``compare`` or ``evolve``."""
    output_type: type[BaseModel]
    messages: list[dict[str, Any]] = Field(default_factory=list)
    """Chat messages (``role`` and ``content``). Empty: adapters render the
    role's prompt template from ``context``; given: sent as they are."""
    temperature: float = 0.0
    run_id: str | None = None
    task_id: str | None = None
    context: dict[str, Any] = Field(default_factory=dict)
    tools: list[ToolSpec] = Field(default_factory=list)
    """Tools the model may call instead of answering (executor tool loops)."""
    transcript: list[ToolExchange] = Field(default_factory=list)
    """The tool calls made so far in this loop, with their results."""
    token_allowance: int | None = None
    """Tokens the run may still spend (None: no budget). An adapter that
    would make a further call for this request (a re-ask) makes none past it."""


class ModelResponse(BaseModel):
    """A model's validated answer, or the tools it wants to call first."""

    model_config = ConfigDict(frozen=True)

    output: BaseModel | None = None
    """An instance of the request's ``output_type``; None when the model
    asks for ``tool_calls`` instead."""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: TokenUsage = Field(default_factory=TokenUsage)
    model: str = ""
    latency_s: float = 0.0
    prompt_version: str | None = None
    """The prompt template used (``planner.replan@2``), for the journal and
    telemetry; None when the request's own messages were sent."""
    reask: list[dict[str, Any]] = Field(default_factory=list)
    """The chat turns a re-ask added after the prompt (the invalid answer
    and the request to answer again), for telemetry; empty when the first
    answer was used."""


@runtime_checkable
class Model(Protocol):
    """The port every model adapter implements.

    Adapters also expose ``provider_name`` (``openai``, ``vllm``,
    ``scripted``...) and ``model_for(role) -> str`` for telemetry; those are
    optional for user models.
    """

    async def generate(self, request: ModelRequest) -> ModelResponse:
        """Answer ``request`` with an instance of ``request.output_type``.

        Raises:
            TransientModelError: a retry may succeed.
            ModelError: the call failed for good.
        """
        ...
