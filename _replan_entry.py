"""The ``replan`` command's entry point: signal handlers before the imports.

Importing the ``replan`` package takes a while (pydantic models, anyio,
OpenTelemetry: half a second, seconds on a loaded machine), and until
``replan.cli`` installs its own handlers a SIGTERM killed the command
(exit 143) and a SIGINT printed a ``KeyboardInterrupt`` traceback. Service
managers and container runtimes do stop what they have just started. So
this module, outside the package and importing only the standard
library's small modules, installs handlers first: until
the command takes the signals over, one ends it at once, as the command
ends on it, with nothing started yet.

* ``replan serve``: SIGTERM, SIGINT or SIGHUP (unless it is ignored, as
  under ``nohup``) prints ``replan: stopped by SIGTERM`` (or the one it
  was) and exits 0.
* Any other command: SIGINT prints ``replan: interrupted`` (exit 130) and
  SIGTERM ``replan: terminated`` (exit 143); once the package is imported,
  the defaults are back for the command to handle as it always has.

``replan serve`` keeps these handlers until it installs its own (a
moment after the imports) and puts them back when it is done; then it
exits at once (see :func:`exit_at_once`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from types import FrameType
from typing import Any

_STOP_SERVE = ("SIGTERM", "SIGINT", "SIGHUP")
_STOP_COMMAND = {"SIGINT": ("interrupted", 130), "SIGTERM": ("terminated", 143)}


def command_of(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (the top-level options take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _say(line: str) -> None:
    # os.write: the signal may have come while sys.stderr was being written,
    # and a closed terminal (SIGHUP) takes no more output.
    with contextlib.suppress(OSError):
        os.write(2, f"{line}\n".encode())


def _stop_serve(signum: int, frame: FrameType | None) -> None:
    _say(f"replan: stopped by {signal.Signals(signum).name}")
    os._exit(0)


def _stop_command(signum: int, frame: FrameType | None) -> None:
    what, code = _STOP_COMMAND[signal.Signals(signum).name]
    _say(f"replan: {what}")
    os._exit(code)


def install(serve: bool) -> dict[int, Any]:
    """Install the early handlers; return those they replaced."""
    names = _STOP_SERVE if serve else tuple(_STOP_COMMAND)
    handler = _stop_serve if serve else _stop_command
    previous: dict[int, Any] = {}
    for name in names:
        signum = getattr(signal, name, None)
        if signum is None:
            continue
        if name == "SIGHUP" and signal.getsignal(signum) == signal.SIG_IGN:
            continue  # nohup: the command is to outlive its terminal
        previous[signum] = signal.signal(signum, handler)
    return previous


def main() -> int:
    """Run the ``replan`` command line and return its exit status."""
    serve = command_of(sys.argv[1:]) == "serve"
    previous = install(serve)
    from replan.cli import main as run

    if not serve:
        # The command handles SIGINT and SIGTERM as it always has.
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        return run()
    code = run()
    exit_at_once(code)
    return code  # pragma: no cover - exit_at_once does not return


def exit_at_once(code: int) -> None:
    """End ``replan serve`` with ``code`` once it has stopped, skipping the
    interpreter's own finalization.

    The daemon has closed everything by then (its journal, its lock, its
    telemetry). The interpreter's exit would put the default signal
    handlers back first, then tear down the modules (a tenth of a second,
    seconds on a loaded machine), and a second SIGTERM meanwhile killed
    the stopped daemon: exit 143 after a clean stop.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
