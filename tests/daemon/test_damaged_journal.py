"""A journal with a damaged row: the run is left as it is, the others go on.

In the daemon's own process (an ASGI client, no server).
"""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing
from pathlib import Path

import anyio
import pytest
from in_process import serving

from replan import GatePolicy, RunStatus, Supervisor
from replan._demo import demo_model, demo_spec
from replan.daemon import DaemonSettings, Token
from replan.daemon._retention import apply_retention
from replan.daemon._service import Daemon
from replan.messages import GateOpened
from replan.store import SQLiteStore

TOKEN = "damaged-journal-token"


async def journal_runs(path: Path, count: int, *, gated: bool = False) -> list[str]:
    """``count`` demo runs journaled in ``path``: finished, or (``gated``)
    left waiting at their scope-shift gate when the supervisor stops."""
    spec = demo_spec()
    if not gated:
        spec = spec.model_copy(update={"gate_policy": GatePolicy(gate_on=frozenset())})
    run_ids = []
    with anyio.fail_after(20):
        async with SQLiteStore(path) as store, Supervisor(demo_model(), store) as sup:
            for _ in range(count):
                handle = await sup.submit(spec)
                if gated:
                    async for event in handle.events():
                        if isinstance(event, GateOpened):
                            break
                else:
                    assert (await handle.result()).status is RunStatus.COMPLETED
                run_ids.append(handle.run_id)
    return run_ids


def damage(path: Path, run_id: str, seq: int = 3) -> None:
    with closing(sqlite3.connect(path)) as db:
        db.execute(
            "UPDATE events SET payload = '{not json' WHERE run_id = ? AND seq = ?",
            (run_id, seq),
        )
        db.commit()


async def test_retention_compacts_the_other_runs_past_a_damaged_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = DaemonSettings(
        data_dir=tmp_path, retention_age_s=0, retention_interval_s=3600
    )
    damaged, *others = await journal_runs(settings.journal_path, 3)
    damage(settings.journal_path, damaged)
    daemon = Daemon(settings=settings, token=Token(TOKEN), model=demo_model())
    with anyio.fail_after(20):
        async with serving(daemon) as client:
            # The daemon's first pass, as it starts.
            while True:
                if daemon.counters.compacted == len(others):
                    break
                await anyio.sleep(0.01)
            assert daemon.unreadable == {damaged}
            # The next pass has nothing to do, and says nothing again.
            caplog.clear()
            assert await apply_retention(daemon) == 0
            assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
            for run_id in others:
                response = await client.get(f"/v1/runs/{run_id}/events")
                assert response.text.count("event: ") == 1
                assert "event: run_compacted" in response.text
    assert daemon.counters.compacted == len(others)


async def test_a_damaged_unfinished_run_gets_a_clear_409_from_every_endpoint(
    tmp_path: Path,
) -> None:
    settings = DaemonSettings(data_dir=tmp_path, retention="off")
    damaged, healthy = await journal_runs(settings.journal_path, 2, gated=True)
    damage(settings.journal_path, damaged)
    daemon = Daemon(settings=settings, token=Token(TOKEN), model=demo_model())
    with anyio.fail_after(20):
        async with serving(daemon) as client:
            answers = [
                await client.get(f"/v1/runs/{damaged}"),
                await client.get(f"/v1/runs/{damaged}/versions"),
                await client.get(f"/v1/runs/{damaged}/events"),
                await client.post(f"/v1/runs/{damaged}/cancel"),
                await client.post(
                    f"/v1/gates/{damaged}-g1", json={"decision": "approve"}
                ),
            ]
            # The healthy run was resumed and can be answered as usual.
            approved = await client.post(
                f"/v1/gates/{healthy}-g1", json={"decision": "approve"}
            )
            assert approved.status_code == 200, approved.text
            await daemon.supervisor.get(healthy).result()
    for answer in answers:
        assert answer.status_code == 409, answer.text
        body = answer.json()
        assert body["field"] == "run_id"
        assert damaged in body["detail"]
        assert "cannot be read back" in body["detail"]
