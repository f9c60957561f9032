from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from .._errors import ModelError
from ..llm import Model, ModelRequest, ModelResponse, Role
from ..messages import ModelCall

T = TypeVar("T", bound=BaseModel)


async def call_model(
    model: Model,
    *,
    role: Role,
    purpose: str,
    output_type: type[T],
    context: dict[str, Any],
    temperature: float,
    run_id: str | None,
    task_id: str | None = None,
) -> tuple[T, ModelCall]:
    """Ask ``model`` for one ``output_type`` answer and report the call's usage.

    The request carries the structured ``context``; adapters for real models
    render the role's prompt from it, scripted models answer from it directly.

    Raises:
        ModelError: the model answered with the wrong type.
    """
    request = ModelRequest(
        role=role,
        purpose=purpose,
        output_type=output_type,
        temperature=temperature,
        run_id=run_id,
        task_id=task_id,
        context=context,
    )
    response = await generate(model, request)
    output = response.output
    if not isinstance(output, output_type):
        raise ModelError(
            f"{role}/{purpose}: expected {output_type.__name__}, "
            f"got {type(output).__name__}"
        )
    return output, ModelCall(role=role, purpose=purpose, usage=response.usage)


async def generate(model: Model, request: ModelRequest) -> ModelResponse:
    """``model.generate`` with any model error marked with where it happened."""
    try:
        return await model.generate(request)
    except ModelError as exc:
        exc.role, exc.purpose, exc.task_id = (
            request.role,
            request.purpose,
            request.task_id,
        )
        raise


class Allowance:
    """The tokens a handler may still spend on its model calls."""

    def __init__(self, tokens: int | None) -> None:
        self._left = tokens

    @property
    def spent(self) -> bool:
        return self._left is not None and self._left <= 0

    def charge(self, call: ModelCall) -> None:
        if self._left is not None:
            self._left -= call.usage.total_tokens
