"""The event loop ``replan serve`` runs on: asyncio's, pausing its accepts
at the open-files limit.

With every descriptor taken, ``accept()`` fails (``EMFILE``) and the
waiting connection stays in the listen queue. asyncio then stops
watching the socket and looks again a second later, as it should, but
(before CPython gh-151615) it goes on calling ``accept()`` up to the
backlog's 2,048 times in the same pass, and schedules a look for each
failure: the looks multiply, and a daemon at its limit spent ~70 % of a
core failing ~13,000 accepts a second. Here the first failure of a pass
ends it: the socket is not watched until the one look a second later,
which accepts again as soon as a descriptor is free.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (uvicorn runs on asyncio only)
import errno
import socket
from typing import Any

OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""The errors on which asyncio stops accepting for a while."""


class _Listening:
    """The listening socket as one pass of accepts sees it: after one
    ``accept()`` failed for want of resources, the queue looks empty."""

    __slots__ = ("_exhausted", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._exhausted = False

    def accept(self) -> tuple[socket.socket, Any]:
        if self._exhausted:
            raise BlockingIOError(errno.EAGAIN, "accepting paused")
        try:
            return self.sock.accept()
        except OSError as exc:
            if exc.errno in OUT_OF_RESOURCES:
                self._exhausted = True
            raise

    def fileno(self) -> int:
        return self.sock.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class AcceptPausingLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop, ending a pass of accepts at the first that
    fails for want of a descriptor (see the module's docstring)."""

    def _accept_connection(
        self, protocol_factory: Any, sock: Any, *args: Any, **kwargs: Any
    ) -> None:
        # The retry asyncio schedules passes on the wrapper it was given.
        listening = _Listening(sock.sock if isinstance(sock, _Listening) else sock)
        super()._accept_connection(  # type: ignore[misc]
            protocol_factory, listening, *args, **kwargs
        )
