"""The executor's model path: ask, run the tools the model calls, ask again.

Each step is one model call (so the run's budget is checked before each);
``max_tool_steps`` bounds the loop. A tool's exception, unknown name, bad
arguments or refused approval goes back to the model as a tool error. A
side-effect tool runs only after a person approved the call at a human gate,
with an idempotency key ``run_id:task_id:s<step>c<index>`` that a retry of
the task reuses.

With a tool effect ledger (both stores are), a side-effect call that ran is
recorded with its key as soon as it returns. When a retry of the task, or its
attempt run again after a crash, makes a call that already ran for the task
(same tool, same arguments), the recorded result goes to the model: no gate,
and the tool does not run again. The n-th identical call of an attempt is
matched with the n-th record of it, so a call the model really makes twice
still runs twice. A new call whose key a different call already used gets
the key with ``-2`` (``-3``...) appended: the system acted on must not take
it for a repeat.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from pydantic import BaseModel, JsonValue

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
from ..store import ToolEffectLedger, ToolEffectRecord
from ._calls import generate, wrong_answer

Approver = Callable[[str, str, ToolCall], Awaitable[GateResolution]]
"""``await approve(run_id, task_id, call)``: a person's answer at a gate."""


@dataclass(frozen=True, slots=True)
class ToolLoop:
    """Runs task attempts through the model and the tools it calls."""

    model: Model
    tools: Mapping[str, Tool]
    approver: Approver | None
    temperature: float
    effects: ToolEffectLedger | None = None
    """Where side-effect calls that ran are recorded (None: nowhere)."""

    async def run(self, request: ExecuteRequest, run_id: str) -> ExecuteReply:
        """The task's outcome with every step's usage.

        Raises:
            ModelError: a fatal one (bad credentials, spent budget), with the
                usage of every step so far.
        """
        return await _Attempt(self, request, run_id).run()


class _Attempt:
    """One task attempt: the loop's steps and the side-effect calls it made."""

    def __init__(self, loop: ToolLoop, request: ExecuteRequest, run_id: str) -> None:
        self._loop = loop
        self._request = request
        self._run_id = run_id
        self._ran: list[ToolEffectRecord] | None = None
        """The task's recorded calls not yet matched in this attempt (read
        at its first side-effect call)."""
        self._keys: set[str] = set()
        """Every key the task's side-effect calls used."""

    async def run(self) -> ExecuteReply:
        loop, request, run_id = self._loop, self._request, self._run_id
        task = request.task
        calls: list[ModelCall] = []
        transcript: list[ToolExchange] = []
        specs = [t.spec for t in loop.tools.values()]
        context: dict[str, Any] = request.context
        try:
            for step in range(1, request.max_tool_steps + 1):
                request_sent = ModelRequest(
                    role="executor",
                    purpose="execute",
                    output_type=TaskOutcome,
                    temperature=loop.temperature,
                    run_id=run_id,
                    task_id=task.id,
                    context=context,
                    tools=specs,
                    transcript=list(transcript),
                )
                response = await generate(loop.model, request_sent)
                calls.append(_call(response.usage))
                if response.tool_calls and specs:
                    results = [
                        await self._call_tool(call, task.id, step, index)
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

    async def _call_tool(
        self, call: ToolCall, task_id: str, step: int, index: int
    ) -> ToolResult:
        def failed(text: str) -> ToolResult:
            return ToolResult(call_id=call.id, name=call.name, content=text, error=True)

        loop = self._loop
        tool = loop.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(loop.tools)) or "none"
            return failed(f"unknown tool {call.name!r}; the tools are: {known}")
        try:
            arguments: BaseModel = tool.parse(call.arguments)
        except ToolArgumentsError as exc:
            return failed(f"invalid arguments: {exc}")
        key = f"{self._run_id}:{task_id}:s{step}c{index}"
        if tool.side_effect:
            if loop.approver is None:
                return failed("side effects need approval, and no one can give it")
            values = arguments.model_dump(mode="json")
            ran = await self._ran_before(task_id, call.name, values)
            if ran is not None:
                return ToolResult(call_id=call.id, name=call.name, content=ran.content)
            resolution = await loop.approver(self._run_id, task_id, call)
            if resolution.decision != "approve":
                note = f": {resolution.note}" if resolution.note else ""
                return failed(f"the call was not approved by {resolution.by}{note}")
            key = self._free(key)
        try:
            content = await tool.run(arguments, idempotency_key=key)
        except Exception as exc:
            # Not recorded: whether a side effect happened is unknown, so a
            # retry runs the call again, under the same key.
            return failed(f"{type(exc).__name__}: {exc}")
        if tool.side_effect and loop.effects is not None:
            record = ToolEffectRecord(
                key=key,
                task_id=task_id,
                tool=call.name,
                arguments=values,
                content=content,
            )
            self._keys.add(key)
            # Shielded: the effect happened; a cancellation now must not
            # leave it unrecorded.
            with anyio.CancelScope(shield=True):
                await loop.effects.record_tool_effect(self._run_id, record)
        return ToolResult(call_id=call.id, name=call.name, content=content)

    async def _ran_before(
        self, task_id: str, tool: str, arguments: JsonValue
    ) -> ToolEffectRecord | None:
        """The first recorded run of this call not yet matched in this
        attempt, taken off the list; None if the call is new."""
        effects = self._loop.effects
        if effects is None:
            return None
        if self._ran is None:
            self._ran = await effects.read_tool_effects(self._run_id, task_id)
            self._keys.update(r.key for r in self._ran)
        for i, record in enumerate(self._ran):
            if record.tool == tool and record.arguments == arguments:
                return self._ran.pop(i)
        return None

    def _free(self, key: str) -> str:
        """``key``, or ``key-2``, ``key-3``... if a different call used it."""
        candidate, n = key, 1
        while candidate in self._keys:
            n += 1
            candidate = f"{key}-{n}"
        return candidate


def _call(usage: TokenUsage) -> ModelCall:
    return ModelCall(role="executor", purpose="execute", usage=usage)
