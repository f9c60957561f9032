"""A model factory that takes its time, for ``replan serve --model
python:slow_start_model:model``: a daemon held in its start, before it
serves, as one loading a large model or importing much is.

It touches ``REPLAN_TEST_STARTING_FILE`` when it begins, then sleeps
``REPLAN_TEST_START_S`` seconds (default 60).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from replan import ScriptedModel
from replan._demo import demo_model


def model(settings: Any) -> ScriptedModel:
    Path(os.environ["REPLAN_TEST_STARTING_FILE"]).touch()
    time.sleep(float(os.environ.get("REPLAN_TEST_START_S", "60")))
    return demo_model()
