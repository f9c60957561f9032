"""The demo's scripted model, whose task outcomes the journal cannot store.

Loaded by the daemon under test as ``--model python:unstorable_model:model``:
a task's summary holds a lone UTF-16 surrogate, so journaling the first task's
end fails, and with it the run.
"""

from __future__ import annotations

from typing import Any

from replan import ModelRequest, ScriptedModel, TaskOutcome
from replan._demo import answer, demo_usage


def model(settings: Any) -> ScriptedModel:
    def handler(request: ModelRequest) -> Any:
        if (request.role, request.purpose) == ("executor", "execute"):
            return TaskOutcome(success=True, summary="half a character: \udfff")
        return answer(request)

    return ScriptedModel(handler, usage=demo_usage, name="unstorable-demo")
