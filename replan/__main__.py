"""``python -m replan``: the same as the ``replan`` command."""

from __future__ import annotations

import sys

from _replan_entry import command_of, exit_at_once

from .cli import main

code = main()
if command_of(sys.argv[1:]) == "serve":
    exit_at_once(code)
raise SystemExit(code)
