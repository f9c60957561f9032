from __future__ import annotations

import pytest
from hypothesis import settings

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
