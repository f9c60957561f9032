"""Importing what a setting or a flag names by ``module:name``."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType


def import_module(name: str) -> ModuleType:
    """``importlib.import_module(name)``, finding modules in the working
    directory too.

    The ``replan`` console script does not put the working directory on
    ``sys.path`` (``python -m replan`` does): a ``tools.py`` beside the user
    would not be found. It goes at the end, so that it shadows nothing.

    Raises:
        ImportError: no such module.
        Exception: whatever the module raises as it is imported.
    """
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)
    return importlib.import_module(name)
