"""Journaled answers to side-effect tool calls that still stand.

A person's answer to a tool call's gate is journaled before the attempt that
asked acts on it. When a stop (a crash, a kill) cuts the attempt short after
that, the resumed run starts the attempt again under the same number, and
its model makes the call again: the answer journaled for it stands. An
approval lets the call go ahead without a new gate, a rejection refuses it;
each answer is taken once, by the first call of the same tool with the same
arguments (compared as validated values) that has no record in the tool
effect ledger, in the order the calls were asked.

An answer stands only while nothing could have acted on it: when the ledger
holds any record of that very call (tool and arguments) for the task, one
of the journaled approvals may have started it, so the call goes to a person
again, as it did before (a call that returned gets its recorded result
without a gate; one that started and never returned may have acted, and a
person decides whether it runs again under its key).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from ..llm import Tool, ToolArgumentsError
from ..messages import (
    Event,
    GateOpened,
    GateResolution,
    GateResolved,
    TaskInterrupted,
    TaskStarted,
    ToolCall,
)
from ..store import ToolEffectRecord


@dataclass(frozen=True, slots=True)
class ToolCallAnswer:
    """A journaled answer to a side-effect tool call's gate."""

    gate_id: str
    call: ToolCall
    resolution: GateResolution


def interrupted_answers(
    events: Sequence[Event], task_id: str, attempt: int
) -> list[ToolCallAnswer]:
    """The answers the task's attempt ``attempt`` got to its tool calls in its
    runs a stop cut short, in the order the calls asked.

    Empty unless the attempt the journal started last is ``attempt`` run
    again after a stop: the gates of the run now going on do not count (it
    acts on their answers itself), nor those of earlier attempts. An answer
    the supervisor gave (a gate withdrawn because its attempt was cut short)
    is no one's decision and is left out.
    """
    runs: list[str] = []
    """The tool gates of the attempt, across its runs."""
    standing: list[str] = []
    asked: dict[str, ToolCall] = {}
    answers: dict[str, GateResolution] = {}
    current: int | None = None
    interrupted = False
    for event in events:
        match event:
            case TaskStarted(task_id=started, attempt=number) if started == task_id:
                if interrupted and number == current:
                    standing = list(runs)
                else:
                    runs, standing = [], []
                current, interrupted = number, False
            case TaskInterrupted(task_id=stopped) if stopped == task_id:
                interrupted = True
            case GateOpened(request=request) if (
                request.task_id == task_id and request.tool_call is not None
            ):
                runs.append(request.gate_id)
                asked[request.gate_id] = request.tool_call
            case GateResolved(gate_id=gate_id, resolution=resolution) if (
                gate_id in asked
            ):
                answers[gate_id] = resolution
    if current != attempt:
        return []
    return [
        ToolCallAnswer(gate_id, asked[gate_id], answers[gate_id])
        for gate_id in standing
        if gate_id in answers and answers[gate_id].by != "supervisor"
    ]


class StandingAnswers:
    """The answers an attempt run again may act on, each taken at most once."""

    def __init__(
        self,
        answers: Sequence[ToolCallAnswer],
        records: Sequence[ToolEffectRecord],
        tools: Mapping[str, Tool],
    ) -> None:
        self._tools = tools
        recorded = [
            (r.tool, _parsed(tools, r.tool, json.dumps(r.arguments))) for r in records
        ]
        self._left = [
            a
            for a in answers
            if (a.call.name, _parsed(tools, a.call.name, a.call.arguments))
            not in recorded
        ]

    def take(self, tool: str, arguments: BaseModel) -> ToolCallAnswer | None:
        """The first answer left to a call of ``tool`` with ``arguments``."""
        for index, answer in enumerate(self._left):
            if answer.call.name != tool:
                continue
            if _parsed(self._tools, tool, answer.call.arguments) == arguments:
                return self._left.pop(index)
        return None


def _parsed(tools: Mapping[str, Tool], name: str, arguments: str) -> BaseModel | None:
    """``arguments`` validated by the tool ``name``; None when it is gone or
    they no longer fit it (such an answer matches no call)."""
    tool = tools.get(name)
    if tool is None:
        return None
    try:
        return tool.parse(arguments)
    except ToolArgumentsError:
        return None
