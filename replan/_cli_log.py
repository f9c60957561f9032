"""The library's warnings and errors on the command's stderr, one short line
each: ``replan: warning: ...`` (``replan serve`` configures logging itself).

Without this the package's ``NullHandler`` swallows them: a model server
that reports no token usage, a tool call the journal could not record, a
run whose driver crashed (the error line says "see the log").
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Iterator

from . import _render

MAX_LINE = 400
"""A log line is at most this many characters, as an error line is."""


class CommandLogHandler(logging.Handler):
    """Writes ``replan: warning: MESSAGE`` (or ``error``) on stderr, after
    flushing stdout so that the line lands after the progress printed so
    far, or after the question at the terminal (see :func:`held`). An
    exception's traceback is shown only with ``REPLAN_DEBUG=1``; otherwise
    its type and message end the line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            error = record.exc_info[1] if record.exc_info else None
            debug = bool(os.environ.get("REPLAN_DEBUG"))
            text = "" if error is None else str(error)
            if error is not None and not debug and not (text and text in message):
                message += f": {type(error).__name__}" + (f": {text}" if text else "")
            level = "error" if record.levelno >= logging.ERROR else "warning"
            folded = " ".join(message.split())
            line = _render.terminal_text(f"replan: {level}: {folded}")
            if len(line) > MAX_LINE:
                line = line[: MAX_LINE - 1] + "…"
            lines = [line]
            if error is not None and debug:
                lines += traceback.format_exception(error)
            if _held is not None:
                _held.extend(lines)
            else:
                _write(lines)
        except Exception:
            self.handleError(record)


def _write(lines: list[str]) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stdout.flush()
    stream = sys.stderr
    for line in lines:
        print(line.rstrip("\n"), file=stream)
    stream.flush()


_held: list[str] | None = None
"""The log lines held back while a question waits at the terminal."""


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Log lines wait for the block's end (a question at the terminal, whose
    line they would break into, as the run's progress waits too)."""
    global _held
    if _held is not None:  # held already
        yield
        return
    _held = []
    try:
        yield
    finally:
        lines, _held = _held, None
        if lines:
            _write(lines)


@contextlib.contextmanager
def command_logging() -> Iterator[None]:
    """The ``replan`` logger's warnings and errors reach stderr for the block."""
    logger = logging.getLogger("replan")
    handler = CommandLogHandler()
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
