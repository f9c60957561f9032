"""``replan serve``: the HTTP API, settings, token and durable service.

Needs the ``daemon`` extra (``pip install 'replan[daemon]'``); ``import
replan`` alone never imports it.
"""

from __future__ import annotations

from ._app import create_app as create_app
from ._models import build_model as build_model
from ._retention import apply_retention as apply_retention
from ._server import build_daemon as build_daemon
from ._server import serve as serve
from ._service import Daemon as Daemon
from ._settings import DaemonSettings as DaemonSettings
from ._settings import load_settings as load_settings
from ._token import Token as Token
from ._token import resolve_token as resolve_token

__all__ = (
    "Daemon",
    "DaemonSettings",
    "Token",
    "apply_retention",
    "build_daemon",
    "build_model",
    "create_app",
    "load_settings",
    "resolve_token",
    "serve",
)
