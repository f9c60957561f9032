"""replan: supervised actors for LLM agents that replan safely."""

from __future__ import annotations

import logging

from ._version import __version__ as __version__

logging.getLogger("replan").addHandler(logging.NullHandler())
