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
    far. An exception's traceback is shown only with ``REPLAN_DEBUG=1``;
    otherwise its type and message end the line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            error = record.exc_info[1] if record.exc_info else None
            debug = bool(os.environ.get("REPLAN_DEBUG"))
            if error is not None and not debug and str(error) not in message:
                message = f"{message}: {type(error).__name__}: {error}"
            level = "error" if record.levelno >= logging.ERROR else "warning"
            folded = " ".join(message.split())
            line = _render.terminal_text(f"replan: {level}: {folded}")
            if len(line) > MAX_LINE:
                line = line[: MAX_LINE - 1] + "…"
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stdout.flush()
            stream = sys.stderr
            print(line, file=stream)
            if error is not None and debug:
                traceback.print_exception(error, file=stream)
            stream.flush()
        except Exception:
            self.handleError(record)


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
