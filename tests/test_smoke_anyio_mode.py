from __future__ import annotations

import anyio
import anyio.lowlevel


async def test_async_tests_run_without_a_marker() -> None:
    await anyio.lowlevel.checkpoint()
