"""Names a package imports only when first used (its ``__getattr__``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(
    package: str, lazy: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], object]:
    """A module ``__getattr__`` that imports ``lazy[name]`` (a module relative
    to ``package``) on first use of ``name`` and keeps it in ``namespace``.

    Assign it under ``if not TYPE_CHECKING:``: a type checker reads the
    names from the package's ``TYPE_CHECKING`` imports, and a module-level
    ``__getattr__`` it could see would make any misspelt name pass as
    ``object``.
    """

    def __getattr__(name: str) -> object:
        module = lazy.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    return __getattr__
