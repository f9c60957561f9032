"""JSON schemas for structured outputs, and lenient parsing of JSON answers."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from pydantic import BaseModel, ValidationError

_FENCE = re.compile(r"\A```(?:json)?\s*\n?(.*?)\n?```\Z", re.S)
_INNER_FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)\n?```", re.S)
_REASONING = re.compile(r"\A<(think|thinking|reasoning)>.*?</\1>", re.S)
_OPENED = re.compile(r"\A<(think|thinking|reasoning)>")


def response_schema(output_type: type[BaseModel]) -> tuple[dict[str, Any], bool]:
    """The schema a model must answer in, and whether strict mode can take it.

    The ``kind`` tag every replan message carries is left out (it has a
    default). For strict mode every object lists all its properties as
    required and forbids others, and defaults are dropped; an open mapping
    (``dict[str, float]``) cannot be strict, so the schema is then sent
    without strict mode.
    """
    schema = copy.deepcopy(output_type.model_json_schema())
    strict = True
    for node in _objects(schema):
        props: dict[str, Any] = node.get("properties", {})
        props.pop("kind", None)
        if "required" in node:
            node["required"] = [r for r in node["required"] if r != "kind"]
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) or extra is True:
            strict = False
    if strict:
        for node in _objects(schema):
            node["required"] = list(node.get("properties", {}))
            node["additionalProperties"] = False
        _drop_defaults(schema)
    return schema, strict


def parse_output(raw: str, output_type: type[BaseModel]) -> BaseModel:
    """Validate a model's text as ``output_type``, tolerating a code fence.

    Text that is not the object alone (a reasoning model's leading
    ``<think>...</think>``, a sentence before or after the JSON, a fenced
    block inside prose) is searched for the object: what is found is taken
    only if it validates, so nothing but a valid answer is ever read out of
    the text.

    Raises:
        ValidationError: not JSON, or not the right shape (the error of the
            object found in the text, if one was, else of the whole text).
    """
    text = _unfenced(raw.strip())
    try:
        return output_type.model_validate_json(text)
    except ValidationError as whole:
        if not _not_json(whole):
            raise  # JSON of the wrong shape: its own error says what to fix
        for candidate in _embedded(text):
            try:
                return output_type.model_validate_json(candidate)
            except ValidationError as exc:
                if not _not_json(exc):
                    raise  # the object found, of the wrong shape
        raise


def _not_json(exc: ValidationError) -> bool:
    return any(error["type"] == "json_invalid" for error in exc.errors())


def _unfenced(text: str) -> str:
    fenced = _FENCE.match(text)
    return fenced.group(1).strip() if fenced else text


def _embedded(text: str) -> list[str]:
    """Where the JSON object may be in ``text``, most specific first."""
    found: list[str] = []
    reasoning = _REASONING.match(text)
    if reasoning:
        text = text[reasoning.end() :].strip()
        found.append(_unfenced(text))
    elif _OPENED.match(text):
        return []  # reasoning that never ended: what it holds is no answer
    found.extend(m.group(1).strip() for m in _INNER_FENCE.finditer(text))
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        found.append(text[start : end + 1])
    return found


def describe_errors(exc: ValidationError) -> str:
    """A validation error in a few lines a model can act on."""
    lines = []
    for error in exc.errors()[:10]:
        where = ".".join(str(p) for p in error["loc"]) or "the answer"
        lines.append(f"- {where}: {error['msg']}")
    more = exc.error_count() - 10
    if more > 0:
        lines.append(f"- and {more} more")
    return "\n".join(lines)


def schema_text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, separators=(",", ":"))


def _objects(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object schema in ``schema``, ``$defs`` included."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" or "properties" in node:
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return found


def _drop_defaults(node: Any) -> None:
    if isinstance(node, dict):
        node.pop("default", None)
        for value in node.values():
            _drop_defaults(value)
    elif isinstance(node, list):
        for value in node:
            _drop_defaults(value)
