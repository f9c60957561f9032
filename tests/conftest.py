from __future__ import annotations

from collections.abc import Iterator

import postgres_server as postgres
import pytest
from hypothesis import settings
from postgres_server import PostgresServer

# Property tests try the same examples on every run, so that a result does not
# depend on luck, and keep no example database in the working tree. To search
# for new examples: pytest --hypothesis-profile=explore [--hypothesis-seed=N].
settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore", database=None)
settings.load_profile("deterministic")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Core tests run on both anyio backends."""
    return str(request.param)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test session's own (see postgres_server.py)."""
    server = postgres.start()
    try:
        yield server
    finally:
        postgres.stop(server)


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own, to stop and start again."""
    server = postgres.start()
    try:
        yield server
    finally:
        postgres.stop(server)


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """The connection string of a fresh, empty database, dropped afterwards."""
    name = postgres_server.new_database()
    try:
        yield postgres_server.dsn(name)
    finally:
        postgres_server.drop_database(name)
