"""The executor's model path: ask, run the tools the model calls, ask again.

Each step is one model call (so the run's budget is checked before each);
``max_tool_steps`` bounds the loop. A tool's exception, unknown name, bad
arguments or refused approval goes back to the model as a tool error. A
side-effect tool runs only after a person approved the call at a human gate,
with an idempotency key ``run_id:task_id:s<step>c<index>`` that a retry of
the task reuses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .._errors import ModelError
from ..llm import Model, ModelRequest, Tool, ToolArgumentsError
from ..messages import (
    ExecuteReply,
    ExecuteRequest,
    GateResolution,
    ModelCall,
    TaskOutcome,
    TokenUsage,
    ToolCall,
    ToolExchange,
    ToolResult,
)
from ._calls import generate, wrong_answer

Approver = Callable[[str, str, ToolCall], Awaitable[GateResolution]]
"""``await approve(run_id, task_id, call)``: a person's answer at a gate."""


class ToolLoop:
    """Runs one task attempt through the model and the tools it calls."""

    def __init__(
        self,
        model: Model,
        tools: Mapping[str, Tool],
        approver: Approver | None,
        temperature: float,
    ) -> None:
        self._model = model
        self._tools = tools
        self._approver = approver
        self._temperature = temperature

    async def run(self, request: ExecuteRequest, run_id: str) -> ExecuteReply:
        """The task's outcome with every step's usage.

        Raises:
            ModelError: a fatal one (bad credentials, spent budget), with the
                usage of every step so far.
        """
        task = request.task
        calls: list[ModelCall] = []
        transcript: list[ToolExchange] = []
        specs = [t.spec for t in self._tools.values()]
        context: dict[str, Any] = request.context
        try:
            for step in range(1, request.max_tool_steps + 1):
                request_sent = ModelRequest(
                    role="executor",
                    purpose="execute",
                    output_type=TaskOutcome,
                    temperature=self._temperature,
                    run_id=run_id,
                    task_id=task.id,
                    context=context,
                    tools=specs,
                    transcript=list(transcript),
                )
                response = await generate(self._model, request_sent)
                calls.append(_call(response.usage))
                if response.tool_calls and specs:
                    results = [
                        await self._run(call, run_id, task.id, step, index)
                        for index, call in enumerate(response.tool_calls)
                    ]
                    transcript.append(
                        ToolExchange(calls=response.tool_calls, results=results)
                    )
                    continue
                if not isinstance(response.output, TaskOutcome):
                    # Its tokens are in ``calls`` already.
                    raise wrong_answer(request_sent, TaskOutcome, response.output)
                return ExecuteReply(outcome=response.output, calls=calls)
        except ModelError as exc:
            if exc.usage is not None:
                calls.append(_call(exc.usage))
            if exc.fatal:
                exc.usage = sum((c.usage for c in calls), TokenUsage())
                raise
            failure = exc.failure()
            outcome = TaskOutcome(
                success=False, reason=str(exc), transient=exc.transient
            )
            return ExecuteReply(outcome=outcome, calls=calls, failures=[failure])
        return ExecuteReply(
            outcome=TaskOutcome(
                success=False,
                reason=f"max_tool_steps: {request.max_tool_steps} model calls "
                "made without a final answer",
            ),
            calls=calls,
        )

    async def _run(
        self, call: ToolCall, run_id: str, task_id: str, step: int, index: int
    ) -> ToolResult:
        def failed(text: str) -> ToolResult:
            return ToolResult(call_id=call.id, name=call.name, content=text, error=True)

        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            return failed(f"unknown tool {call.name!r}; the tools are: {known}")
        try:
            arguments = tool.parse(call.arguments)
        except ToolArgumentsError as exc:
            return failed(f"invalid arguments: {exc}")
        if tool.side_effect:
            if self._approver is None:
                return failed("side effects need approval, and no one can give it")
            resolution = await self._approver(run_id, task_id, call)
            if resolution.decision != "approve":
                note = f": {resolution.note}" if resolution.note else ""
                return failed(f"the call was not approved by {resolution.by}{note}")
        key = f"{run_id}:{task_id}:s{step}c{index}"
        try:
            content = await tool.run(arguments, idempotency_key=key)
        except Exception as exc:
            return failed(f"{type(exc).__name__}: {exc}")
        return ToolResult(call_id=call.id, name=call.name, content=content)


def _call(usage: TokenUsage) -> ModelCall:
    return ModelCall(role="executor", purpose="execute", usage=usage)
