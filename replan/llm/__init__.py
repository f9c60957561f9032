"""The model port: the protocol every adapter implements, the OpenAI adapter,
role prompts, function tools, prices, and a scripted model."""

from __future__ import annotations

from ._openai import OpenAIModel as OpenAIModel
from ._openai import StructuredOutput as StructuredOutput
from ._port import Model as Model
from ._port import ModelRequest as ModelRequest
from ._port import ModelResponse as ModelResponse
from ._port import Role as Role
from ._pricing import ModelPrice as ModelPrice
from ._pricing import PriceTable as PriceTable
from ._prompts import MissingPromptError as MissingPromptError
from ._prompts import PromptRegistry as PromptRegistry
from ._prompts import PromptTemplate as PromptTemplate
from ._prompts import render_value as render_value
from ._retry import BackoffPolicy as BackoffPolicy
from ._scripted import ScriptedModel as ScriptedModel
from ._scripted import ScriptHandler as ScriptHandler
from ._tools import Tool as Tool
from ._tools import ToolArgumentsError as ToolArgumentsError
from ._tools import ToolSpec as ToolSpec
from ._tools import tool as tool

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
