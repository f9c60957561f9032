"""Every telemetry name replan emits is defined in ``replan/telemetry/_names.py``."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import replan

PACKAGE = Path(replan.__file__).parent
NAMES = PACKAGE / "telemetry" / "_names.py"

DOTTED = re.compile(
    r"^(gen_ai|http|url|server|client|user_agent|network|error|replan)(\.[a-z_]+)+$"
)
"""What an attribute, event or metric name looks like (a span name has a space)."""
ASGI_MESSAGE_TYPES = frozenset(
    {"http.request", "http.disconnect", "http.response.start", "http.response.body"}
)


def is_module(text: str) -> bool:
    try:
        return importlib.util.find_spec(text) is not None
    except ModuleNotFoundError:
        return False


def names_outside(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        text = node.value
        if not DOTTED.match(text) or text in ASGI_MESSAGE_TYPES:
            continue
        if is_module(text):
            continue  # a logger, named after its module
        found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {text}")
    return found


def test_no_telemetry_name_is_spelled_out_of_the_names_module() -> None:
    stray = [
        line
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != NAMES
        for line in names_outside(path)
    ]
    assert stray == []
