"""The demo's scripted model, whose synthesis reports the daemon's collector.

Loaded by the daemon under test as ``--model python:gc_probe_model:model``:
the run's output names the young-generation threshold and how many objects
were frozen, as the daemon process sees them while it serves.
"""

from __future__ import annotations

import gc
from typing import Any

from replan import ModelRequest, ScriptedModel, Synthesis
from replan._demo import answer, demo_usage


def model(settings: Any) -> ScriptedModel:
    def handler(request: ModelRequest) -> Any:
        if (request.role, request.purpose) == ("executor", "synthesize"):
            young = gc.get_threshold()[0]
            return Synthesis(output=f"young={young} frozen={gc.get_freeze_count()}")
        return answer(request)

    return ScriptedModel(handler, usage=demo_usage, name="gc-probe")
