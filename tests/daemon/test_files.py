"""The daemon's open files: its limit raised, a full table logged briefly."""

from __future__ import annotations

import logging
import sys

import pytest

from replan.daemon import _files
from replan.daemon._files import AcceptErrors, raise_open_files_limit

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no rlimits")


def test_the_daemon_raises_its_open_files_limit_as_far_as_it_may() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lower = min(soft, 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lower, hard))
    try:
        limit = raise_open_files_limit()
        raised, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    wanted = _files.MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else hard
    assert raised == limit == wanted


def accept_error() -> logging.LogRecord:
    # What asyncio's default exception handler logs, with the traceback.
    try:
        raise OSError(24, "Too many open files")
    except OSError:
        return logging.LogRecord(
            "asyncio",
            logging.ERROR,
            __file__,
            1,
            "socket.accept() out of system resource\nsocket: <TransportSocket fd=4>",
            (),
            sys.exc_info(),
        )


def test_a_full_file_table_is_one_line_every_ten_seconds_not_a_flood() -> None:
    # asyncio logs each failed accept with its traceback, tens of thousands
    # of times a second while the table is full: 190 MB of log in 10 s.
    now = [100.0]
    accepts = AcceptErrors(limit=1024, clock=lambda: now[0])
    first = accept_error()
    assert accepts.filter(first)
    assert first.levelname == "WARNING"
    assert first.exc_info is None
    assert first.getMessage() == (
        "cannot accept connections: the daemon has its limit of 1024 files "
        "open (event streams and other connections; raise it with ulimit -n "
        "or LimitNOFILE)"
    )
    assert not any(accepts.filter(accept_error()) for _ in range(1000))
    now[0] += _files.EVERY_S
    later = accept_error()
    assert accepts.filter(later)
    assert later.getMessage().endswith("(1000 more since)")
    other = logging.LogRecord(
        "asyncio", logging.ERROR, __file__, 1, "Task was destroyed", (), None
    )
    assert accepts.filter(other)
    assert other.getMessage() == "Task was destroyed"
