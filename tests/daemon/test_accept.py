"""At the open-files limit the daemon's event loop stops accepting until
its next look, instead of failing thousands of accepts a second."""

from __future__ import annotations

import asyncio  # noqa: TID251 (the loop uvicorn runs on, without uvicorn)
import errno
import socket
from typing import Any

import pytest

from replan.daemon._accept import AcceptPausingLoop


class _FullTable:
    """A listening socket whose process has no descriptor free."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.accepts = 0

    def accept(self) -> Any:
        self.accepts += 1
        raise OSError(errno.EMFILE, "Too many open files")

    def fileno(self) -> int:
        return self.sock.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


@pytest.mark.parametrize(
    ("loop_class", "accepts"),
    [(asyncio.SelectorEventLoop, 2048), (AcceptPausingLoop, 1)],
    ids=["asyncio", "replan"],
)
def test_a_pass_of_accepts_ends_at_the_first_that_finds_no_descriptor_free(
    loop_class: type[asyncio.SelectorEventLoop], accepts: int
) -> None:
    loop = loop_class()
    loop.set_exception_handler(lambda loop, context: None)
    try:
        with socket.create_server(("127.0.0.1", 0)) as listening:
            full = _FullTable(listening)

            loop._accept_connection(  # type: ignore[attr-defined]
                lambda: None, full, backlog=2048
            )

            assert full.accepts == accepts
            # One look again a second later for each failure.
            assert len(loop._scheduled) == accepts  # type: ignore[attr-defined]
            # The look a second later hands back the socket it was given.
            again = loop._scheduled[0]._args[1]  # type: ignore[attr-defined]
            loop._accept_connection(  # type: ignore[attr-defined]
                lambda: None, again, backlog=2048
            )
            assert full.accepts == 2 * accepts
    finally:
        loop.close()


def test_connections_are_accepted_as_asyncio_accepts_them() -> None:
    accepted: list[socket.socket] = []

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            accepted.append(transport.get_extra_info("socket"))
            transport.close()

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(
            Protocol, "127.0.0.1", 0
        )
        port = server.sockets[0].getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            for _ in range(100):
                if accepted:
                    break
                await asyncio.sleep(0.01)
        server.close()
        await server.wait_closed()

    loop = AcceptPausingLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert len(accepted) == 1
