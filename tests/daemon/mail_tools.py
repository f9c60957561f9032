"""A side-effect tool and a model that calls it, for the daemon under test.

Loaded as ``--model python:mail_tools:model --tool mail_tools:send_email``.
The first task emails ``ana`` before it answers; every email sent appends
``to key`` to the file ``REPLAN_TEST_OUTBOX`` names. With
``REPLAN_TEST_HOLD_S`` set, the first task holds that long after its email
before it answers (long enough to kill the daemon there).
"""

from __future__ import annotations

import os
from typing import Any

import anyio

from replan import ModelRequest, ModelResponse, ScriptedModel, Task, tool
from replan._demo import answer, demo_usage
from replan.messages import ToolCall


@tool(side_effect=True)
def send_email(to: str, idempotency_key: str) -> str:
    """Email someone."""
    with open(os.environ["REPLAN_TEST_OUTBOX"], "a") as outbox:
        outbox.write(f"{to} {idempotency_key}\n")
    return f"sent to {to}"


NOT_A_TOOL = [send_email, 42]


def model(settings: Any) -> ScriptedModel:
    hold_s = float(os.environ.get("REPLAN_TEST_HOLD_S", "0"))

    async def handler(request: ModelRequest) -> Any:
        if (request.role, request.purpose) == ("executor", "execute"):
            task = request.context["task"]
            assert isinstance(task, Task)
            if task.id == "t1" and not request.transcript:
                call = ToolCall(id="c1", name="send_email", arguments='{"to": "ana"}')
                return ModelResponse(tool_calls=[call])
            if task.id == "t1":
                await anyio.sleep(hold_s)
        return answer(request)

    return ScriptedModel(handler, usage=demo_usage)
