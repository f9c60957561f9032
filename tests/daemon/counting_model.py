"""The demo's scripted model, counting task executions in a file.

Loaded by the daemon under test as ``--model python:counting_model:model``.
Each execution appends ``start RUN:TASK MONOTONIC`` before its simulated
work and ``done RUN:TASK`` when it completes, so the tests can count
completed executions across kills and restarts of the daemon.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio

from replan import ModelRequest, ScriptedModel, Task
from replan._demo import answer, demo_usage


def _append(path: str, line: str) -> None:
    with open(path, "a") as file:
        file.write(line + "\n")


def model(settings: Any) -> ScriptedModel:
    path = os.environ["REPLAN_TEST_COUNT_FILE"]
    latency = float(os.environ.get("REPLAN_TEST_EXECUTE_S", "0.5"))

    async def handler(request: ModelRequest) -> Any:
        if (request.role, request.purpose) != ("executor", "execute"):
            return answer(request)
        task = request.context["task"]
        assert isinstance(task, Task)
        key = f"{request.run_id}:{task.id}"
        _append(path, f"start {key} {time.monotonic()}")
        await anyio.sleep(latency)
        outcome = answer(request)
        _append(path, f"done {key}")
        return outcome

    return ScriptedModel(handler, usage=demo_usage, name="counting-demo")


def read_counts(path: str) -> tuple[dict[str, int], dict[str, float]]:
    """Completed executions per key, and the start times of unfinished ones."""
    done: dict[str, int] = {}
    open_starts: dict[str, float] = {}
    if not os.path.exists(path):
        return done, open_starts
    with open(path) as file:
        for line in file:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "start":
                open_starts[parts[1]] = float(parts[2])
            elif len(parts) == 2 and parts[0] == "done":
                done[parts[1]] = done.get(parts[1], 0) + 1
                open_starts.pop(parts[1], None)
    return done, open_starts
