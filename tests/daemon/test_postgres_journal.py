"""Daemons on a PostgreSQL journal: two sharing it, each with a data
directory of its own (as on two machines), one killed and its runs taken
over by the other; the server restarted under a run, which the daemon
drives on."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import anyio
import httpx
import postgres_server as postgres
import pytest
from counting_model import read_counts
from daemon_process import DaemonProcess, wait_for
from postgres_server import PostgresServer

from replan import ConfigurationError
from replan._demo import GOAL, demo_model
from replan.daemon import DaemonSettings, Token
from replan.daemon import _service as service_module
from replan.daemon._server import check_journal
from replan.daemon._service import Daemon
from replan.store import PostgresStore

COUNTING = ("--model", "python:counting_model:model")


def test_two_daemons_share_a_journal_and_one_takes_over_the_runs_of_one_killed(
    tmp_path: Path, postgres_dsn: str
) -> None:
    counts = str(tmp_path / "executions.txt")
    env = {
        "REPLAN_TEST_COUNT_FILE": counts,
        "REPLAN_TEST_EXECUTE_S": "0.05",
        "REPLAN_JOURNAL_DSN": postgres_dsn,
        # Short leases and frequent looks: the takeover takes seconds.
        "REPLAN_JOURNAL_LEASE_S": "2",
        "REPLAN_REDRIVE_INTERVAL_S": "0.3",
    }
    first = DaemonProcess(tmp_path / "first", *COUNTING, env=env).start()
    second = DaemonProcess(tmp_path / "second", *COUNTING, env=env).start()
    try:
        with first.client() as one, second.client() as two:
            response = one.post("/v1/runs", json={"goal": GOAL})
            assert response.status_code == 202, response.text
            run_id = response.json()["run_id"]
            gates = wait_for(lambda: one.get("/v1/gates").json()["gates"])
            # The second daemon, resuming on the same journal, leaves the
            # run to the first, and drives its own.
            response = two.post(
                "/v1/runs", json={"goal": GOAL, "gate_policy": {"gate_on": []}}
            )
            assert response.status_code == 202, response.text
            own = response.json()["run_id"]
            # It lists the first's gate too, naming the daemon to answer it at.
            listed = two.get("/v1/gates").json()
            assert listed["gates"] == gates
            assert list(listed["elsewhere"]) == [gates[0]["gate_id"]]
            assert listed["elsewhere"][gates[0]["gate_id"]].endswith(f":{first.pid}")
            # It lists and shows the first's run from the journal.
            listed = {r["run_id"] for r in two.get("/v1/runs").json()["runs"]}
            assert {run_id, own} <= listed
            assert two.get(f"/v1/runs/{run_id}").json()["status"] == (
                "waiting_for_human"
            )
            wait_for(
                lambda: two.get(f"/v1/runs/{own}").json()["status"] == "completed",
                timeout_s=30,
            )
            first.kill()
            before, _ = read_counts(counts)
            # The answer waits in the journal: once the first's lease
            # expires, the second's next look takes the run over and
            # applies it.
            answered = two.post(
                f"/v1/gates/{gates[0]['gate_id']}", json={"decision": "approve"}
            )
            assert answered.status_code == 202, answered.text
            view = wait_for(
                lambda: (
                    body
                    if (body := two.get(f"/v1/runs/{run_id}").json())["status"]
                    not in ("running", "waiting_for_human")
                    else None
                ),
                timeout_s=30,
            )
    finally:
        first.close()
        assert second.terminate() == 0, second.output()
    assert view["status"] == "completed"
    done, _ = read_counts(counts)
    assert all(count == 1 for count in done.values()), done
    assert set(before) <= set(done)
    assert any(key.startswith(f"{run_id}:") for key in before), "ran before the gate"
    # Neither daemon kept a SQLite journal.
    for name in ("first", "second"):
        assert not (tmp_path / name / "journal.db").exists()


def test_a_journal_dsn_that_cannot_be_reached_is_refused_naming_the_setting(
    tmp_path: Path, postgres_dsn: str
) -> None:
    settings = DaemonSettings(
        data_dir=tmp_path, journal_dsn=postgres_dsn.replace("dbname=", "dbname=x")
    )
    with pytest.raises(ConfigurationError) as caught:
        check_journal(settings)
    assert caught.value.field == "journal_dsn"


def test_a_run_whose_append_met_a_server_restart_waits_for_it_and_runs_each_task_once(
    tmp_path: Path, own_server: PostgresServer
) -> None:
    counts = str(tmp_path / "executions.txt")
    dbname = own_server.new_database()
    env = {
        "REPLAN_TEST_COUNT_FILE": counts,
        "REPLAN_TEST_EXECUTE_S": "1.0",
        "REPLAN_JOURNAL_DSN": own_server.dsn(dbname),
        "REPLAN_REDRIVE_INTERVAL_S": "0.2",
    }
    daemon = DaemonProcess(tmp_path / "data", *COUNTING, env=env).start()
    try:
        with daemon.client() as client:
            response = client.post(
                "/v1/runs", json={"goal": GOAL, "gate_policy": {"gate_on": []}}
            )
            assert response.status_code == 202, response.text
            run_id = response.json()["run_id"]
            [(key, _)] = wait_for(lambda: list(read_counts(counts)[1].items()))
            postgres.halt(own_server)
            try:
                # The task ends while the server is down: its end waits for
                # the journal, and the daemon says it is not ready.
                wait_for(lambda: key in read_counts(counts)[0])
                wait_for(lambda: client.get("/readyz").status_code == 503)
                ready = client.get("/readyz")
                assert "the journal cannot be reached" in ready.json()["detail"]
                # Named: where the journal is (store.outage).
                assert f"/{dbname} (schema replan): " in ready.json()["detail"]
                assert ready.headers["retry-after"] == "5"
                wait_for(lambda: "cannot be reached" in daemon.output())
            finally:
                postgres.start_again(own_server)

            def status() -> str:
                return str(client.get(f"/v1/runs/{run_id}").json()["status"])

            wait_for(lambda: status() == "completed", timeout_s=40)
            wait_for(lambda: "reachable again" in daemon.output())
            assert client.get("/readyz").status_code == 200
    finally:
        code = daemon.terminate()
    assert code == 0, daemon.output()
    done, running = read_counts(counts)
    assert not running
    # The attempt in flight at the restart waited for the journal: no task
    # ran twice, and no run was let go of.
    assert all(n == 1 for n in done.values()), done
    assert f"run {run_id} crashed" not in daemon.output()


def _stopped_while_the_server_is_down(
    tmp_path: Path, server: PostgresServer, counts: str
) -> tuple[DaemonProcess, str]:
    """A daemon whose run's first task ended while the server was down:
    its end waits for the journal."""
    env = {
        "REPLAN_TEST_COUNT_FILE": counts,
        "REPLAN_TEST_EXECUTE_S": "1.0",
        "REPLAN_JOURNAL_DSN": server.dsn(server.new_database()),
    }
    daemon = DaemonProcess(tmp_path / "data", *COUNTING, env=env).start()
    with daemon.client() as client:
        response = client.post(
            "/v1/runs", json={"goal": GOAL, "gate_policy": {"gate_on": []}}
        )
        assert response.status_code == 202, response.text
    [(key, _)] = wait_for(lambda: list(read_counts(counts)[1].items()))
    postgres.halt(server)
    wait_for(lambda: key in read_counts(counts)[0])
    return daemon, key


def test_a_daemon_stopped_while_the_server_is_down_keeps_what_finished_if_it_returns(
    tmp_path: Path, own_server: PostgresServer
) -> None:
    # The stop waits for the server (up to reconnect_s from the outage's
    # start) to keep the attempt that finished meanwhile: back in time,
    # the run goes on after the restart without running it again.
    counts = str(tmp_path / "executions.txt")
    daemon, key = _stopped_while_the_server_is_down(tmp_path, own_server, counts)
    try:
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        time.sleep(3)
        assert daemon.proc.poll() is None, "the stop did not wait for the journal"
        postgres.start_again(own_server)
        assert daemon.proc.wait(30) == 0, daemon.output()
        again = DaemonProcess(tmp_path / "data", *COUNTING, env=daemon.extra_env)
        with again.start().client() as client:
            run_id = key.split(":")[0]
            wait_for(
                lambda: (
                    client.get(f"/v1/runs/{run_id}").json()["status"] == "completed"
                ),
                timeout_s=40,
            )
        assert again.terminate() == 0, again.output()
    finally:
        daemon.close()
    done, _ = read_counts(counts)
    assert all(n == 1 for n in done.values()), done


def test_a_second_signal_stops_a_daemon_at_once_while_the_server_is_down(
    tmp_path: Path, own_server: PostgresServer
) -> None:
    counts = str(tmp_path / "executions.txt")
    daemon, _ = _stopped_while_the_server_is_down(tmp_path, own_server, counts)
    try:
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        time.sleep(1)
        signalled = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        # Not the rest of the store's 30 s reconnect_s.
        assert daemon.proc.wait(30) == 0, daemon.output()
        assert time.monotonic() - signalled < 6, daemon.output()
    finally:
        daemon.close()
        postgres.start_again(own_server)


async def test_a_retention_pass_that_meets_an_outage_logs_one_line_without_traceback(
    tmp_path: Path,
    own_server: PostgresServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dsn = own_server.dsn(own_server.new_database())
    # The store waits 0.5 s for the server, not 30 s, before a call fails.
    monkeypatch.setattr(
        service_module,
        "open_journal",
        lambda settings: PostgresStore(dsn, reconnect_s=0.5),
    )
    settings = DaemonSettings(
        data_dir=tmp_path,
        journal_dsn=dsn,
        retention_age_s=0,
        retention_interval_s=0.2,
        redrive_interval_s="off",
    )
    daemon = Daemon(settings=settings, token=Token("t" * 32), model=demo_model())
    caplog.set_level(logging.INFO, "replan")
    with anyio.fail_after(30):
        async with daemon.running():
            await anyio.to_thread.run_sync(postgres.halt, own_server)
            try:
                for _ in range(100):
                    if any("retention pass" in r.getMessage() for r in caplog.records):
                        break
                    await anyio.sleep(0.1)
                await anyio.sleep(0.5)
            finally:
                await anyio.to_thread.run_sync(postgres.start_again, own_server)
    passes = [r for r in caplog.records if "retention pass" in r.getMessage()]
    assert passes
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in passes)
    assert "cannot be reached" in passes[0].getMessage()


@contextmanager
def _daemon_with_a_gate(
    tmp_path: Path, server: PostgresServer
) -> Iterator[tuple[DaemonProcess, httpx.Client, str]]:
    """A daemon on ``server`` whose one run waits at a gate."""
    env = {"REPLAN_JOURNAL_DSN": server.dsn(server.new_database())}
    daemon = DaemonProcess(tmp_path / "data", env=env).start()
    try:
        with daemon.client() as client:
            run_id = client.post("/v1/runs", json={"goal": GOAL}).json()["run_id"]
            wait_for(lambda: client.get("/v1/gates").json()["gates"])
            yield daemon, client, run_id
    finally:
        assert daemon.terminate() == 0, daemon.output()


@contextmanager
def _server_down(server: PostgresServer, client: httpx.Client) -> Iterator[None]:
    """``server`` halted, once the daemon's /readyz says so; started again
    at the end."""
    postgres.halt(server)
    try:
        wait_for(lambda: client.get("/readyz").status_code == 503)
        yield
    finally:
        postgres.start_again(server)


def _refused_at_once(send: Callable[[], httpx.Response], refusal: str) -> str:
    """The detail of the 503 ``send`` gets within 5 s."""
    started = time.monotonic()
    response = send()
    assert time.monotonic() - started < 5, response.request.url
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "5"
    detail: str = response.json()["detail"]
    assert detail.startswith(f"{refusal}: the journal cannot be"), detail
    return detail


def test_a_write_while_the_server_is_out_of_reach_gets_503_at_once(
    tmp_path: Path, own_server: PostgresServer
) -> None:
    # Its calls wait up to reconnect_s (30 s) for the server: a submission
    # made during an outage the daemon already knew of waited as long for
    # its 503, and a client that gave up first could not tell what happened.
    with _daemon_with_a_gate(tmp_path, own_server) as (_, client, run_id):
        with _server_down(own_server, client):
            writes = [
                ("/v1/runs", {"goal": GOAL}, "not accepting runs"),
                (
                    f"/v1/gates/{run_id}-g1",
                    {"decision": "approve", "by": "alice"},
                    "not answering gates",
                ),
                (f"/v1/runs/{run_id}/cancel", None, "not cancelling runs"),
            ]
            for path, body, refusal in writes:
                _refused_at_once(partial(client.post, path, json=body), refusal)
        wait_for(lambda: client.get("/readyz").status_code == 200, timeout_s=30)
        answer = {"decision": "approve", "by": "alice"}
        response = client.post(f"/v1/gates/{run_id}-g1", json=answer)
        assert response.status_code == 200, response.text
        assert client.post("/v1/runs", json={"goal": GOAL}).status_code == 202


def test_a_read_while_the_server_is_out_of_reach_gets_503_at_once(
    tmp_path: Path, own_server: PostgresServer
) -> None:
    # A read waited up to reconnect_s (30 s) for the server, as writes did,
    # where the command line and proxies wait for less. The command line
    # waits through the 503 and shows the answer once the server is back.
    with _daemon_with_a_gate(tmp_path, own_server) as (daemon, client, run_id):
        with _server_down(own_server, client):
            reads = [
                ("/v1/runs", "not reading runs"),
                (f"/v1/runs/{run_id}", "not reading runs"),
                (f"/v1/runs/{run_id}/versions", "not reading runs"),
                ("/v1/gates", "not listing gates"),
                (f"/v1/gates?run_id={run_id}", "not listing gates"),
            ]
            for path, refusal in reads:
                detail = _refused_at_once(partial(client.get, path), refusal)
                assert detail.startswith(
                    f"{refusal}: the journal cannot be reached for now "
                    "(send the request again): postgresql://"
                ), detail
            cli_env = {
                k: v for k, v in os.environ.items() if not k.startswith("REPLAN_")
            }
            cli_env.update(REPLAN_URL=daemon.url, REPLAN_API_TOKEN=daemon.token)
            listing = subprocess.Popen(
                [sys.executable, "-m", "replan", "runs"],
                env=cli_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(1)
            assert listing.poll() is None, listing.communicate()
        out, err = listing.communicate(timeout=60)
        assert listing.returncode == 0, err
        assert run_id in out
        assert client.get(f"/v1/runs/{run_id}").status_code == 200


def _stream_opened(client: httpx.Client, path: str) -> httpx.Response:
    """The answer to an event stream's request, which must be no stream."""
    with client.stream("GET", path) as response:
        assert response.status_code != 200, f"{path}: the stream opened"
        response.read()
        return response


def test_an_event_stream_opened_while_the_server_is_out_of_reach_gets_503_at_once(
    tmp_path: Path, own_server: PostgresServer
) -> None:
    # Its run was looked up first, which waited up to reconnect_s (30 s) for
    # the server when this daemon did not hold the run (a stream of a run
    # it drove got keep-alives only). The command line waits through the
    # 503, as through the other reads', and follows the run once it is back.
    with _daemon_with_a_gate(tmp_path, own_server) as (daemon, client, run_id):
        with _server_down(own_server, client):
            for path in [
                "/v1/runs/not-in-memory/events",
                f"/v1/runs/{run_id}/events",
                f"/v1/runs/{run_id}/events?after=2",
            ]:
                detail = _refused_at_once(
                    partial(_stream_opened, client, path), "not streaming events"
                )
                assert detail.startswith(
                    "not streaming events: the journal cannot be reached for now "
                    "(send the request again): postgresql://"
                ), detail
            cli_env = {
                k: v for k, v in os.environ.items() if not k.startswith("REPLAN_")
            }
            cli_env.update(REPLAN_URL=daemon.url, REPLAN_API_TOKEN=daemon.token)
            watching = subprocess.Popen(
                [sys.executable, "-m", "replan", "watch", run_id],
                env=cli_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(1)
            assert watching.poll() is None, watching.communicate()
        wait_for(lambda: client.get("/readyz").status_code == 200, timeout_s=30)
        answer = {"decision": "approve", "by": "alice"}
        response = client.post(f"/v1/gates/{run_id}-g1", json=answer)
        assert response.status_code == 200, response.text
        out, err = watching.communicate(timeout=60)
        assert watching.returncode == 0, err
        assert "completed" in out, out
