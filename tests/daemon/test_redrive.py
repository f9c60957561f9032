"""Runs a journal failure let go of are driven on by the daemon's scan."""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from counting_model import read_counts
from daemon_process import TOKEN, DaemonProcess, wait_for
from in_process import serving
from test_damaged_journal import damage, journal_runs

from replan import RunStatus, Supervisor, SupervisorError
from replan._demo import GOAL, demo_model
from replan.daemon import DaemonSettings, Token, _service
from replan.daemon._service import Daemon, open_journal
from replan.messages import Event, GateOpened
from replan.store import RunSummary, Store

FULL_DISK = ("--model", "python:full_disk_model:model")
UNGATED = {"goal": GOAL, "gate_policy": {"gate_on": []}}


def status_of(client: object, run_id: str) -> str:
    response = client.get(f"/v1/runs/{run_id}")  # type: ignore[attr-defined]
    assert response.status_code == 200, response.text
    return str(response.json()["status"])


def test_a_run_let_go_of_on_a_full_disk_completes_once_the_disk_has_room(
    tmp_path: Path,
) -> None:
    counts = str(tmp_path / "executions.txt")
    full = tmp_path / "disk-full"
    env = {
        "REPLAN_TEST_COUNT_FILE": counts,
        "REPLAN_TEST_EXECUTE_S": "0.3",
        "REPLAN_TEST_DISK_FULL": str(full),
        "REPLAN_REDRIVE_INTERVAL_S": "0.2",
    }
    daemon = DaemonProcess(tmp_path / "data", *FULL_DISK, env=env).start()
    try:
        with daemon.client() as client:
            response = client.post("/v1/runs", json=UNGATED)
            assert response.status_code == 202, response.text
            run_id = response.json()["run_id"]
            wait_for(lambda: read_counts(counts)[1])  # a task is under way
            full.touch()
            # Its end cannot be journaled: the run is let go of, and the
            # scans that drive it on fail too, said once, looking less often.
            wait_for(lambda: "the journal is failing" in daemon.output())
            time.sleep(3)
            # Unfinished in the journal, but driven by nobody: not counted as
            # this daemon's running runs (nor against max_active_runs).
            assert status_of(client, run_id) == "running"
            assert client.get("/v1/runs").json()["runs"][0]["status"] == "running"
            # Nor can it end here meanwhile: a cancel is refused, not held.
            refused = client.post(f"/v1/runs/{run_id}/cancel")
            assert refused.status_code == 409, refused.text
            assert refused.json()["detail"].startswith(
                f"run {run_id} was not cancelled: "
            )
            running = 'replan_runs{status="running"} 0'
            wait_for(lambda: running in client.get("/metrics").text)
            log = daemon.output()
            assert log.count(f"run {run_id} crashed") == 1, log
            assert log.count("the journal is failing") == 1, log
            [failing] = [line for line in log.splitlines() if "failing" in line]
            assert f"run {run_id} was let go of again: OSError: " in failing
            assert "No space left on device" in failing

            full.unlink()
            wait_for(lambda: status_of(client, run_id) == "completed", timeout_s=30)
            wait_for(lambda: "the journal works again" in daemon.output())
    finally:
        code = daemon.terminate()
    assert code == 0, daemon.output()
    done, running = read_counts(counts)
    assert not running
    assert done
    assert all(count == 1 for count in done.values()), done
    assert daemon.output().count("the journal works again") == 1


def test_a_run_submitted_on_a_full_disk_is_refused_with_503_and_its_id(
    tmp_path: Path,
) -> None:
    full = tmp_path / "disk-full"
    env = {
        "REPLAN_TEST_COUNT_FILE": str(tmp_path / "executions.txt"),
        "REPLAN_TEST_DISK_FULL": str(full),
    }
    full.touch()
    daemon = DaemonProcess(tmp_path / "data", *FULL_DISK, env=env).start()
    try:
        with daemon.client() as client:
            refused = client.post("/v1/runs", json=UNGATED)
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"] == "5"
            detail = refused.json()["detail"]
            assert "No space left on device" in detail
            [run_id] = [w for w in detail.split() if len(w) == 32]
            # Its first write never reached the journal: no such run.
            assert client.get(f"/v1/runs/{run_id}").status_code == 404
            assert "Traceback" not in daemon.output()

            full.unlink()
            accepted = client.post("/v1/runs", json=UNGATED)
            assert accepted.status_code == 202, accepted.text
            again = accepted.json()["run_id"]
            wait_for(lambda: status_of(client, again) == "completed", timeout_s=30)
    finally:
        code = daemon.terminate()
    assert code == 0, daemon.output()


# In the daemon's own process ----------------------------------------------------


class FullDisk:
    """Makes a journal's appends fail while ``full`` is set, and counts the
    scans (listings of unfinished runs)."""

    def __init__(self, store: Store) -> None:
        self.full = False
        self.scans = 0
        self.holds = 0
        append, list_runs = store.append, store.list_runs
        hold_lease = getattr(store, "hold_lease", None)

        async def append_unless_full(
            run_id: str, events: Sequence[Event], summary: RunSummary, **kw: Any
        ) -> None:
            if self.full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            await append(run_id, events, summary, **kw)

        async def counted(**kwargs: Any) -> list[RunSummary]:
            if kwargs.get("statuses"):
                self.scans += 1
            return await list_runs(**kwargs)

        def held(holder: object, *, exclusive: bool) -> None:
            self.holds += 1
            assert hold_lease is not None
            hold_lease(holder, exclusive=exclusive)

        store.append = append_unless_full  # type: ignore[method-assign]
        store.list_runs = counted  # type: ignore[method-assign]
        if hold_lease is not None:
            store.hold_lease = held  # type: ignore[attr-defined]


def journal_of(settings: DaemonSettings, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The journal the daemon opens, made to fail on demand (see FullDisk)."""
    store = open_journal(settings)
    disk = FullDisk(store)
    monkeypatch.setattr(_service, "open_journal", lambda _: store)
    return store, disk


async def let_go_of(daemon: Daemon, disk: FullDisk) -> str:
    """Submit a run and fail its first append after the submission."""
    handle = await daemon.supervisor.submit(UNGATED)
    disk.full = True  # before its driver runs: its plan is not journaled
    with pytest.raises(SupervisorError, match="driver crashed"):
        await handle.result()
    return handle.run_id


async def finished(daemon: Daemon, run_id: str) -> RunStatus:
    while True:
        status = (await daemon.run_state(run_id)).status
        if status.final:
            return status
        await anyio.sleep(0.02)


async def until(check: Callable[[], bool]) -> None:
    while True:
        if check():
            return
        await anyio.sleep(0.02)


async def logged(caplog: pytest.LogCaptureFixture, text: str) -> None:
    await until(lambda: any(text in r.message for r in caplog.records))


async def test_a_failing_journal_is_scanned_less_often_and_reported_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings = DaemonSettings(data_dir=tmp_path, redrive_interval_s=0.1)
    _, disk = journal_of(settings, monkeypatch)
    daemon = Daemon(settings=settings, token=Token(TOKEN), model=demo_model())
    caplog.set_level(logging.DEBUG, logger="replan")
    with anyio.fail_after(30):
        async with serving(daemon):
            run_id = await let_go_of(daemon, disk)
            disk.scans = 0
            await anyio.sleep(2)
            # 0.1, 0.2, 0.4, 0.8 s apart, then 1.6 s (16 intervals) at most:
            # about 5 scans in 2 s (a few more on a loaded machine, should a
            # run driven on not have crashed again by the next scan), where
            # 20 would look every 0.1 s.
            assert 1 <= disk.scans <= 8
            failing = [r for r in caplog.records if "journal is failing" in r.message]
            assert len(failing) == 1
            assert f"run {run_id} was let go of again: OSError" in failing[0].message
            crashed = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert [r.message for r in crashed] == [f"run {run_id} crashed"]

            disk.full = False
            assert await finished(daemon, run_id) is RunStatus.COMPLETED
            await logged(caplog, "the journal works again")


async def test_with_the_scan_off_a_run_let_go_of_waits_for_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = DaemonSettings(data_dir=tmp_path, redrive_interval_s="off")
    _, disk = journal_of(settings, monkeypatch)
    daemon = Daemon(settings=settings, token=Token(TOKEN), model=demo_model())
    with anyio.fail_after(30):
        async with serving(daemon):
            run_id = await let_go_of(daemon, disk)
            disk.full = False
            disk.scans = 0
            await anyio.sleep(0.5)
            assert disk.scans == 0
            assert (await daemon.run_state(run_id)).status is RunStatus.RUNNING
        # The next start resumes it, as before.
        monkeypatch.undo()
        async with serving(daemon):
            assert await finished(daemon, run_id) is RunStatus.COMPLETED


async def test_the_scan_leaves_alone_the_runs_another_daemon_holds_until_it_lets_go(
    tmp_path: Path, postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    from replan.store import PostgresStore

    settings = DaemonSettings(
        data_dir=tmp_path, journal_dsn=postgres_dsn, redrive_interval_s=0.1
    )
    daemon = Daemon(settings=settings, token=Token(TOKEN), model=demo_model())
    with anyio.fail_after(30):
        async with serving(daemon):
            async with (
                PostgresStore(postgres_dsn) as store,
                Supervisor(demo_model(), store) as other,  # another daemon's
            ):
                handle = await other.submit({"goal": GOAL})
                async for event in handle.events():
                    if isinstance(event, GateOpened):
                        break
                await anyio.sleep(0.5)  # a few scans
                run_id = handle.run_id
                assert not daemon.supervisor.drives(run_id)
                state = await daemon.run_state(run_id)
                assert state.status is RunStatus.WAITING_FOR_HUMAN
                assert await daemon.driven_elsewhere(run_id) == other.owner.holder
            # Stopped, it let go of its lease: this daemon's next scan
            # takes the run over, and its gate with it.
            await until(lambda: bool(daemon.supervisor.gates.pending(run_id)))
            (gate,) = daemon.supervisor.gates.pending(run_id)
            await daemon.supervisor.gates.resolve(
                gate.gate_id, {"decision": "approve", "by": "ana"}
            )
            assert await finished(daemon, run_id) is RunStatus.COMPLETED
    assert not [r for r in caplog.records if "journal is failing" in r.message]


async def test_a_run_whose_journal_cannot_be_read_is_logged_once_not_every_scan(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = DaemonSettings(
        data_dir=tmp_path, retention="off", redrive_interval_s=0.1
    )
    damaged, healthy = await journal_runs(settings.journal_path, 2, gated=True)
    damage(settings.journal_path, damaged)
    caplog.set_level(logging.INFO, logger="replan")
    daemon = Daemon(settings=settings, token=Token(TOKEN), model=demo_model())
    with anyio.fail_after(20):
        async with serving(daemon):
            await anyio.sleep(1)  # several scans
            assert daemon.supervisor.drives(healthy)
            assert not daemon.supervisor.drives(damaged)
    said = [r for r in caplog.records if damaged in r.message]
    assert len(said) == 1, [r.message for r in said]
    assert "cannot be resumed" in said[0].message
    assert not [r for r in caplog.records if "journal is failing" in r.message]
