"""Admission under a burst: ``max_active_runs`` holds for submissions that
arrive together, in the daemon's own process (an ASGI client, no server)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from in_process import serving

from replan._demo import GOAL, demo_model
from replan._errors import UnknownRunError
from replan.daemon import DaemonSettings, Token
from replan.daemon._service import Daemon
from replan.supervisor import RunState

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


async def test_a_cancel_of_a_run_deleted_as_it_ends_is_a_404(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Retention may delete a run the moment it ends: the cancel's answer,
    # which reads the run again, says there is no such run, not a 500.
    settings = DaemonSettings(data_dir=tmp_path)
    daemon = Daemon(settings=settings, token=Token(TOKEN), model=demo_model())
    async with serving(daemon) as client:
        submitted = await client.post("/v1/runs", json={"goal": GOAL})
        run_id = submitted.json()["run_id"]
        reads = 0
        run_state = daemon.run_state

        async def deleted_once_cancelled(run: str) -> RunState:
            nonlocal reads
            reads += 1
            if reads > 1:
                raise UnknownRunError(run)
            return await run_state(run)

        monkeypatch.setattr(daemon, "run_state", deleted_once_cancelled)
        cancelled = await client.post(f"/v1/runs/{run_id}/cancel")
    assert reads == 2
    assert cancelled.status_code == 404, cancelled.text
    assert cancelled.json()["field"] == "run_id"


async def test_a_cancel_sent_on_whose_run_is_deleted_meanwhile_is_a_404(
    tmp_path: Path, postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sent on to the daemon that drives the run, the cancel ended it, and
    # retention deleted it (its request with it) before the sender read
    # what became of the cancel: no such run, not "driven by no daemon".
    def settings(name: str) -> DaemonSettings:
        return DaemonSettings(data_dir=tmp_path / name, journal_dsn=postgres_dsn)

    first = Daemon(settings=settings("a"), token=Token(TOKEN), model=demo_model())
    second = Daemon(settings=settings("b"), token=Token(TOKEN), model=demo_model())
    async with serving(first) as one, serving(second) as two:
        submitted = await one.post("/v1/runs", json={"goal": GOAL})
        run_id = submitted.json()["run_id"]
        sup = second.supervisor
        cancel = sup.cancel

        async def cancelled_and_deleted(run: str) -> None:
            await cancel(run)
            await second.store.delete_run(run)
            raise UnknownRunError(run)

        monkeypatch.setattr(sup, "cancel", cancelled_and_deleted)
        cancelled = await two.post(f"/v1/runs/{run_id}/cancel")
    assert cancelled.status_code == 404, cancelled.text
    assert cancelled.json()["field"] == "run_id"
