"""The signals that stop ``replan serve``."""

from __future__ import annotations

import signal

STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGINT", "SIGHUP")
    if hasattr(signal, name)  # no SIGHUP on Windows
)
"""SIGTERM and SIGINT, and SIGHUP, which a closing terminal and a service
manager's reload send: the daemon has no configuration file to read again,
and dying by it would leave the attempts in flight to run again after the
restart, so it drains as on SIGTERM."""
