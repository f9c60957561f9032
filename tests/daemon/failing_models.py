"""Model factories that fail, for ``replan serve --model python:...``."""

from __future__ import annotations

import sys
from typing import Any


def raises(settings: Any) -> Any:
    raise RuntimeError("no GPU left")


def exits(settings: Any) -> Any:
    sys.exit(3)
