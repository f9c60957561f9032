from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, assert_never

from pydantic import JsonValue

from .._errors import ModelError
from ..llm import Model, Tool
from ..messages import (
    ExecuteReply,
    ExecuteRequest,
    Synthesis,
    SynthesizeReply,
    SynthesizeRequest,
    Task,
    TaskOutcome,
)
from ..store import ToolEffectLedger
from ._calls import call_model
from ._escapes import escaped
from ._runtime import ActorContext, mark_request_failed
from ._tool_loop import Approver, ToolLoop


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a user task function receives besides the task."""

    run_id: str
    goal: str
    attempt: int
    idempotency_key: str
    """Stable across retries and restarts: pass it to the side-effecting
    system so that a replay after a crash never performs the effect twice."""
    dependency_results: dict[str, TaskOutcome] = field(default_factory=dict)
    context: list[str] = field(default_factory=list)
    metadata: dict[str, JsonValue] = field(default_factory=dict)


TaskRunner = Callable[[Task, TaskContext], Awaitable[TaskOutcome] | TaskOutcome]
"""``async fn(task, ctx) -> TaskOutcome``: runs tasks instead of the model.

A plain function returning the outcome works too (it runs on the event
loop: keep it quick)."""


class Executor:
    """Runs one task (a user function or the model) and writes the synthesis.

    With the model, a task is a tool loop (see ``ToolLoop``): the model may
    call ``tools`` before it answers; side-effect tools wait for ``approver``
    and are recorded in ``effects``.
    """

    def __init__(
        self,
        model: Model,
        task_runner: TaskRunner | None,
        temperature: float,
        tools: Mapping[str, Tool] | None = None,
        approver: Approver | None = None,
        effects: ToolEffectLedger | None = None,
    ) -> None:
        self._model = model
        self._task_runner = task_runner
        self._temperature = temperature
        self._loop = ToolLoop(model, tools or {}, approver, temperature, effects)

    async def handle(
        self, request: ExecuteRequest | SynthesizeRequest, ctx: ActorContext
    ) -> ExecuteReply | SynthesizeReply:
        match request:
            case ExecuteRequest():
                return await self._execute(request, ctx)
            case SynthesizeRequest():
                synthesis, call = await call_model(
                    self._model,
                    role="executor",
                    purpose="synthesize",
                    output_type=Synthesis,
                    context=request.context,
                    temperature=self._temperature,
                    run_id=ctx.run_id,
                )
                return SynthesizeReply(synthesis=synthesis, calls=[call])
            case _:
                assert_never(request)

    async def _execute(
        self, request: ExecuteRequest, ctx: ActorContext
    ) -> ExecuteReply:
        task = request.task
        context: dict[str, Any] = request.context
        if self._task_runner is not None:
            task_ctx = TaskContext(
                run_id=ctx.run_id or "",
                goal=context.get("goal", ""),
                attempt=task.attempts,
                idempotency_key=f"{ctx.run_id}:{task.id}",
                dependency_results=context.get("dependency_results", {}),
                context=context.get("context", []),
                metadata=context.get("metadata", {}),
            )
            try:
                answer = self._task_runner(task, task_ctx)
                # A plain function's outcome is taken as it is: awaiting it
                # would fail the attempt after its work was done, and run
                # it again.
                outcome = await answer if inspect.isawaitable(answer) else answer
                if not isinstance(outcome, TaskOutcome):
                    raise TypeError(
                        "the task function returned "
                        f"{type(outcome).__name__}, not a TaskOutcome"
                    )
            except ModelError:
                raise  # a model the function asked: reported as the model's
            except Exception as exc:
                # The user's function failed this attempt; the executor is
                # sound and keeps serving.
                mark_request_failed(exc)
                raise
            except BaseException as exc:
                failure = await escaped(exc, "the task function")
                if failure is None:
                    raise  # a real cancellation, KeyboardInterrupt...
                mark_request_failed(failure)
                raise failure from exc
            return ExecuteReply(outcome=outcome)
        return await self._loop.run(request, ctx.run_id or "")
