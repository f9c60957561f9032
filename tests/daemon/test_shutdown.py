"""SIGTERM's drain, in process: the server keeps answering until it is over;
and the start, which it answers during too."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from daemon_process import TOKEN

from replan import ModelRequest, ScriptedModel, _client
from replan._client import Backoff
from replan._demo import GOAL, answer, demo_usage
from replan.cli import main
from replan.daemon import DaemonSettings, Token
from replan.daemon._listen import listen
from replan.daemon._server import Shutdown, run_server, uvicorn_server
from replan.daemon._service import Daemon


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn runs on asyncio only


class HeldModel:
    """The demo's scripted model, whose task executions wait for ``release``."""

    def __init__(self) -> None:
        self.executing = anyio.Event()
        self.release = anyio.Event()
        self.model = ScriptedModel(self._answer, usage=demo_usage, name="held")

    async def _answer(self, request: ModelRequest) -> Any:
        if (request.role, request.purpose) == ("executor", "execute"):
            self.executing.set()
            await self.release.wait()
        return answer(request)


def journal_kinds(journal: Path, run_id: str) -> list[str]:
    with closing(sqlite3.connect(journal)) as conn:
        rows = conn.execute(
            "SELECT type FROM events WHERE run_id = ? ORDER BY seq", (run_id,)
        ).fetchall()
    return [kind for (kind,) in rows]


def held_daemon(tmp_path: Path, held: HeldModel) -> Daemon:
    settings = DaemonSettings(
        data_dir=tmp_path, api_token=TOKEN, drain_grace_s=600, log_level="warning"
    )
    return Daemon(settings=settings, token=Token(TOKEN), model=held.model)


@dataclass
class Served:
    """A daemon being served: a client that holds the token, and the switch
    that asks the server to stop, as SIGTERM does."""

    url: str
    client: httpx.AsyncClient
    shutdown: Shutdown


@asynccontextmanager
async def serving(daemon: Daemon) -> AsyncIterator[Served]:
    """Serve ``daemon`` with uvicorn on a free port of 127.0.0.1; the block
    asks for the shutdown, and its end waits until the server has stopped."""
    server = uvicorn_server(daemon)
    sockets = listen("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with (
            anyio.create_task_group() as tg,
            httpx.AsyncClient(base_url=url, headers=headers, timeout=5) as client,
        ):
            shutdown: Shutdown = await tg.start(run_server, daemon, server, sockets)
            yield Served(url, client, shutdown)
    finally:
        for sock in sockets:
            sock.close()


async def until_ready(client: httpx.AsyncClient) -> None:
    """Wait for the daemon to serve: it answers while it starts."""
    for _ in range(1000):
        if (await client.get("/readyz")).status_code == 200:
            return
        await anyio.sleep(0.01)
    raise AssertionError("the daemon did not start in 10 s")


async def test_the_drain_answers_503_to_new_runs_while_work_in_flight_finishes(
    tmp_path: Path,
) -> None:
    held = HeldModel()
    daemon = held_daemon(tmp_path, held)
    body = {"goal": GOAL, "gate_policy": {"gate_on": []}}
    async with serving(daemon) as served:
        client = served.client
        await until_ready(client)
        accepted = await client.post("/v1/runs", json=body)
        assert accepted.status_code == 202, accepted.text
        run_id = accepted.json()["run_id"]
        await held.executing.wait()

        served.shutdown.request()  # what SIGTERM does

        # The drain waits for the held execution: the server still answers.
        refused = await client.post("/v1/runs", json=body)
        ready = await client.get("/readyz")
        gates = await client.get("/v1/gates")
        answer = {"decision": "approve", "by": "ann"}
        answered = await client.post(f"/v1/gates/{run_id}-g1", json=answer)
        cancelled = await client.post(f"/v1/runs/{run_id}/cancel")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=served.url, headers=headers) as fresh:
            still_read = await fresh.get(f"/v1/runs/{run_id}")
        held.release.set()
    # run_server has returned: the drain ended and uvicorn stopped.
    assert refused.status_code == 503, refused.text
    assert refused.json()["detail"] == (
        "not accepting runs: the daemon is shutting down; submit the run again "
        "once it has restarted"
    )
    assert refused.headers["Retry-After"] == "5"
    assert ready.status_code == 503
    # Worth another try once the daemon has restarted, as a submission is.
    for later in (gates, answered):
        assert later.status_code == 503, later.text
        assert later.json()["detail"] == (
            "not serving: the daemon is shutting down (it drains its runs for "
            "a restart): try again once it has restarted"
        )
        assert later.headers["Retry-After"] == "5"
    assert cancelled.status_code == 503, cancelled.text
    assert cancelled.json()["detail"] == (
        "not cancelling runs: the daemon is shutting down (it drains its runs "
        "for a restart): try again once it has restarted"
    )
    assert cancelled.headers["Retry-After"] == "5"
    assert still_read.status_code == 200
    assert still_read.json()["status"] == "running"
    kinds = journal_kinds(daemon.settings.journal_path, run_id)
    assert "task_finished" in kinds, "the execution in flight reached the journal"
    assert "task_interrupted" not in kinds
    assert "run_finished" not in kinds, "the run waits in the journal for a restart"
    assert not daemon.ready


async def test_a_keyed_submission_sent_again_while_the_daemon_drains_gets_its_run(
    tmp_path: Path,
) -> None:
    held = HeldModel()
    body = {"goal": GOAL, "gate_policy": {"gate_on": []}}
    async with serving(held_daemon(tmp_path, held)) as served:
        client = served.client
        await until_ready(client)
        key = {"Idempotency-Key": "nightly-7"}
        accepted = await client.post("/v1/runs", json=body, headers=key)
        assert accepted.status_code == 202, accepted.text
        await held.executing.wait()

        served.shutdown.request()  # what SIGTERM does

        again = await client.post("/v1/runs", json=body, headers=key)
        other = {"Idempotency-Key": "nightly-8"}
        new = await client.post("/v1/runs", json=body, headers=other)
        held.release.set()
    # The key's run exists: no need to wait for the restart to learn it.
    assert again.status_code == 200, again.text
    assert again.json()["run_id"] == accepted.json()["run_id"]
    assert again.json()["status"] == "running"
    # Another key would start a run: that waits for the restart.
    assert new.status_code == 503, new.text
    assert new.headers["Retry-After"] == "5"


async def test_a_second_signal_stops_without_waiting_for_the_drain(
    tmp_path: Path,
) -> None:
    held = HeldModel()  # never released: only a forced stop ends the drain
    daemon = held_daemon(tmp_path, held)
    server = uvicorn_server(daemon)
    sockets = listen("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with anyio.create_task_group() as tg:
            shutdown: Shutdown = await tg.start(run_server, daemon, server, sockets)
            async with httpx.AsyncClient(base_url=url, headers=headers) as client:
                await until_ready(client)
                accepted = await client.post(
                    "/v1/runs", json={"goal": GOAL, "gate_policy": {"gate_on": []}}
                )
            await held.executing.wait()
            shutdown.request()
            shutdown.request()
    finally:
        for sock in sockets:
            sock.close()
    kinds = journal_kinds(daemon.settings.journal_path, accepted.json()["run_id"])
    assert "task_started" in kinds
    assert "task_finished" not in kinds, "the execution was cut short"
    assert "run_finished" not in kinds
    assert not held.release.is_set()


async def test_a_run_can_still_be_shown_while_the_daemon_drains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldModel()
    monkeypatch.setenv("REPLAN_API_TOKEN", TOKEN)
    # Without the history, the client would retry until it gives up.
    monkeypatch.setattr(_client, "DEFAULT_BACKOFF", Backoff(0.1, 0.1, 2.0))
    shown: list[int] = []
    async with serving(held_daemon(tmp_path, held)) as served:
        client = served.client
        await until_ready(client)
        accepted = await client.post(
            "/v1/runs", json={"goal": GOAL, "gate_policy": {"gate_on": []}}
        )
        run_id = accepted.json()["run_id"]
        await held.executing.wait()
        served.shutdown.request()

        # The history is served from the journal, then the stream ends.
        with anyio.fail_after(10):
            history = await client.get(f"/v1/runs/{run_id}/events")
            shown.append(
                await anyio.to_thread.run_sync(
                    main, ["show", run_id, "--url", served.url]
                )
            )
        held.release.set()
    assert history.status_code == 200
    kinds = [
        line.removeprefix("event: ")
        for line in history.text.splitlines()
        if line.startswith("event: ")
    ]
    assert kinds[:3] == ["run_submitted", "usage_recorded", "plan_created"]
    assert "task_started" in kinds
    assert shown == [0]


class SlowStart:
    """``Daemon.running`` held before it opens the journal, as a journal of
    thousands of unfinished runs holds it while they resume."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()
        running = Daemon.running

        @asynccontextmanager
        async def held(daemon: Daemon) -> AsyncIterator[None]:
            self.entered.set()
            await self.release.wait()
            async with running(daemon):
                yield

        monkeypatch.setattr(Daemon, "running", held)


async def test_the_daemon_answers_while_it_resumes_the_journal_s_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = SlowStart(monkeypatch)
    held = HeldModel()
    held.release.set()
    async with serving(held_daemon(tmp_path, held)) as served:
        client = served.client
        await start.entered.wait()
        # Before, nothing answered until every run had resumed.
        alive = await client.get("/healthz")
        ready = await client.get("/readyz")
        submitted = await client.post("/v1/runs", json={"goal": GOAL})
        listed = await client.get("/v1/runs")
        metrics = await client.get("/metrics")
        start.release.set()
        await until_ready(client)
        accepted = await client.post("/v1/runs", json={"goal": GOAL})
        served.shutdown.request()
    assert alive.status_code == 200
    assert ready.status_code == 503
    assert ready.json()["detail"].startswith("not ready: the daemon is starting")
    assert submitted.status_code == 503
    assert submitted.json()["detail"] == (
        "not accepting runs yet: the daemon is starting (it resumes the "
        "journal's unfinished runs): try again in a few seconds"
    )
    for refused in (ready, submitted, listed):
        assert refused.headers["Retry-After"] == "5"
    assert listed.status_code == 503
    assert listed.json()["detail"].startswith("not serving yet: the daemon is starting")
    assert "replan_ready 0" in metrics.text
    assert accepted.status_code == 202


async def test_a_command_sent_while_the_daemon_starts_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `replan runs` during a restart got the 503 and exited 1, where
    # `replan watch` waited: a read answered 503 with Retry-After is now
    # sent again until the backoff gives up.
    start = SlowStart(monkeypatch)
    held = HeldModel()
    held.release.set()
    monkeypatch.setenv("REPLAN_API_TOKEN", TOKEN)
    monkeypatch.setattr(_client, "DEFAULT_BACKOFF", Backoff(0.05, 0.1, 10.0))
    codes: list[int] = []
    async with serving(held_daemon(tmp_path, held)) as served:
        await start.entered.wait()

        async def listing() -> None:
            codes.append(
                await anyio.to_thread.run_sync(main, ["runs", "--url", served.url])
            )

        with anyio.fail_after(10):
            async with anyio.create_task_group() as commands:
                commands.start_soon(listing)
                assert (await served.client.get("/readyz")).status_code == 503
                # Long enough for the command to be refused a few times.
                await anyio.sleep(0.3)
                assert codes == []
                start.release.set()
        served.shutdown.request()
    assert codes == [0]
    assert "starting" not in capsys.readouterr().err


async def test_a_signal_while_the_daemon_starts_stops_it_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = SlowStart(monkeypatch)  # never released
    daemon = held_daemon(tmp_path, HeldModel())
    server = uvicorn_server(daemon)
    sockets = listen("127.0.0.1", 0)
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                shutdown: Shutdown = await tg.start(run_server, daemon, server, sockets)
                await start.entered.wait()
                shutdown.request()
    finally:
        for sock in sockets:
            sock.close()
    assert not daemon.ready


async def test_a_daemon_that_cannot_start_stops_serving_and_exits_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    @asynccontextmanager
    async def failing(daemon: Daemon) -> AsyncIterator[None]:
        raise OSError("disk I/O error")
        yield  # pragma: no cover

    monkeypatch.setattr(Daemon, "running", failing)
    daemon = held_daemon(tmp_path, HeldModel())
    server = uvicorn_server(daemon)
    sockets = listen("127.0.0.1", 0)
    try:
        with anyio.fail_after(10), pytest.raises(SystemExit) as exited:
            await run_server(daemon, server, sockets)
    finally:
        for sock in sockets:
            sock.close()
    assert exited.value.code == 3
