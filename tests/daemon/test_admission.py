"""Admission under a burst: ``max_active_runs`` holds for submissions that
arrive together, in the daemon's own process (an ASGI client, no server)."""

from __future__ import annotations

from pathlib import Path

import anyio
from in_process import serving

from replan._demo import GOAL, demo_model
from replan.daemon import DaemonSettings, Token
from replan.daemon._service import Daemon

TOKEN = "admission-test-token"


async def test_a_burst_of_submissions_fills_the_free_places_and_no_more(
    tmp_path: Path,
) -> None:
    settings = DaemonSettings(data_dir=tmp_path, max_active_runs=3)
    daemon = Daemon(settings=settings, token=Token(TOKEN), model=demo_model())
    async with serving(daemon) as client:
        # Two runs hold two of the three places (the demo's runs stop at a
        # gate that waits for a person).
        for _ in range(2):
            first = await client.post("/v1/runs", json={"goal": GOAL})
            assert first.status_code == 202, first.text
        codes: list[int] = []

        async def submit() -> None:
            response = await client.post("/v1/runs", json={"goal": GOAL})
            codes.append(response.status_code)

        # Each submission waits for the journal while the others arrive.
        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(submit)
        assert sorted(codes) == [202] + [429] * 5
        unfinished = [h for h in daemon.supervisor.handles() if not h.status.final]
        assert len(unfinished) == 3
        for handle in unfinished:
            await handle.cancel()
