"""The model port: the protocol every adapter implements, the OpenAI adapter,
role prompts, function tools, prices, and a scripted model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr as _lazy_getattr
from ._port import Model as Model
from ._port import ModelRequest as ModelRequest
from ._port import ModelResponse as ModelResponse
from ._port import Role as Role
from ._pricing import ModelPrice as ModelPrice
from ._pricing import PriceTable as PriceTable
from ._prompts import MissingPromptError as MissingPromptError
from ._prompts import PromptRegistry as PromptRegistry
from ._prompts import PromptTemplate as PromptTemplate
from ._scripted import ScriptedModel as ScriptedModel
from ._scripted import ScriptHandler as ScriptHandler
from ._tools import Tool as Tool
from ._tools import ToolArgumentsError as ToolArgumentsError
from ._tools import ToolSpec as ToolSpec
from ._tools import tool as tool
from ._values import render_value as render_value

if TYPE_CHECKING:
    from ._openai import OpenAIModel as OpenAIModel
    from ._openai import StructuredOutput as StructuredOutput
    from ._retry import BackoffPolicy as BackoffPolicy

# The OpenAI adapter loads the openai package (~0.4 s and ~35 MiB): only
# when it is first used, not for every application that imports replan.
_LAZY = {
    "OpenAIModel": "._openai",
    "StructuredOutput": "._openai",
    "BackoffPolicy": "._retry",
}


if not TYPE_CHECKING:
    __getattr__ = _lazy_getattr(__name__, _LAZY, globals())


__all__ = (
    "BackoffPolicy",
    "MissingPromptError",
    "Model",
    "ModelPrice",
    "ModelRequest",
    "ModelResponse",
    "OpenAIModel",
    "PriceTable",
    "PromptRegistry",
    "PromptTemplate",
    "Role",
    "ScriptHandler",
    "ScriptedModel",
    "StructuredOutput",
    "Tool",
    "ToolArgumentsError",
    "ToolSpec",
    "render_value",
    "tool",
)
