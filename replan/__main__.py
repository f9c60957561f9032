"""``python -m replan``: the same as the ``replan`` command."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
