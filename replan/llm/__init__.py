"""The model port: the protocol every adapter implements, and a scripted model."""

from __future__ import annotations

from ._port import Model as Model
from ._port import ModelRequest as ModelRequest
from ._port import ModelResponse as ModelResponse
from ._port import Role as Role
from ._scripted import ScriptedModel as ScriptedModel
from ._scripted import ScriptHandler as ScriptHandler

__all__ = (
    "Model",
    "ModelRequest",
    "ModelResponse",
    "Role",
    "ScriptHandler",
    "ScriptedModel",
)
