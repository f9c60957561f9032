"""Durability of the real daemon: kill -9, SIGTERM, SSE resume, retention."""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest
from counting_model import read_counts
from daemon_process import DaemonProcess, wait_for

from replan import ConfigurationError
from replan._demo import GOAL
from replan.daemon import DaemonSettings, load_settings
from replan.daemon._token import resolve_token

COUNTING = ("--model", "python:counting_model:model")
UNFINISHED = ("running", "waiting_for_human")


def submit(client: httpx.Client, **spec: Any) -> str:
    response = client.post("/v1/runs", json={"goal": GOAL, **spec})
    assert response.status_code == 202, response.text
    run_id: str = response.json()["run_id"]
    return run_id


def view(client: httpx.Client, run_id: str) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"/v1/runs/{run_id}").json()
    return body


def all_finished(client: httpx.Client, run_ids: list[str]) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        views = [view(client, r) for r in run_ids]
        return None if any(v["status"] in UNFINISHED for v in views) else views

    result: list[dict[str, Any]] = wait_for(check, timeout_s=30)
    return result


def sse_frames(response: httpx.Response, stop_after: int | None = None) -> Any:
    """Parse an event stream: yields ("event", id, kind, data) and ("comment",)."""
    seen = 0
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            yield ("comment",)
            continue
        if line == "":
            if fields:
                yield ("event", int(fields["id"]), fields["event"], fields["data"])
                fields = {}
                seen += 1
                if stop_after is not None and seen >= stop_after:
                    return
            continue
        name, _, value = line.partition(": ")
        fields[name] = value


def journal_kinds(data_dir: Path, run_id: str) -> list[str]:
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(data_dir / "journal.db")) as conn:
        rows = conn.execute(
            "SELECT type FROM events WHERE run_id = ? ORDER BY seq", (run_id,)
        ).fetchall()
    return [kind for (kind,) in rows]


def test_kill_9_mid_task_and_at_an_open_gate_loses_nothing_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    counts = str(tmp_path / "executions.txt")
    env = {"REPLAN_TEST_COUNT_FILE": counts, "REPLAN_TEST_EXECUTE_S": "0.6"}
    data = tmp_path / "data"
    first = DaemonProcess(data, *COUNTING, env=env).start()
    try:
        with first.client() as client:
            gated = [submit(client) for _ in range(2)]
            free = [submit(client, gate_policy={"gate_on": []}) for _ in range(2)]

            def mid_task_with_a_gate_open() -> bool:
                # Every attempt in flight is well inside its 0.6 s of work, so
                # none can be between returning and reaching the ledger.
                _, open_starts = read_counts(counts)
                now = time.monotonic()
                ages = [now - started for started in open_starts.values()]
                if not ages or not all(0.1 < age < 0.35 for age in ages):
                    return False
                return bool(client.get("/v1/gates").json()["gates"])

            wait_for(mid_task_with_a_gate_open, every_s=0.01)
            gates_before = {
                g["gate_id"] for g in client.get("/v1/gates").json()["gates"]
            }
        first.kill()
    finally:
        first.close()
    _, cut_short = read_counts(counts)
    assert cut_short, "the kill should land while tasks run"
    assert len(gates_before) >= 1

    second = DaemonProcess(data, *COUNTING, env=env).start()
    try:
        with second.client() as client:
            pending = wait_for(lambda: client.get("/v1/gates").json()["gates"])
            assert gates_before <= {g["gate_id"] for g in pending}
            answered: set[str] = set()
            while len(answered) < len(gated):
                for gate in client.get("/v1/gates").json()["gates"]:
                    response = client.post(
                        f"/v1/gates/{gate['gate_id']}", json={"decision": "approve"}
                    )
                    assert response.status_code == 200, response.text
                    answered.add(gate["gate_id"])
                time.sleep(0.05)
            views = all_finished(client, gated + free)
    finally:
        assert second.terminate() == 0
    assert [v["status"] for v in views] == ["completed"] * 4
    done, _ = read_counts(counts)
    completed = {
        f"{v['run_id']}:{t['id']}"
        for v in views
        for t in v["result"]["tasks"]
        if t["status"] == "completed"
    }
    assert set(done) == completed
    assert all(n == 1 for n in done.values()), {k: n for k, n in done.items() if n > 1}
    assert len(completed) == 4 * 5
    interrupted = [
        r for r in gated + free if "task_interrupted" in journal_kinds(data, r)
    ]
    assert interrupted, "some attempt was cut short and run again"
    for v in views:
        if v["run_id"] in gated:
            assert v["result"]["replans"][0]["outcome"] == "applied"


def test_sigterm_drains_in_flight_work_and_exits_0(tmp_path: Path) -> None:
    counts = str(tmp_path / "executions.txt")
    env = {"REPLAN_TEST_COUNT_FILE": counts, "REPLAN_TEST_EXECUTE_S": "0.5"}
    data = tmp_path / "data"
    first = DaemonProcess(data, *COUNTING, env=env).start()
    try:
        with first.client() as client:
            run_ids = [submit(client, gate_policy={"gate_on": []}) for _ in range(3)]
            wait_for(lambda: read_counts(counts)[1], every_s=0.01)
        started = time.monotonic()
        assert first.terminate() == 0
        took = time.monotonic() - started
    finally:
        first.close()
    done, cut_short = read_counts(counts)
    assert cut_short == {}, "the drain lets attempts in flight finish"
    assert done
    assert took < 8
    assert "Traceback" not in first.output()

    second = DaemonProcess(data, *COUNTING, env=env).start()
    try:
        with second.client() as client:
            views = all_finished(client, run_ids)
    finally:
        assert second.terminate() == 0
    assert [v["status"] for v in views] == ["completed"] * 3
    done, _ = read_counts(counts)
    assert all(n == 1 for n in done.values())
    assert len(done) == 3 * 5
    for run_id in run_ids:
        assert "task_interrupted" not in journal_kinds(data, run_id)


def test_an_event_stream_resumes_after_a_dropped_connection(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "data", env={"REPLAN_HEARTBEAT_S": "0.2"})
    daemon.start()
    try:
        with daemon.client() as client:
            run_id = submit(client)
            url = f"/v1/runs/{run_id}/events"
            with client.stream("GET", url) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                head = [
                    f for f in sse_frames(response, stop_after=3) if f[0] == "event"
                ]
            # Dropped after three events; the run goes on to its gate.
            (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
            last_id = head[-1][1]
            with client.stream(
                "GET", url, headers={"Last-Event-ID": str(last_id)}
            ) as response:
                tail: list[Any] = []
                comments = 0
                for item in sse_frames(response):
                    if item[0] == "comment":
                        comments += 1
                        if comments == 2:
                            client.post(
                                f"/v1/gates/{gate['gate_id']}",
                                json={"decision": "approve"},
                            )
                        continue
                    tail.append(item)
            replayed = client.get(url, params={"after": 0}).text
    finally:
        daemon.close()
    ids = [f[1] for f in head + tail]
    assert ids == list(range(1, len(ids) + 1)), "no gap, no duplicate"
    assert tail[-1][2] == "run_finished"
    assert comments >= 2, "heartbeats keep the idle stream alive"
    assert json.loads(tail[-1][3])["status"] == "completed"
    assert replayed.count("event: ") == len(ids)


def test_retention_compacts_finished_runs_that_stay_readable(tmp_path: Path) -> None:
    daemon = DaemonProcess(
        tmp_path / "data",
        "--retention",
        "compact",
        "--retention-age",
        "0",
        "--retention-interval",
        "0.2",
    ).start()
    try:
        with daemon.client() as client:
            run_id = submit(client, gate_policy={"gate_on": []})

            def compacted() -> str | None:
                text = client.get(f"/v1/runs/{run_id}/events").text
                return text if "event: run_compacted" in text else None

            wait_for(compacted)
            # A stream opened before the compaction shows the history it
            # began with, then the compaction: read the run afresh.
            stream = client.get(f"/v1/runs/{run_id}/events").text
            after = view(client, run_id)
            versions = client.get(f"/v1/runs/{run_id}/versions").json()["versions"]
            metrics = client.get("/metrics").text
    finally:
        daemon.close()
    assert stream.count("event: ") == 1
    assert after["status"] == "completed"
    assert len([t for t in after["result"]["tasks"] if t["status"] == "completed"]) == 5
    assert [v["version"] for v in versions] == [1, 2]
    assert 'replan_retention_runs_total{action="compact"} 1' in metrics.splitlines()
    assert journal_kinds(tmp_path / "data", run_id) == ["run_compacted"]


def test_retention_can_delete_finished_runs_instead(tmp_path: Path) -> None:
    daemon = DaemonProcess(
        tmp_path / "data",
        "--retention",
        "delete",
        "--retention-age",
        "0",
        "--retention-interval",
        "0.2",
    ).start()
    try:
        with daemon.client() as client:
            run_id = submit(client, gate_policy={"gate_on": []})
            wait_for(lambda: client.get(f"/v1/runs/{run_id}").status_code == 404)
            waiting = submit(client)
            wait_for(lambda: client.get("/v1/gates").json()["gates"])
            time.sleep(0.5)
            assert view(client, waiting)["status"] == "waiting_for_human"
    finally:
        daemon.close()
    assert journal_kinds(tmp_path / "data", run_id) == []


def test_retention_off_keeps_every_finished_run_whole(tmp_path: Path) -> None:
    daemon = DaemonProcess(
        tmp_path / "data",
        "--retention",
        "off",
        "--retention-age",
        "0",
        "--retention-interval",
        "0.1",
    ).start()
    try:
        with daemon.client() as client:
            run_id = submit(client, gate_policy={"gate_on": []})
            assert all_finished(client, [run_id])[0]["status"] == "completed"
            time.sleep(1)  # ten intervals, each of which would take it
            metrics = client.get("/metrics").text.splitlines()
    finally:
        daemon.close()
    kinds = journal_kinds(tmp_path / "data", run_id)
    assert kinds[0] == "run_submitted"
    assert kinds[-1] == "run_finished"
    assert "run_compacted" not in kinds
    assert 'replan_retention_runs_total{action="compact"} 0' in metrics


def test_a_non_loopback_address_is_refused_without_a_token(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "data", "--host", "0.0.0.0", token=None)
    try:
        with pytest.raises(RuntimeError, match="exited early") as raised:
            daemon.start(timeout_s=10)
    finally:
        daemon.close()
    assert "replan: error: api_token" in str(raised.value)
    assert "REPLAN_API_TOKEN" in str(raised.value)
    assert not (tmp_path / "data" / "api-token").exists()


@pytest.mark.parametrize(
    "token", ["tökén-abcdefghijklmnop", "two words abcdefghijklmnop"]
)
def test_a_token_an_http_header_cannot_carry_is_refused_at_start(
    tmp_path: Path, token: str
) -> None:
    # Accepted, it matched no header a client could send (the server reads
    # headers as Latin-1, clients send UTF-8).
    with pytest.raises(ConfigurationError, match="printable ASCII") as configured:
        resolve_token(DaemonSettings(data_dir=tmp_path, api_token=token))
    assert configured.value.field == "api_token"
    (tmp_path / "api-token").write_text(token + "\n")
    with pytest.raises(ConfigurationError, match="printable ASCII") as kept:
        resolve_token(DaemonSettings(data_dir=tmp_path))
    assert kept.value.field == "data_dir"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("abc\n", "at least 16 characters"),
        ("\n", "it is empty"),
        (b"\xff\xfe-abcdefghijklmnop", "printable ASCII"),
    ],
)
def test_a_token_file_is_held_to_the_rule_of_a_configured_token(
    tmp_path: Path, content: str | bytes, problem: str
) -> None:
    token_file = tmp_path / "api-token"
    if isinstance(content, bytes):
        token_file.write_bytes(content)
    else:
        token_file.write_text(content)
    with pytest.raises(ConfigurationError, match=problem) as kept:
        resolve_token(DaemonSettings(data_dir=tmp_path))
    assert kept.value.field == "data_dir"
    assert "delete it for a new token" in str(kept.value)


@pytest.mark.parametrize(("mode", "warned"), [(0o644, True), (0o600, False)])
def test_a_token_file_others_may_read_is_warned_of(
    tmp_path: Path, mode: int, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    token_file = tmp_path / "api-token"
    token_file.write_text("a-token-of-sixteen-or-more\n")
    token_file.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="replan.daemon"):
        token = resolve_token(DaemonSettings(data_dir=tmp_path))
    assert token.value == "a-token-of-sixteen-or-more"
    messages = [r.getMessage() for r in caplog.records]
    if warned:
        assert messages == [
            f"{token_file} can be read by other users (mode 0644), and whoever "
            f"reads it may use the API: chmod 600 {token_file}"
        ]
    else:
        assert messages == []


@pytest.mark.parametrize("cut", ["token_urlsafe", "fsync"])
def test_a_start_cut_short_as_it_writes_the_token_leaves_no_empty_token_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: str
) -> None:
    # A signal or kill -9 between making the file and writing it left an
    # empty token file, and every later start was refused ("it is empty").
    def stopped(*args: object) -> NoReturn:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(secrets if cut == "token_urlsafe" else os, cut, stopped)
        with pytest.raises(KeyboardInterrupt):
            resolve_token(DaemonSettings(data_dir=tmp_path))
    assert list(tmp_path.iterdir()) == []
    token = resolve_token(DaemonSettings(data_dir=tmp_path))
    assert token.generated_into == tmp_path / "api-token"
    assert (tmp_path / "api-token").read_text() == token.value + "\n"
    assert (tmp_path / "api-token").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["api-token"]


def test_a_generated_token_is_kept_private_and_printed_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = DaemonProcess(data, token=None).start()
    try:
        token_file = data / "api-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        with first.client(token=token) as client:
            assert client.get("/v1/runs").status_code == 200
        assert first.terminate() == 0
    finally:
        first.close()
    assert first.output().count(token) == 1
    second = DaemonProcess(data, token=None).start()
    try:
        with second.client(token=token) as client:
            assert client.get("/v1/runs").status_code == 200
        assert second.terminate() == 0
    finally:
        second.close()
    assert second.output().count(token) == 1, "not printed again"


def test_an_explore_run_resumes_at_its_review_gate_after_sigterm(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    demo = ("--model", "scripted:demo")

    def gates(client: httpx.Client, run_id: str) -> list[str]:
        listed = client.get("/v1/gates", params={"run_id": run_id}).json()["gates"]
        return [g["gate_id"] for g in listed]

    first = DaemonProcess(data, *demo).start()
    try:
        with first.client() as client:
            run_id = submit(client, kind="explore")
            [gate_id] = wait_for(lambda: gates(client, run_id))
            before = view(client, run_id)
        assert first.terminate() == 0
    finally:
        first.close()
    assert before["status"] == "waiting_for_human"

    second = DaemonProcess(data, *demo).start()
    try:
        with second.client() as client:
            # The same gate, listed once, and no model call made again.
            assert gates(client, run_id) == [gate_id]
            resumed = view(client, run_id)
            assert resumed["status"] == "waiting_for_human"
            assert resumed["total_usage"] == before["total_usage"]
            response = client.post(
                f"/v1/gates/{gate_id}", json={"decision": "approve", "by": "ana"}
            )
            assert response.status_code == 200, response.text
            [done] = all_finished(client, [run_id])
    finally:
        assert second.terminate() == 0
    assert done["status"] == "completed"
    assert done["result"]["brief"]["reviewed_by"] == "ana"
    # Only the validation plan was asked for after the restart.
    calls = before["total_usage"]["calls"]
    assert done["total_usage"]["calls"] == calls + 1
    assert journal_kinds(data, run_id).count("gate_opened") == 1


def test_kill_9_after_a_side_effect_ran_does_not_run_it_again(tmp_path: Path) -> None:
    outbox = tmp_path / "outbox"
    data = tmp_path / "data"
    tools = ("--model", "python:mail_tools:model", "--tool", "mail_tools:send_email")
    env = {"REPLAN_TEST_OUTBOX": str(outbox)}
    first = DaemonProcess(data, *tools, env={**env, "REPLAN_TEST_HOLD_S": "60"})
    first.start()
    try:
        with first.client() as client:
            run_id = submit(client, gate_policy={"gate_on": []})
            (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
            answer = client.post(
                f"/v1/gates/{gate['gate_id']}", json={"decision": "approve"}
            )
            assert answer.status_code == 200, answer.text
            wait_for(lambda: outbox.exists() and outbox.read_text())
            # The email went; the task holds before it answers: kill there.
            wait_for(lambda: view(client, run_id)["side_effects"][0]["content"])
        first.kill()
    finally:
        first.close()

    second = DaemonProcess(data, *tools, env=env).start()
    try:
        with second.client() as client:
            (done,) = all_finished(client, [run_id])
            gates = client.get("/v1/gates").json()["gates"]
    finally:
        second.close()
    assert done["status"] == "completed"
    assert outbox.read_text() == f"ana {run_id}:t1:s1c0\n"  # once, before the kill
    assert gates == []
    kinds = journal_kinds(data, run_id)
    assert kinds.count("gate_opened") == 1  # not asked again after the restart
    assert "task_interrupted" in kinds
    assert done["side_effects"][0]["content"] == "sent to ana"


def test_a_drain_does_not_wait_for_a_tool_call_waiting_for_a_person(
    tmp_path: Path,
) -> None:
    outbox = tmp_path / "outbox"
    data = tmp_path / "data"
    tools = ("--model", "python:mail_tools:model", "--tool", "mail_tools:send_email")
    env = {"REPLAN_TEST_OUTBOX": str(outbox)}
    first = DaemonProcess(data, *tools, "--drain-grace", "60", env=env).start()
    try:
        with first.client() as client:
            run_id = submit(client, gate_policy={"gate_on": []})
            (asked,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
        started = time.monotonic()
        # The gate is journaled: nothing is lost by stopping now, and the
        # person may answer tomorrow.
        assert first.terminate() == 0
        assert time.monotonic() - started < 15
    finally:
        first.close()
    assert "gate_opened" in journal_kinds(data, run_id)
    assert not outbox.exists()

    second = DaemonProcess(data, *tools, env=env).start()
    try:
        with second.client() as client:
            # The attempt that asked was cut short: the one run again asks again.
            (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
            assert gate["gate_id"] != asked["gate_id"]
            assert gate["tool_call"]["name"] == "send_email"
            approval = {"decision": "approve", "by": "ana"}
            answer = client.post(f"/v1/gates/{gate['gate_id']}", json=approval)
            assert answer.status_code == 200, answer.text
            (done,) = all_finished(client, [run_id])
    finally:
        assert second.terminate() == 0
    assert done["status"] == "completed"
    assert outbox.read_text() == f"ana {run_id}:t1:s1c0\n"  # once


def test_an_empty_token_variable_is_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As compose files and CI jobs leave it: the loopback daemon generates
    # its token, and any other address is refused as without one.
    monkeypatch.setenv("REPLAN_API_TOKEN", "")
    token = resolve_token(load_settings(data_dir=str(tmp_path)))
    assert token.generated_into == tmp_path / "api-token"
    with pytest.raises(ConfigurationError, match="without REPLAN_API_TOKEN set"):
        resolve_token(load_settings(data_dir=str(tmp_path), host="0.0.0.0"))


@pytest.mark.parametrize("token", [" ", " " * 20, "short"])
def test_a_blank_or_short_token_variable_is_still_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    monkeypatch.setenv("REPLAN_API_TOKEN", token)
    with pytest.raises(ConfigurationError) as refused:
        resolve_token(load_settings(data_dir=str(tmp_path)))
    assert refused.value.field == "api_token"
    assert not (tmp_path / "api-token").exists()
