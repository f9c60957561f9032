from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from ..messages import TokenUsage

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
    messages: list[dict[str, str]] = Field(default_factory=list)
    """Chat messages (``role`` and ``content``) for a real model."""
    temperature: float = 0.0
    run_id: str | None = None
    task_id: str | None = None
    context: dict[str, Any] = Field(default_factory=dict)


class ModelResponse(BaseModel):
    """A model's validated answer."""

    model_config = ConfigDict(frozen=True)

    output: BaseModel
    usage: TokenUsage = Field(default_factory=TokenUsage)
    model: str = ""
    latency_s: float = 0.0


@runtime_checkable
class Model(Protocol):
    """The port every model adapter implements."""

    async def generate(self, request: ModelRequest) -> ModelResponse:
        """Answer ``request`` with an instance of ``request.output_type``.

        Raises:
            TransientModelError: a retry may succeed.
            ModelError: the call failed for good.
        """
        ...
