"""Open files: every connection holds one, an event stream for as long as
it is open, so the daemon raises its limit as far as it may.

At the limit the server cannot accept a connection, and the event loop
logs so with a traceback, hundreds of times a second while it lasts;
:class:`AcceptErrors` lets one line through every :data:`EVERY_S`
seconds instead, naming the limit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

EVERY_S = 10.0
"""How often a full file table is logged while it lasts."""
MAX_OPEN_FILES = 1 << 20
"""The limit asked for when the hard limit is unlimited."""

_ACCEPT = "socket.accept() out of system resource"


def raise_open_files_limit() -> int | None:
    """Raise the soft limit on open files to the hard limit (as a system's
    default of 1,024 would cap the event streams); the limit now, or None
    where there is none to read."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            return soft
        return wanted
    return soft


class AcceptErrors(logging.Filter):
    """One line, at most every :data:`EVERY_S` seconds, for connections the
    server cannot accept because the process has as many files open as it
    may; other records pass as they are."""

    def __init__(
        self, limit: int | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.limit = limit
        self._clock = clock
        self._last: float | None = None
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith(_ACCEPT):
            return True
        now = self._clock()
        if self._last is not None and now - self._last < EVERY_S:
            self._dropped += 1
            return False
        limit = "its limit" if self.limit is None else f"its limit of {self.limit}"
        since = f" ({self._dropped} more since)" if self._dropped else ""
        record.msg = (
            f"cannot accept connections: the daemon has {limit} files open "
            f"(event streams and other connections; raise it with ulimit -n "
            f"or LimitNOFILE){since}"
        )
        record.args = ()
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        self._last, self._dropped = now, 0
        return True
