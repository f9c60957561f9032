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


def stop_signals() -> tuple[signal.Signals, ...]:
    """:data:`STOP_SIGNALS`, less SIGHUP while it is ignored: ``nohup
    replan serve`` (or a service manager that ignores it) asks the daemon
    to outlive its terminal, as any program does."""
    return tuple(
        s
        for s in STOP_SIGNALS
        if not (s.name == "SIGHUP" and signal.getsignal(s) == signal.SIG_IGN)
    )
