"""The daemon's listening sockets, bound before anything else starts.

uvicorn would bind only after the app's startup has opened the journal and
resumed its runs; a busy port would then leave runs resumed by a process
that is about to exit. Binding first turns a busy port into a
configuration error while nothing has happened yet.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from pathlib import Path
from typing import Any

from .._errors import ConfigurationError

BACKLOG = 2048
"""uvicorn's default backlog."""


def listen(host: str, port: int) -> list[socket.socket]:
    """Listening TCP sockets for every address of ``host`` (port 0: any port).

    A name like ``localhost`` may resolve to an IPv4 and an IPv6 address; like
    uvicorn, the daemon listens on each, on the same port. The sockets listen
    already, so connections made while the app starts wait in the backlog
    instead of being refused.

    Raises:
        ConfigurationError: the host does not resolve (``host``), or an
            address cannot be bound (``port``: in use, or not allowed).
    """
    try:
        found = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise ConfigurationError(
            "host", f"cannot resolve {host}: {exc.strerror or exc}"
        ) from None
    except UnicodeError as exc:
        # A name no DNS query can carry (a label empty or over 63
        # characters, ``x..y``), found as the name is encoded.
        raise ConfigurationError(
            "host", f"cannot resolve {host!r}: {exc.__cause__ or exc}"
        ) from None
    sockets: list[socket.socket] = []
    unavailable: OSError | None = None
    try:
        for family, kind, proto, _, address in dict.fromkeys(found):
            if port == 0 and sockets:
                # The port the first socket got, for the other addresses too.
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:
                continue  # this family is not supported here (no IPv6)
            try:
                _bind(sock, address)
            except OSError as exc:
                sock.close()
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise _refused(exc, host, port) from None
                unavailable = exc  # e.g. ::1 on a host without IPv6
                continue
            sockets.append(sock)
        if not sockets:
            reason = unavailable.strerror if unavailable else "no usable address"
            raise ConfigurationError("host", f"cannot listen on {host}: {reason}")
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _bind(sock: socket.socket, address: tuple[Any, ...]) -> None:
    if os.name == "posix":
        # Restart at once, as uvicorn does, despite connections in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sock.family == socket.AF_INET6:
        # "::" must not also claim the IPv4 port that "0.0.0.0" binds next.
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind(address)
    sock.listen(BACKLOG)


def _refused(exc: OSError, host: str, port: int) -> ConfigurationError:
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return ConfigurationError("port", f"{where} is in use")
    return ConfigurationError(
        "port", f"cannot listen on {where}: {exc.strerror or exc}"
    )


def url_of(sock: socket.socket) -> str:
    """The URL a listening socket answers at: the port a ``port`` of 0 took."""
    host, port = sock.getsockname()[:2]
    where = f"[{host}]" if sock.family == socket.AF_INET6 else host
    return f"http://{where}:{port}"


def write_port_file(path: Path, url: str) -> None:
    """Write ``url`` and a newline into ``path`` at once: whoever polls for
    the file never reads half of it.

    Raises:
        ConfigurationError: the file cannot be written (``port_file``).
    """
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        partial.write_text(f"{url}\n")
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise ConfigurationError(
            "port_file", f"cannot write {path}: {exc.strerror or exc}"
        ) from None


def remove_port_file(path: Path, url: str) -> None:
    """Remove ``path`` unless another daemon has written its own address there."""
    with contextlib.suppress(OSError):
        if path.read_text() == f"{url}\n":
            path.unlink()
