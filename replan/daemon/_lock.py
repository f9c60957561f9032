"""One daemon per data directory: an exclusive lock next to the journal.

Two daemons on one journal would both resume its unfinished runs and
repeat their model calls; the second one to start is refused instead. The
lock is ``flock`` on ``journal.db.lock``: the kernel releases it when its
holder exits, however it exits, so a crash leaves nothing to clean up.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .._errors import ConfigurationError
from ._settings import DaemonSettings


def lock_path(settings: DaemonSettings) -> Path:
    """Where the lock of ``settings.data_dir`` lives."""
    journal = settings.journal_path
    return journal.with_name(journal.name + ".lock")


@contextmanager
def data_dir_lock(settings: DaemonSettings) -> Iterator[Path]:
    """Hold the data directory's lock, creating the directory if needed.

    The lock file names the holder's pid, for the message another daemon
    shows when it is refused.

    Raises:
        ConfigurationError: another process holds the lock, or the
            directory cannot be used (``data_dir``).
    """
    path = lock_path(settings)
    if settings.data_dir.exists() and not settings.data_dir.is_dir():
        # mkdir would say only "File exists".
        raise ConfigurationError("data_dir", f"{settings.data_dir} is no directory")
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigurationError("data_dir", f"cannot lock {path}: {exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            raise ConfigurationError(
                "data_dir",
                f"another replan daemon is using {settings.data_dir} ({holder})",
            ) from None
        except OSError as exc:
            raise ConfigurationError("data_dir", f"cannot lock {path}: {exc}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        # Closing the descriptor releases the lock. The file stays: removing
        # it would let a third daemon lock a new file beside a live holder.
        os.close(fd)


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return f"pid {text}"
    return "pid unknown"
