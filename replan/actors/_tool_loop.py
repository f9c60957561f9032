"""The executor's model path: ask, run the tools the model calls, ask again.

Each step is one model call (so the run's budget is checked before each);
``max_tool_steps`` bounds the loop. A tool's exception, unknown name, bad
arguments or refused approval goes back to the model as a tool error. A
side-effect tool runs only after a person approved the call at a human gate,
with an idempotency key ``run_id:task_id:s<step>c<index>`` that a retry of
the task reuses.

With a tool effect ledger (both stores are), a side-effect call is recorded
(tool, validated arguments, key) before the tool runs, and its result as
soon as it returns. When a retry of the task, or its attempt run again after
a crash, makes a call that returned before (same tool, same arguments), the
recorded result goes to the model: no gate, and the tool does not run again.
The n-th identical call of an attempt matches the n-th record of it, so a
call the model really makes twice still runs twice. A call recorded as
started that never returned (it raised, or the process stopped) may have
acted: the same call made again runs again, after approval, under the same
key. A new call gets the key of its step and position unless a different
call took it, then ``-2`` (``-3``...) appended, so the system acted on never
takes it for a repeat.

A person's answer stands once journaled: an attempt run again after a stop
cut it short takes the answers its earlier runs got to calls that never
started (see ``_tool_answers``) instead of opening new gates, so an approved
call goes ahead, once, under its key, and a rejected one is refused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from pydantic import BaseModel

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
from ..messages._base import built
from ..store import Store, ToolEffectLedger, ToolEffectRecord
from ..telemetry import tool_call
from ._calls import answer, made_at, wrong_answer
from ._escapes import escaped
from ._runtime import waiting_for_a_person
from ._tool_answers import StandingAnswers, ToolCallAnswer, interrupted_answers

logger = logging.getLogger("replan.actors")

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
        self._used: set[str] = set()
        """The keys of the calls this attempt ran or matched (not those that
        raised: made again, they run again under the same key)."""
        self._answers: StandingAnswers | None = None
        """Answers journaled by earlier runs of this attempt that still stand
        (read when a call first needs an answer)."""

    async def run(self) -> ExecuteReply:
        loop, request, run_id = self._loop, self._request, self._run_id
        task = request.task
        calls: list[ModelCall] = []
        transcript: list[ToolExchange] = []
        specs = [t.spec for t in loop.tools.values()]
        context: dict[str, Any] = request.context
        try:
            for step in range(1, request.max_tool_steps + 1):
                # Of validated parts, copied as validation copies them (the
                # model may change its request's): not checked again, once
                # per model call.
                request_sent = built(
                    ModelRequest,
                    {
                        "role": "executor",
                        "purpose": "execute",
                        "output_type": TaskOutcome,
                        "temperature": float(loop.temperature),
                        "run_id": run_id,
                        "task_id": task.id,
                        "context": dict(context),
                        "tools": list(specs),
                        "transcript": list(transcript),
                    },
                )
                response = await answer(loop.model, request_sent)
                calls.append(_call(response.usage))
                if response.tool_calls and specs:
                    if step == request.max_tool_steps:
                        # No model call is left to read their results: the
                        # tools (side effects above all) are not run.
                        break
                    results = [
                        await self._call_tool(call, task.id, step, index)
                        for index, call in enumerate(response.tool_calls)
                    ]
                    transcript.append(
                        ToolExchange(calls=response.tool_calls, results=results)
                    )
                    continue
                if response.tool_calls and not specs:
                    # A scripted model, or a run resumed on a supervisor
                    # built without the tools it started with.
                    names = ", ".join(sorted({c.name for c in response.tool_calls}))
                    raise made_at(
                        ModelError(
                            f"executor/execute: the model asked for tools "
                            f"({names}) but the supervisor has none: pass "
                            "tools=[...] to Supervisor (as when the run started)"
                        ),
                        request_sent,
                    )
                if not isinstance(response.output, TaskOutcome):
                    # Its tokens are in ``calls`` already.
                    raise wrong_answer(request_sent, TaskOutcome, response.output)
                # Of validated parts (the model's answer, the calls' usage):
                # not checked again, once per execution.
                return built(ExecuteReply, {"outcome": response.output, "calls": calls})
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
                "made without a final answer (the tools the last one asked "
                "for were not run)",
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
            return await self._side_effect(call, tool, arguments, task_id, key)
        return await _traced_run(call, tool, arguments, key, self._run_id)

    async def _side_effect(
        self, call: ToolCall, tool: Tool, arguments: BaseModel, task_id: str, key: str
    ) -> ToolResult:
        """Run a side-effect call once: its recorded result if it returned
        before, else a person's approval, then the tool under its key."""

        def failed(text: str) -> ToolResult:
            return ToolResult(call_id=call.id, name=call.name, content=text, error=True)

        loop, run_id = self._loop, self._run_id
        if loop.approver is None:
            return failed("side effects need approval, and no one can give it")
        effects = loop.effects
        before = await self._recorded(task_id, call.name, arguments)
        if before is not None and before.content is not None:
            return self._reused(call, tool, before)
        journaled = None
        if before is None:
            journaled = await self._journaled(task_id, call.name, arguments)
        if journaled is not None:
            resolution = journaled.resolution
            logger.info(
                "tool call %s of task %s: the answer journaled at gate %s stands "
                "(%s by %s)",
                call.name,
                task_id,
                journaled.gate_id,
                resolution.decision,
                resolution.by,
            )
        else:
            with waiting_for_a_person():
                resolution = await loop.approver(run_id, task_id, call)
        if resolution.decision != "approve":
            note = f": {resolution.note}" if resolution.note else ""
            return failed(f"the call was not approved by {resolution.by}{note}")
        record: ToolEffectRecord | None = None
        if effects is not None:
            # Read again: the wait for a person may have been long.
            records = await effects.read_tool_effects(run_id, task_id)
            before = self._match(records, call.name, arguments)
            if before is not None and before.content is not None:
                return self._reused(call, tool, before)
            if before is not None:
                # The same call ran and its outcome is unknown (it raised,
                # or the process stopped): again under its key.
                key = before.key
            else:
                key = _free(key, {r.key for r in records} | self._used)
            record = ToolEffectRecord(
                key=key,
                task_id=task_id,
                tool=call.name,
                arguments=arguments.model_dump(mode="json"),
            )
            try:
                # Before the tool runs: the key is taken from now on.
                await effects.record_tool_effect(run_id, record)
            except Exception as exc:
                logger.warning("tool call %s not run: %s", key, exc)
                return failed(f"the call could not be recorded before it ran: {exc}")
        self._used.add(key)
        result = await _traced_run(call, tool, arguments, key, run_id)
        if result.error:
            # Recorded as started only: whether it acted is unknown, so the
            # same call made again, in this attempt or a later one, runs
            # again under the same key.
            self._used.discard(key)
            return result
        content = result.content
        if effects is not None and record is not None:
            done = record.model_copy(update={"content": content})
            # Shielded: the effect happened; a cancellation now must not
            # leave it unrecorded.
            with anyio.CancelScope(shield=True):
                try:
                    await effects.record_tool_effect(run_id, done)
                except Exception as exc:
                    # The started record keeps the key: a repeat runs under it.
                    logger.warning("tool call %s ran but is not recorded: %s", key, exc)
        return result

    def _reused(
        self, call: ToolCall, tool: Tool, record: ToolEffectRecord
    ) -> ToolResult:
        """The recorded result of a side-effect call that ran before."""
        assert record.content is not None
        self._used.add(record.key)
        spec = tool.spec
        with tool_call(call, spec.description, True, record.key, self._run_id) as done:
            done("reused", record.content, None)
        return ToolResult(call_id=call.id, name=call.name, content=record.content)

    async def _journaled(
        self, task_id: str, tool: str, arguments: BaseModel
    ) -> ToolCallAnswer | None:
        """The answer a run of this attempt that a stop cut short got to this
        very call, if it still stands (taken: it answers one call only)."""
        if self._answers is None:
            self._answers = await self._standing(task_id)
        return self._answers.take(tool, arguments)

    async def _standing(self, task_id: str) -> StandingAnswers:
        """Which answers still stand, from the journal and the ledger as they
        are when a call first needs an answer (this run of the attempt has
        recorded no call of its own by then, only run again calls the
        ledger held already)."""
        tools = self._loop.tools
        journal = self._loop.effects
        if not isinstance(journal, Store):
            return StandingAnswers([], [], tools)  # no journal to read them in
        try:
            events = await journal.read(self._run_id)
            records = await journal.read_tool_effects(self._run_id, task_id)
        except Exception as exc:
            logger.warning("journaled tool call answers not read: %s", exc)
            return StandingAnswers([], [], tools)  # a person is asked again
        attempt = self._request.task.attempts
        answers = interrupted_answers(events, task_id, attempt)
        return StandingAnswers(answers, records, tools)

    async def _recorded(
        self, task_id: str, tool: str, arguments: BaseModel
    ) -> ToolEffectRecord | None:
        """The task's first record of this very call not yet used by this
        attempt, or None (and None without a ledger)."""
        effects = self._loop.effects
        if effects is None:
            return None
        records = await effects.read_tool_effects(self._run_id, task_id)
        return self._match(records, tool, arguments)

    def _match(
        self, records: list[ToolEffectRecord], tool: str, arguments: BaseModel
    ) -> ToolEffectRecord | None:
        """The first record of ``tool`` called with ``arguments`` whose key
        this attempt has not used. Arguments are compared as validated
        values, read back through the tool's own argument model (so a set
        matches whatever order it was stored in)."""
        spec = self._loop.tools.get(tool)
        if spec is None:
            return None
        for record in records:
            if record.tool != tool or record.key in self._used:
                continue
            try:
                recorded = spec.parse(json.dumps(record.arguments))
            except ToolArgumentsError:
                continue  # the tool's arguments changed since
            if recorded == arguments:
                return record
        return None


async def _traced_run(
    call: ToolCall, tool: Tool, arguments: BaseModel, key: str, run_id: str
) -> ToolResult:
    """Run the tool in its ``execute_tool`` span; an exception it raises
    becomes an error result for the model. So does ``sys.exit()``: a tool
    (or a library it calls, argparse say) that exits ends its call, not the
    application the supervisor runs in."""
    spec = tool.spec
    with tool_call(call, spec.description, spec.side_effect, key, run_id) as done:
        try:
            content = await tool.run(arguments, idempotency_key=key)
        except (Exception, SystemExit) as exc:
            text = tool.bounded(f"{type(exc).__name__}: {exc}")
            done("failed", text, exc)
            return ToolResult(call_id=call.id, name=call.name, content=text, error=True)
        except BaseException as exc:
            # A cancellation the tool raised that nothing sent (asyncio code
            # awaiting a task something else cancelled): its error too.
            failure = await escaped(exc, f"the tool {call.name}")
            if failure is None:
                raise
            text = tool.bounded(str(failure))
            done("failed", text, failure)
            return ToolResult(call_id=call.id, name=call.name, content=text, error=True)
        done("ran", content, None)
    return ToolResult(call_id=call.id, name=call.name, content=content)


def _free(key: str, taken: set[str]) -> str:
    """``key``, or ``key-2``, ``key-3``... the first no other call took."""
    candidate, n = key, 1
    while candidate in taken:
        n += 1
        candidate = f"{key}-{n}"
    return candidate


def _call(usage: TokenUsage) -> ModelCall:
    return built(ModelCall, {"role": "executor", "purpose": "execute", "usage": usage})
