"""Several daemons on one PostgreSQL journal, used as an operator would
through any of them: a run's event stream and its gates at a daemon that
does not drive it, and across a takeover."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import postgres_server as postgres
import psycopg
from daemon_process import TOKEN, DaemonProcess, wait_for
from postgres_server import PostgresServer
from test_durability import sse_frames

from replan._demo import GOAL

COUNTING = ("--model", "python:counting_model:model")


def _env(tmp_path: Path, dsn: str) -> dict[str, str]:
    return {
        "REPLAN_TEST_COUNT_FILE": str(tmp_path / "executions.txt"),
        "REPLAN_TEST_EXECUTE_S": "0.05",
        "REPLAN_JOURNAL_DSN": dsn,
        # Short leases and frequent looks: a takeover takes seconds.
        "REPLAN_JOURNAL_LEASE_S": "2",
        "REPLAN_REDRIVE_INTERVAL_S": "0.3",
        "REPLAN_HEARTBEAT_S": "0.5",
    }


class Follower:
    """A client following a run's event stream in a thread of its own."""

    def __init__(self, daemon: DaemonProcess, run_id: str, after: int = 0) -> None:
        self.frames: list[Any] = []
        self.error: BaseException | None = None
        headers = {"Last-Event-ID": str(after)} if after else {}
        self._thread = threading.Thread(
            target=self._follow, args=(daemon, run_id, headers), daemon=True
        )
        self._thread.start()

    def _follow(
        self, daemon: DaemonProcess, run_id: str, headers: dict[str, str]
    ) -> None:
        try:
            with (
                daemon.client() as client,
                client.stream(
                    "GET", f"/v1/runs/{run_id}/events", headers=headers, timeout=30
                ) as response,
            ):
                assert response.status_code == 200, response.read()
                self.frames.extend(sse_frames(response))
        except BaseException as exc:
            self.error = exc

    def ended(self, timeout_s: float = 30) -> list[tuple[int, str]]:
        """The events it got, once the stream has ended."""
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the stream did not end"
        assert self.error is None, self.error
        return [(f[1], f[2]) for f in self.frames if f[0] == "event"]

    @property
    def events(self) -> list[tuple[int, str]]:
        return [(f[1], f[2]) for f in list(self.frames) if f[0] == "event"]


@contextmanager
def daemons(
    tmp_path: Path, dsn: str, *names: str, lease_s: float = 2
) -> Iterator[list[DaemonProcess]]:
    started: list[DaemonProcess] = []
    try:
        for name in names:
            env = _env(tmp_path, dsn) | {"REPLAN_JOURNAL_LEASE_S": f"{lease_s:g}"}
            started.append(DaemonProcess(tmp_path / name, *COUNTING, env=env).start())
        yield started
    finally:
        for daemon in started:
            daemon.close()


def _gated_run(daemon: DaemonProcess) -> tuple[str, dict[str, Any]]:
    """Submit the demo's run, and wait for its gate."""
    with daemon.client() as client:
        response = client.post("/v1/runs", json={"goal": GOAL})
        assert response.status_code == 202, response.text
        run_id = response.json()["run_id"]
        (gate,) = wait_for(
            lambda: client.get("/v1/gates", params={"run_id": run_id}).json()["gates"]
        )
    return run_id, gate


def test_a_daemon_that_does_not_drive_a_run_streams_it_live_to_its_end(
    tmp_path: Path, postgres_dsn: str
) -> None:
    with daemons(tmp_path, postgres_dsn, "first", "second") as (first, second):
        run_id, gate = _gated_run(first)
        # The history so far, read up to the gate, then the client drops.
        with (
            second.client() as two,
            two.stream("GET", f"/v1/runs/{run_id}/events") as response,
        ):
            head = []
            for f in sse_frames(response):
                if f[0] == "event":
                    head.append((f[1], f[2]))
                    if f[2] == "gate_opened":
                        break
        # It reconnects where it left off, and follows the run meanwhile.
        follower = Follower(second, run_id, after=head[-1][0])
        wait_for(lambda: len(follower.frames) >= 2)  # heartbeats while it waits
        assert follower.events == []
        with first.client() as one:
            answered = one.post(
                f"/v1/gates/{gate['gate_id']}",
                json={"decision": "approve", "by": "alice"},
            )
            assert answered.status_code == 200, answered.text
        tail = follower.ended()
        with first.client() as one:
            whole = one.get(f"/v1/runs/{run_id}/events").text
    seqs = [seq for seq, _ in head + tail]
    assert seqs == list(range(1, len(seqs) + 1))
    assert tail[0][1] == "gate_resolved"
    assert tail[-1][1] == "run_finished"
    assert whole.count("event: ") == len(seqs)


def test_a_stream_at_the_daemon_that_takes_a_run_over_goes_on_without_a_gap(
    tmp_path: Path, postgres_dsn: str
) -> None:
    with daemons(tmp_path, postgres_dsn, "first", "second") as (first, second):
        run_id, gate = _gated_run(first)
        follower = Follower(second, run_id)
        wait_for(lambda: any(kind == "gate_opened" for _, kind in follower.events))
        first.kill()
        with second.client() as two:
            # The answer waits in the journal; once the lease expires, the
            # second daemon drives the run and applies it, and the stream
            # follows the run live.
            answer = two.post(
                f"/v1/gates/{gate['gate_id']}",
                json={"decision": "approve", "by": "alice"},
            )
            assert answer.status_code == 202, answer.text
        events = follower.ended()
    seqs = [seq for seq, _ in events]
    assert seqs == list(range(1, len(seqs) + 1))
    assert events[-1][1] == "run_finished"
    assert [kind for _, kind in events].count("gate_resolved") == 1


def test_every_daemon_lists_every_open_gate_naming_the_daemon_that_drives_it(
    tmp_path: Path, postgres_dsn: str
) -> None:
    with daemons(tmp_path, postgres_dsn, "first", "second") as (first, second):
        run_id, gate = _gated_run(first)
        _, own_gate = _gated_run(second)
        with first.client() as one, second.client() as two:
            listed = two.get("/v1/gates").json()
            one_run = two.get("/v1/gates", params={"run_id": run_id}).json()
            at_first = one.get("/v1/gates").json()
    assert [g["gate_id"] for g in listed["gates"]] == [
        gate["gate_id"],
        own_gate["gate_id"],
    ]
    assert list(listed["elsewhere"]) == [gate["gate_id"]]
    assert listed["elsewhere"][gate["gate_id"]].endswith(f":{first.pid}")
    assert [g["gate_id"] for g in one_run["gates"]] == [gate["gate_id"]]
    assert [g["gate_id"] for g in at_first["gates"]] == [
        gate["gate_id"],
        own_gate["gate_id"],
    ]
    assert list(at_first["elsewhere"]) == [own_gate["gate_id"]]
    assert at_first["elsewhere"][own_gate["gate_id"]].endswith(f":{second.pid}")


def test_an_answer_to_a_gate_of_a_run_nobody_drives_waits_for_a_daemon_to_take_it(
    tmp_path: Path, postgres_dsn: str
) -> None:
    first = DaemonProcess(
        tmp_path / "first", *COUNTING, env=_env(tmp_path, postgres_dsn)
    ).start()
    # One that never looks for runs to drive on: the run stays nobody's.
    env = {**_env(tmp_path, postgres_dsn), "REPLAN_REDRIVE_INTERVAL_S": "off"}
    second = DaemonProcess(tmp_path / "second", *COUNTING, env=env).start()
    try:
        run_id, gate = _gated_run(first)
        first.kill()
        with second.client() as two:
            # Once its lease expired: no daemon drives the run.
            wait_for(lambda: two.get("/v1/gates").json()["elsewhere"] == {})
            answer = two.post(
                f"/v1/gates/{gate['gate_id']}",
                json={"decision": "approve", "by": "alice"},
            )
            cancel = two.post(f"/v1/runs/{run_id}/cancel")
            listed = two.get("/v1/gates").json()
            status = two.get(f"/v1/runs/{run_id}").json()["status"]
    finally:
        first.close()
        second.close()
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert (body["state"], body["driven_by"]) == ("forwarded", None)
    assert "driven by no daemon at the moment" in body["detail"]
    assert "the daemon that takes it over applies it" in body["detail"]
    assert cancel.status_code == 202, cancel.text
    assert cancel.json()["state"] == "forwarded"
    assert cancel.json()["status"] == "waiting_for_human"
    # Both wait in the journal; the run is as it was.
    assert [g["gate_id"] for g in listed["gates"]] == [gate["gate_id"]]
    assert status == "waiting_for_human"
    assert _requests(postgres_dsn) == [(gate["gate_id"], None), (None, None)]


def test_an_answer_and_a_cancel_at_a_daemon_that_does_not_drive_the_run_apply_once(
    tmp_path: Path, postgres_dsn: str
) -> None:
    with daemons(tmp_path, postgres_dsn, "first", "second") as (first, second):
        run_id, gate = _gated_run(first)
        other, _ = _gated_run(first)
        with second.client() as two:
            answer = two.post(
                f"/v1/gates/{gate['gate_id']}",
                json={"decision": "approve", "by": "alice"},
            )
            again = two.post(
                f"/v1/gates/{gate['gate_id']}",
                json={"decision": "reject", "by": "bob"},
            )
            cancel = two.post(f"/v1/runs/{other}/cancel")
        with first.client() as one:
            wait_for(
                lambda: one.get(f"/v1/runs/{run_id}").json()["status"] == "completed"
            )
            events = one.get(f"/v1/runs/{run_id}/events").text
            cancelled = one.get(f"/v1/runs/{other}").json()
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["state"] == "applied"
    assert body["driven_by"].endswith(f":{first.pid}")
    assert (body["gate_id"], body["run_id"], body["decision"]) == (
        gate["gate_id"],
        run_id,
        "approve",
    )
    assert body["detail"].startswith(f"gate {gate['gate_id']}: approve by alice ")
    assert again.status_code == 409, again.text
    assert again.json()["detail"] == (
        f"gate {gate['gate_id']} is already resolved (approve by alice)"
    )
    assert cancel.status_code == 202, cancel.text
    assert (cancel.json()["state"], cancel.json()["status"]) == (
        "applied",
        "cancelled",
    )
    assert cancelled["status"] == "cancelled"
    assert events.count("event: gate_resolved") == 1
    assert _requests(postgres_dsn) == [
        (gate["gate_id"], "applied"),
        (None, "applied"),
    ]


def test_a_pending_answer_of_a_driver_killed_is_applied_by_the_daemon_taking_over(
    tmp_path: Path, postgres_dsn: str
) -> None:
    # A lease that outlasts the answer's wait (FORWARD_WAIT_S): the stopped
    # daemon still holds the run when the answer returns.
    lease_s = 6
    with daemons(tmp_path, postgres_dsn, "first", "second", lease_s=lease_s) as (
        first,
        second,
    ):
        run_id, gate = _gated_run(first)
        # Stopped (as good as dead) with its lease still held: the answer
        # waits for it, then for the daemon that takes the run over.
        os.kill(first.pid, signal.SIGSTOP)
        with second.client() as two:
            answer = two.post(
                f"/v1/gates/{gate['gate_id']}",
                json={"decision": "approve", "by": "alice"},
            )
            first.kill()
            wait_for(
                lambda: two.get(f"/v1/runs/{run_id}").json()["status"] == "completed",
                timeout_s=30,
            )
            events = two.get(f"/v1/runs/{run_id}/events").text
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["state"] == "forwarded"
    assert body["driven_by"].endswith(f":{first.pid}")
    assert "applies it at its next look" in body["detail"]
    assert events.count("event: gate_resolved") == 1
    assert _requests(postgres_dsn) == [(gate["gate_id"], "applied")]


def test_the_cli_says_where_an_answer_and_a_cancel_went(
    tmp_path: Path, postgres_dsn: str
) -> None:
    with daemons(tmp_path, postgres_dsn, "first", "second") as (first, second):
        run_id, gate = _gated_run(first)
        env = {**os.environ, "REPLAN_API_TOKEN": TOKEN, "REPLAN_URL": second.url}
        approve = subprocess.run(
            [sys.executable, "-m", "replan", "approve", gate["gate_id"], "--by", "al"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        other, _ = _gated_run(first)
        cancel = subprocess.run(
            [sys.executable, "-m", "replan", "cancel", other],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    assert approve.returncode == 0, approve.stderr
    assert approve.stdout.startswith(
        f"gate {gate['gate_id']}: approve by al was applied by daemon "
    )
    assert approve.stdout.rstrip().endswith(f":{first.pid}, which drives run {run_id}")
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.startswith(f"run {other}: the cancel was applied by daemon ")


def _requests(dsn: str) -> list[tuple[Any, ...]]:
    """The journal's requests, oldest first: the gate each answers, and
    what became of it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT gate_id, outcome FROM replan.requests ORDER BY id"
        ).fetchall()


def test_a_stream_at_a_daemon_that_lost_the_run_follows_it_in_the_journal(
    tmp_path: Path, postgres_dsn: str
) -> None:
    with daemons(tmp_path, postgres_dsn, "first", "second") as (first, second):
        run_id, gate = _gated_run(first)
        follower = Follower(first, run_id)
        wait_for(lambda: any(kind == "gate_opened" for _, kind in follower.events))
        # Stalled past its lease, the first loses the run to the second.
        os.kill(first.pid, signal.SIGSTOP)
        try:
            with second.client() as two:

                def taken_over() -> bool:
                    # The gate is open in the second's own registry.
                    metrics = two.get("/metrics").text.splitlines()
                    return "replan_gates_pending 1" in metrics

                wait_for(taken_over, every_s=0.2)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        with second.client() as two:
            wait_for(
                lambda: (
                    two.post(
                        f"/v1/gates/{gate['gate_id']}",
                        json={"decision": "approve", "by": "alice"},
                    ).status_code
                    == 200
                ),
                every_s=0.2,
            )
        events = follower.ended()
        with first.client() as one:
            status = one.get(f"/v1/runs/{run_id}").json()["status"]
    seqs = [seq for seq, _ in events]
    assert seqs == list(range(1, len(seqs) + 1))
    assert events[-1][1] == "run_finished"
    assert status == "completed"


def test_a_run_lost_to_another_daemon_no_longer_counts_as_active_here(
    tmp_path: Path, postgres_dsn: str
) -> None:
    env = _env(tmp_path, postgres_dsn)
    first = DaemonProcess(
        tmp_path / "first", *COUNTING, "--max-active-runs", "1", env=env
    ).start()
    second = DaemonProcess(tmp_path / "second", *COUNTING, env=env).start()
    try:
        _gated_run(first)
        # Stalled past its lease, the first loses the run to the second.
        os.kill(first.pid, signal.SIGSTOP)
        try:
            with second.client() as two:
                wait_for(
                    lambda: "replan_gates_pending 1" in two.get("/metrics").text,
                    every_s=0.2,
                )
        finally:
            os.kill(first.pid, signal.SIGCONT)
        wait_for(lambda: "this supervisor no longer drives it" in first.output())
        with first.client() as one:
            metrics = one.get("/metrics").text.splitlines()
            submitted = one.post(
                "/v1/runs", json={"goal": GOAL, "gate_policy": {"gate_on": []}}
            )
    finally:
        first.close()
        second.close()
    assert submitted.status_code == 202, submitted.text
    assert 'replan_runs{status="waiting_for_human"} 0' in metrics


def test_a_cancel_applied_by_a_daemon_that_cannot_be_named_says_so() -> None:
    # The run was taken over and ended before the sender saw who drove it.
    from replan.daemon._forwarded import cancel_forwarded
    from replan.daemon._schemas import Cancelled
    from replan.messages import RunStatus
    from replan.supervisor import Forwarded

    sent = Forwarded(request_id=1, run_id="r1", applied=True, driven_by=None)
    ended = Cancelled(run_id="r1", status=RunStatus.CANCELLED, stop_reason="x")
    body = cancel_forwarded(sent, ended, applied=True)
    assert body.detail == (
        "run r1: the cancel was applied by the daemon that took run r1 over"
    )
    assert "None" not in body.detail


def test_a_stream_followed_in_the_journal_keeps_beating_while_the_server_restarts(
    tmp_path: Path, own_server: PostgresServer
) -> None:
    # The stream's read waited for the server (up to reconnect_s, 30 s)
    # and sent nothing meanwhile: a proxy with an idle timeout cut it.
    dsn = own_server.dsn(own_server.new_database())
    with daemons(tmp_path, dsn, "first", "second", lease_s=60) as (first, second):
        run_id, gate = _gated_run(first)
        arrived: list[tuple[float, Any]] = []

        def follow() -> None:
            with (
                second.client() as two,
                two.stream("GET", f"/v1/runs/{run_id}/events", timeout=60) as response,
            ):
                for f in sse_frames(response):
                    arrived.append((time.monotonic(), f))
                    if f[0] == "event" and f[2] == "run_finished":
                        return

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        wait_for(lambda: any(f[0] == "comment" for _, f in arrived))
        halted = time.monotonic()
        postgres.halt(own_server)
        try:
            time.sleep(6)
        finally:
            postgres.start_again(own_server)
        back = time.monotonic()
        with first.client() as one:
            answered = one.post(
                f"/v1/gates/{gate['gate_id']}",
                json={"decision": "approve", "by": "alice"},
            )
            assert answered.status_code == 200, answered.text
        follower.join(60)
        assert not follower.is_alive(), "the stream did not end"
    during = [at for at, _ in arrived if halted <= at <= back]
    beats = [halted, *during, back]
    assert max(b - a for a, b in itertools.pairwise(beats)) < 3, beats
    kinds = [f[2] for _, f in arrived if f[0] == "event"]
    assert kinds[-1] == "run_finished"
    seqs = [f[1] for _, f in arrived if f[0] == "event"]
    assert seqs == list(range(1, len(seqs) + 1))
