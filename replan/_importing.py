"""Importing what a setting or a flag names by ``module:name``."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any

from ._errors import ConfigurationError


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


def import_named(path: str, field: str, usage: str) -> Any:
    """What ``module:name`` names.

    Raises:
        ConfigurationError: on ``field``: ``path`` is not ``module:name``
            (the problem is ``usage``), the module or name cannot be
            imported, or the module raised (or called ``sys.exit()``) as it
            was imported. A ``KeyboardInterrupt`` is not caught.
    """
    module_name, _, name = path.partition(":")
    if not module_name or not name:
        raise ConfigurationError(field, usage)
    try:
        return getattr(import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(field, f"cannot import {path}: {exc}") from None
    except Exception as exc:  # raised by the module as it was imported
        problem = f"importing {module_name} raised {type(exc).__name__}: {exc}"
        raise ConfigurationError(field, problem) from None
    except SystemExit as exc:  # the module is a script that exits
        raise ConfigurationError(
            field, f"importing {module_name} raised {exc!r}"
        ) from None
